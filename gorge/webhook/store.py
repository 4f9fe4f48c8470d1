"""The herald tables: candidates, claim, outcome writes, hook lookups, counts.

Every statement stands alone (one short ``runInteraction``, spec §2.1).
Every time value compared with or stored into ``dateModified`` /
``lastRequestEpoch`` is the database's clock (§3.8), so several instances
agree on every window.

The SQL is written once, in MySQL's spelling; :class:`Dialect` is the one
place that adapts it to another engine (SQLite for the demo).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from twisted.enterprise import adbapi
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from gorge import mysql as platform_mysql
from gorge.config import MySQLSettings

QUEUED, SENT, FAILED = "queued", "sent", "failed"
RESULT_NONE, RESULT_OKAY, RESULT_FAIL = "none", "okay", "fail"

STATEMENT_TIMEOUT = 35.0  # above pymysql's 30 s read/write timeouts

SQL_NOW = "SELECT UNIX_TIMESTAMP()"

# Spec §3.2: the two time conditions stay separate; status = … ORDER BY id
# lets key_status(status, id) serve both the filter and the order.
SQL_CANDIDATES = (
    "SELECT id, phid, webhookPHID, objectPHID, status, properties,"
    " lastRequestResult, lastRequestEpoch, dateCreated, dateModified"
    " FROM herald_webhookrequest"
    " WHERE status = 'queued'"
    " AND (dateModified = dateCreated OR dateModified <= %s)"
    " AND (lastRequestResult <> 'fail' OR lastRequestEpoch <= %s)"
    "{exclude}"
    " ORDER BY id ASC"
    " LIMIT %s"
)
SQL_EXCLUDE_HOOKS = " AND webhookPHID NOT IN ({marks})"

# Spec §3.4: "+ 1" makes a same-second claim still change the version.
SQL_CLAIM = (
    "UPDATE herald_webhookrequest"
    " SET dateModified = GREATEST(dateModified + 1, UNIX_TIMESTAMP())"
    " WHERE id = %s AND status = 'queued' AND dateModified = %s"
)

# Spec §5.2: a delivery result follows a won claim.
SQL_FINISH = (
    "UPDATE herald_webhookrequest"
    " SET status = %s, lastRequestResult = %s, lastRequestEpoch = UNIX_TIMESTAMP(),"
    " properties = %s, dateModified = GREATEST(dateModified + 1, UNIX_TIMESTAMP())"
    " WHERE id = %s AND status = 'queued'"
)

# Configuration failures are written without a claim, so only over the version we read.
SQL_RETIRE = (
    "UPDATE herald_webhookrequest"
    " SET status = 'failed', lastRequestResult = 'none', lastRequestEpoch = 0,"
    " properties = %s, dateModified = GREATEST(dateModified + 1, UNIX_TIMESTAMP())"
    " WHERE id = %s AND status = 'queued' AND dateModified = %s"
)

SQL_HOOKS = "SELECT id, phid, name, webhookURI, status, hmacKey FROM herald_webhook WHERE phid IN ({marks})"

# Spec §3.7: every row of the hook counts, whatever its status.
SQL_BREAKER_COUNT = (
    "SELECT COUNT(*) FROM herald_webhookrequest"
    " WHERE webhookPHID = %s AND lastRequestResult = 'fail'"
    " AND lastRequestEpoch >= UNIX_TIMESTAMP() - %s"
)

SQL_QUEUED_FOR_HOOK = (
    "SELECT COUNT(*) FROM herald_webhookrequest WHERE webhookPHID = %s AND status = 'queued'"
)

SQL_STATS = (
    "SELECT"
    " (SELECT COUNT(*) FROM herald_webhookrequest WHERE status = 'queued'),"
    " (SELECT COUNT(*) FROM herald_webhookrequest WHERE status = 'sent'),"
    " (SELECT COUNT(*) FROM herald_webhookrequest WHERE status = 'failed'),"
    " (SELECT COUNT(*) FROM herald_webhook WHERE status <> 'disabled')"
)

SQL_HOOK_TOTAL = "SELECT COUNT(*) FROM herald_webhook"


def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return "" if value is None else str(value)


@dataclass(frozen=True)
class Candidate:
    id: int
    phid: str
    hook_phid: str
    object_phid: str
    properties: str
    last_result: str
    last_epoch: int
    date_created: int
    version: int  # dateModified as read: the claim's compare-and-set value

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> "Candidate":
        return cls(
            id=int(row[0]), phid=_text(row[1]), hook_phid=_text(row[2]),
            object_phid=_text(row[3]), properties=_text(row[5]), last_result=_text(row[6]),
            last_epoch=int(row[7]), date_created=int(row[8]), version=int(row[9]),
        )


@dataclass(frozen=True)
class Hook:
    id: int
    phid: str
    name: str
    uri: str = field(repr=False)
    status: str
    hmac_key: str = field(repr=False)

    @property
    def disabled(self) -> bool:
        return self.status == "disabled"


@dataclass(frozen=True)
class Stats:
    queued: int
    sent: int
    failed: int
    active_hooks: int


class Dialect:
    """What differs between engines: placeholders, connection set-up, the clock."""

    name = "mysql"

    def sql(self, statement: str) -> str:
        return statement

    def pin_clock(self, txn, seconds: int | None) -> None:
        # Tests inject a clock: the session timestamp makes UNIX_TIMESTAMP() follow it.
        if seconds is not None:
            txn.execute("SET timestamp = %s", (seconds,))


class SQLiteDialect(Dialect):
    """SQLite speaks ``?`` and lacks UNIX_TIMESTAMP()/GREATEST(): both are registered."""

    name = "sqlite"

    def __init__(self, now: Callable[[], int]) -> None:
        self._now = now

    def sql(self, statement: str) -> str:
        return statement.replace("%s", "?")

    def pin_clock(self, txn, seconds: int | None) -> None:
        pass  # UNIX_TIMESTAMP() below already reads the injected clock

    def open_connection(self, connection: sqlite3.Connection) -> None:
        connection.create_function("UNIX_TIMESTAMP", 0, self._now)
        connection.create_function("GREATEST", -1, max)


SQLITE_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS herald_webhook (
        id INTEGER PRIMARY KEY AUTOINCREMENT, phid BLOB NOT NULL UNIQUE,
        name TEXT NOT NULL, webhookURI TEXT NOT NULL, viewPolicy BLOB NOT NULL,
        editPolicy BLOB NOT NULL, status TEXT NOT NULL, hmacKey TEXT NOT NULL,
        dateCreated INTEGER NOT NULL, dateModified INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS key_status ON herald_webhook (status)",
    """CREATE TABLE IF NOT EXISTS herald_webhookrequest (
        id INTEGER PRIMARY KEY AUTOINCREMENT, phid BLOB NOT NULL UNIQUE,
        webhookPHID BLOB NOT NULL, objectPHID BLOB NOT NULL, status TEXT NOT NULL,
        properties TEXT NOT NULL, lastRequestResult TEXT NOT NULL,
        lastRequestEpoch INTEGER NOT NULL, dateCreated INTEGER NOT NULL,
        dateModified INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS key_ratelimit ON herald_webhookrequest"
    " (webhookPHID, lastRequestResult, lastRequestEpoch)",
    "CREATE INDEX IF NOT EXISTS key_collect ON herald_webhookrequest (dateCreated)",
    "CREATE INDEX IF NOT EXISTS key_status ON herald_webhookrequest (status, id)",
)


class _AutocommitConnection(adbapi.Connection):
    """adbapi commits after every interaction; in autocommit mode that is a wasted round trip."""

    def commit(self) -> None:
        pass


class WebhookStore:
    """The herald tables behind one adbapi pool.

    ``reactor`` bounds every statement; ``db_clock`` (tests only) pins the
    database clock to an injected clock.
    """

    def __init__(self, pool: adbapi.ConnectionPool, reactor: IReactorTime, *,
                 dialect: Dialect | None = None, db_clock: IReactorTime | None = None,
                 timeout: float = STATEMENT_TIMEOUT) -> None:
        self.pool = pool
        self._reactor = reactor
        self._dialect = dialect or Dialect()
        self._db_clock = db_clock
        self._timeout = timeout

    @classmethod
    def mysql(cls, settings: MySQLSettings, reactor, *,
              db_clock: IReactorTime | None = None) -> "WebhookStore":
        pool = platform_mysql.make_pool(settings, reactor)
        # Every statement stands alone (spec §2.1): run them in autocommit
        # mode and skip the COMMIT round trip adbapi would add after each.
        session = pool.openfun

        def open_connection(connection) -> None:
            if session is not None:
                session(connection)
            connection.autocommit(True)

        pool.openfun = open_connection
        pool.connectionFactory = _AutocommitConnection
        return cls(pool, reactor, db_clock=db_clock)

    @classmethod
    def sqlite(cls, path: str, reactor, *, db_clock: IReactorTime | None = None,
               create_schema: bool = True) -> "WebhookStore":
        clock = db_clock
        dialect = SQLiteDialect(
            (lambda: int(clock.seconds())) if clock is not None else (lambda: int(time.time())))

        def open_connection(connection) -> None:
            dialect.open_connection(connection)
            if create_schema:
                for statement in SQLITE_SCHEMA:
                    connection.execute(statement)
                connection.commit()

        # One connection: SQLite serialises writers anyway, and a second one
        # would only meet "database is locked".
        pool = adbapi.ConnectionPool(
            "sqlite3", path, check_same_thread=False, cp_min=1, cp_max=1,
            cp_openfun=open_connection, cp_reactor=reactor, cp_noisy=False)
        return cls(pool, reactor, dialect=dialect, db_clock=db_clock)

    @property
    def dialect(self) -> str:
        return self._dialect.name

    def _run(self, fn: Callable, *args) -> Deferred:
        pinned = int(self._db_clock.seconds()) if self._db_clock is not None else None

        def interaction(txn):
            self._dialect.pin_clock(txn, pinned)
            return fn(txn, *args)

        return self.pool.runInteraction(interaction).addTimeout(self._timeout, self._reactor)

    def _execute(self, txn, statement: str, params: Sequence[Any] = ()) -> None:
        txn.execute(self._dialect.sql(statement), tuple(params))

    async def candidates(self, *, limit: int, lease: int, backoff: int,
                         exclude_hooks: Sequence[str] = ()) -> list[Candidate]:
        """Queued rows due now, oldest first; both cutoffs from one reading of the DB clock."""

        def select(txn) -> list[Candidate]:
            self._execute(txn, SQL_NOW)
            now = int(txn.fetchone()[0])
            exclude = ""
            params: list[Any] = [now - lease, now - backoff]
            if exclude_hooks:
                exclude = SQL_EXCLUDE_HOOKS.format(marks=", ".join(["%s"] * len(exclude_hooks)))
                params.extend(hook.encode("utf-8") for hook in exclude_hooks)
            params.append(limit)
            self._execute(txn, SQL_CANDIDATES.format(exclude=exclude), params)
            return [Candidate.from_row(row) for row in txn.fetchall()]

        return await self._run(select)

    def _rowcount(self, statement: str, params: Sequence[Any]) -> Deferred:
        def update(txn) -> int:
            self._execute(txn, statement, params)
            return txn.rowcount

        return self._run(update)

    async def claim(self, candidate: Candidate) -> bool:
        """True iff this process now owns the row (exactly one row changed)."""
        return await self._rowcount(SQL_CLAIM, (candidate.id, candidate.version)) == 1

    async def finish(self, candidate: Candidate, status: str, result: str,
                     properties: str) -> int:
        """Write a delivery outcome; returns the rows changed (0: row gone)."""
        return await self._rowcount(SQL_FINISH, (status, result, properties, candidate.id))

    async def retire(self, candidate: Candidate, properties: str) -> int:
        """Configuration failure: failed / none / 0, only over the version read."""
        return await self._rowcount(SQL_RETIRE, (properties, candidate.id, candidate.version))

    async def load_hooks(self, phids: Sequence[str]) -> dict[str, Hook]:
        """The hooks of one batch of candidates, by PHID; a missing hook is absent."""
        if not phids:
            return {}

        def select(txn) -> dict[str, Hook]:
            statement = SQL_HOOKS.format(marks=", ".join(["%s"] * len(phids)))
            self._execute(txn, statement, [phid.encode("utf-8") for phid in phids])
            hooks = (Hook(id=int(row[0]), phid=_text(row[1]), name=_text(row[2]),
                          uri=_text(row[3]), status=_text(row[4]), hmac_key=_text(row[5]))
                     for row in txn.fetchall())
            return {hook.phid: hook for hook in hooks}

        return await self._run(select)

    def _count(self, statement: str, params: Sequence[Any] = ()) -> Deferred:
        def select(txn) -> int:
            self._execute(txn, statement, params)
            return int(txn.fetchone()[0])

        return self._run(select)

    async def recent_failures(self, hook_phid: str, window: int) -> int:
        return await self._count(SQL_BREAKER_COUNT, (hook_phid.encode("utf-8"), window))

    async def queued_for_hook(self, hook_phid: str) -> int:
        return await self._count(SQL_QUEUED_FOR_HOOK, (hook_phid.encode("utf-8"),))

    async def stats(self) -> Stats:
        def select(txn) -> Stats:
            self._execute(txn, SQL_STATS)
            row = txn.fetchone()
            return Stats(*(int(value) for value in row))

        return await self._run(select)

    async def hook_total(self) -> int:
        return await self._count(SQL_HOOK_TOTAL)

    async def ping(self, clock: IReactorTime, timeout: float = 5) -> str | None:
        return await platform_mysql.ping(self.pool, clock, timeout)

    def close(self) -> None:
        self.pool.close()
