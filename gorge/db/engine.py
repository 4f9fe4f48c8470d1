"""What differs between the SQL databases gorge speaks: one engine per kind.

The stores write their statements once, in MySQL's spelling with ``%s``
placeholders. An engine is the one place that knows how its database differs:
the placeholder style and the few functions SQLite lacks, how a connection is
set up, how a write transaction starts, whether a read can lock its rows,
Phorge's ``lisk_counter`` upsert, which errors are worth running a
transaction again, and how an unavailable database is described to
``/readyz``. Engines hold no connection; :class:`gorge.sql.Database` does.

``clock`` (tests and the demo's injected time) makes the database's own clock
(``UNIX_TIMESTAMP()``) follow an injected one."""

from __future__ import annotations

import functools
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from twisted.enterprise import adbapi
from twisted.internet.defer import TimeoutError as DeferredTimeoutError
from twisted.internet.interfaces import IReactorTime

from gorge.config import MySQLSettings
from gorge.db import mysql as mysql

__all__ = ["READ_ONLY_REASON", "Engine", "MySQLEngine", "SQLiteEngine", "Txn"]


class Txn(Protocol):
    """The transaction a store's interaction runs in, in a pool thread:
    adbapi's ``Transaction`` over a pymysql or sqlite3 cursor. Statements are
    written once, in MySQL's spelling; :meth:`Engine.execute` adapts them."""

    @property
    def rowcount(self) -> int: ...

    @property
    def lastrowid(self) -> int: ...

    def execute(self, statement: str, args: Sequence[Any] = ...) -> Any: ...

    def executemany(self, statement: str, args: Sequence[Sequence[Any]]) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> Sequence[Any]: ...


# LiskDAO::loadNextCounterValue: both branches publish the value through
# LAST_INSERT_ID(expr), so the insert id is exactly this call's counter value.
MYSQL_NEXT_COUNTER = (
    "INSERT INTO lisk_counter (counterName, counterValue) VALUES (%s, LAST_INSERT_ID(1))"
    " ON DUPLICATE KEY UPDATE counterValue = LAST_INSERT_ID(counterValue + 1)"
)
# The same counter, advanced by a whole batch: the insert id is the last value taken.
MYSQL_RESERVE_COUNTER = (
    "INSERT INTO lisk_counter (counterName, counterValue) VALUES (%s, LAST_INSERT_ID(%s))"
    " ON DUPLICATE KEY UPDATE counterValue = LAST_INSERT_ID(counterValue + %s)"
)
MYSQL_SET_COUNTER = (
    "INSERT INTO lisk_counter (counterName, counterValue) VALUES (%s, %s)"
    " ON DUPLICATE KEY UPDATE counterValue = %s"
)
# Re-selects inside a write transaction must see other transactions' commits,
# which REPEATABLE READ's snapshot would hide.
MYSQL_READ_COMMITTED = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"
SQL_ROLLBACK = "ROLLBACK"
# An explicit transaction on an autocommit connection (a batch that commits as one).
MYSQL_START_TRANSACTION = "START TRANSACTION"
MYSQL_COMMIT = "COMMIT"
# The session clock: UNIX_TIMESTAMP() answers this until the next SET.
MYSQL_PIN_CLOCK = "SET timestamp = %s"

# The upsert MySQL spells with LAST_INSERT_ID(); SQLite hands the value back directly.
SQLITE_NEXT_COUNTER = (
    "INSERT INTO lisk_counter (counterName, counterValue) VALUES (?, 1)"
    " ON CONFLICT (counterName) DO UPDATE SET counterValue = counterValue + 1"
    " RETURNING counterValue"
)
SQLITE_RESERVE_COUNTER = (
    "INSERT INTO lisk_counter (counterName, counterValue) VALUES (?, ?)"
    " ON CONFLICT (counterName) DO UPDATE SET counterValue = counterValue + ?"
    " RETURNING counterValue"
)
SQLITE_SET_COUNTER = (
    "INSERT INTO lisk_counter (counterName, counterValue) VALUES (?, ?)"
    " ON CONFLICT (counterName) DO UPDATE SET counterValue = ?"
)
# The connection runs in autocommit mode (isolation_level=None), so a write
# transaction is opened explicitly and takes the write lock up front.
SQLITE_BEGIN_WRITE = "BEGIN IMMEDIATE"

SQLITE_BUSY_TIMEOUT_MS = 5000


def _sqlite_spelling(statement: str) -> str:
    # Integer operands only: SQLite's "/" is MySQL's DIV there, and its
    # multi-argument MAX() is GREATEST().
    return statement.replace("%s", "?").replace(" DIV ", " / ").replace("GREATEST(", "MAX(")


# /readyz's reason while the server answers but refuses writes.
READ_ONLY_REASON = "database read-only"


def _select_one(txn: Txn) -> bool:
    txn.execute("SELECT 1")
    txn.fetchall()
    return False


def _mysql_read_only(txn: Txn) -> bool:
    txn.execute(mysql.READ_ONLY_QUERY)
    row = txn.fetchone()
    return row is not None and mysql.reads_only(row[0])


class Engine:
    """The interface; see the module doc. Methods taking ``txn`` run in a pool thread."""

    name = "sql"
    # Each statement outside begin_write/begin_atomic commits on its own.
    autocommit = False
    # Appended to a SELECT that reads rows the transaction is about to change.
    for_update = ""
    # What failed, for /readyz: "<unavailable>: <reason>".
    unavailable = "database"
    timed_out = "timed out"

    def __init__(self, *, clock: IReactorTime | None = None) -> None:
        self.clock = clock

    def sql(self, statement: str) -> str:
        return statement

    def execute(self, txn: Txn, statement: str, params: Sequence[Any] = ()) -> None:
        txn.execute(self.sql(statement), tuple(params))

    def begin_write(self, txn: Txn, *, read_committed: bool = False) -> None:
        """Start a transaction that will write. ``read_committed``: later reads in it
        see what other transactions committed meanwhile."""

    def begin_atomic(self, txn: Txn) -> None:
        """Start a few statements that must commit together, whatever the connection's
        mode (an autocommit one included); :meth:`commit_atomic` ends them."""
        self.begin_write(txn)

    def commit_atomic(self, txn: Txn) -> None:
        """Commit what :meth:`begin_atomic` started (a raise before it rolls back)."""

    def rollback_atomic(self, txn: Txn) -> None:
        """Undo what :meth:`begin_atomic` started, and go on in the same interaction."""
        txn.execute(SQL_ROLLBACK)

    def clock_pin(self) -> float | None:
        """Read in the reactor thread before each transaction; see :meth:`pin_clock`."""
        return None

    def pin_clock(self, txn: Txn, seconds: float) -> None:
        """Make the database's clock read ``seconds`` for this transaction."""

    def next_counter(self, txn: Txn, name: str) -> int:
        """Advance Phorge's ``lisk_counter`` row ``name`` by one; the new value."""
        raise NotImplementedError

    def reserve_counter(self, txn: Txn, name: str, count: int) -> int:
        """Take ``count`` consecutive values from the counter; the first one."""
        raise NotImplementedError

    def set_counter(self, txn: Txn, name: str, value: int) -> None:
        raise NotImplementedError

    def retryable(self, exc: BaseException) -> bool:
        """Whether running the whole transaction again may succeed (it was rolled back
        because of other transactions, not because of what it does)."""
        return False

    def read_only(self, exc: BaseException) -> bool:
        """Whether the database refused a write because it takes none now."""
        return False

    def reason(self, exc: BaseException) -> str:
        """A short cause, never the DSN, host, path or password."""
        return type(exc).__name__

    # What the ping runs: True when the database answers but refuses writes.
    _probe: Callable[[Txn], bool] = staticmethod(_select_one)

    async def ping(
        self, pool: adbapi.ConnectionPool, clock: IReactorTime, within: float
    ) -> str | None:
        """None when the database answers in time and takes writes, else
        ``"<unavailable>: <reason>"`` or :data:`READ_ONLY_REASON`."""
        try:
            read_only = await pool.runInteraction(self._probe).addTimeout(within, clock)
        except DeferredTimeoutError:
            return f"{self.unavailable}: {self.timed_out}"
        except Exception as e:
            return f"{self.unavailable}: {self.reason(e)}"
        return READ_ONLY_REASON if read_only else None


class MySQLEngine(Engine):
    """MariaDB/MySQL through pymysql.

    ``autocommit``: every statement commits on its own (the webhook's
    statements each stand alone); the store then never calls
    :meth:`begin_write`, and adbapi's COMMIT after each interaction, a
    wasted round trip, is skipped.
    """

    name = "mysql"
    for_update = " FOR UPDATE"
    unavailable = "ping database"
    timed_out = "database ping timed out"

    def __init__(self, *, autocommit: bool = False, clock: IReactorTime | None = None) -> None:
        super().__init__(clock=clock)
        self.autocommit = autocommit

    def make_pool(self, settings: MySQLSettings, reactor: Any) -> adbapi.ConnectionPool:
        pool = mysql.make_pool(settings, reactor, autocommit=self.autocommit)
        if self.autocommit:
            pool.connectionFactory = _AutocommitConnection
        return pool

    def begin_write(self, txn: Txn, *, read_committed: bool = False) -> None:
        if self.autocommit:
            raise RuntimeError("a write transaction on an autocommit connection")
        # Without autocommit the first statement opens the transaction.
        if read_committed:
            txn.execute(MYSQL_READ_COMMITTED)

    def begin_atomic(self, txn: Txn) -> None:
        if self.autocommit:
            txn.execute(MYSQL_START_TRANSACTION)
        else:
            self.begin_write(txn)

    def commit_atomic(self, txn: Txn) -> None:
        # adbapi's own commit is skipped on an autocommit connection.
        if self.autocommit:
            txn.execute(MYSQL_COMMIT)

    def clock_pin(self) -> float | None:
        # To the microsecond, as the server's own clock: UNIX_TIMESTAMP() still
        # answers whole seconds, UNIX_TIMESTAMP(NOW(6)) the fraction too.
        return None if self.clock is None else round(self.clock.seconds(), 6)

    def pin_clock(self, txn: Txn, seconds: float) -> None:
        txn.execute(MYSQL_PIN_CLOCK, (seconds,))

    def next_counter(self, txn: Txn, name: str) -> int:
        txn.execute(MYSQL_NEXT_COUNTER, (name,))
        return int(txn.lastrowid)

    def reserve_counter(self, txn: Txn, name: str, count: int) -> int:
        txn.execute(MYSQL_RESERVE_COUNTER, (name, count, count))
        return int(txn.lastrowid) - count + 1

    def set_counter(self, txn: Txn, name: str, value: int) -> None:
        txn.execute(MYSQL_SET_COUNTER, (name, value, value))

    # The server's read_only flag: a demoted master answers SELECT 1 but no write.
    _probe = staticmethod(_mysql_read_only)

    def retryable(self, exc: BaseException) -> bool:
        return mysql.is_retryable(exc)

    def read_only(self, exc: BaseException) -> bool:
        return mysql.is_read_only(exc)

    def reason(self, exc: BaseException) -> str:
        return mysql.error_reason(exc)


class _AutocommitConnection(adbapi.Connection):
    """adbapi commits after every interaction; in autocommit mode that is a wasted round trip."""

    def commit(self) -> None:
        pass


class SQLiteEngine(Engine):
    """The embedded database: one file, one connection, tables created on first use.

    ``schema`` is a script of ``CREATE ... IF NOT EXISTS`` statements run
    on every connection (nobody else creates this file); ``prepare`` runs
    before it (a store's one-off upgrade of an older file).
    """

    name = "sqlite"
    unavailable = "open database"

    def __init__(
        self,
        *,
        schema: str = "",
        prepare: Callable[[sqlite3.Connection], None] | None = None,
        clock: IReactorTime | None = None,
    ) -> None:
        super().__init__(clock=clock)
        self._schema = schema
        self._prepare = prepare
        # Statements repeat (ids lists vary in length only): translate each once.
        self._translate = functools.lru_cache(maxsize=1024)(_sqlite_spelling)

    def sql(self, statement: str) -> str:
        return self._translate(statement)

    def open_connection(self, connection: sqlite3.Connection) -> None:
        """Set up one connection: waits for a locked file, WAL, the clock, the tables."""
        connection.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        connection.execute("PRAGMA journal_mode = WAL")
        clock = self.clock
        now: Callable[[], Any] = (
            (lambda: int(clock.seconds())) if clock is not None else (lambda: int(time.time()))
        )
        connection.create_function("UNIX_TIMESTAMP", 0, now)
        if self._prepare is not None:
            self._prepare(connection)
        if self._schema:
            connection.executescript(self._schema)

    def make_pool(self, path: str, reactor: Any) -> adbapi.ConnectionPool:
        # One connection: SQLite serialises writers anyway, and one connection
        # keeps BEGIN IMMEDIATE from ever waiting on ourselves.
        return adbapi.ConnectionPool(
            "sqlite3",
            path,
            check_same_thread=False,
            isolation_level=None,
            cp_min=1,
            cp_max=1,
            cp_noisy=False,
            cp_openfun=self.open_connection,
            cp_reactor=reactor,
        )

    def begin_write(self, txn: Txn, *, read_committed: bool = False) -> None:
        # Writers are serialised: every read after BEGIN IMMEDIATE sees all commits.
        txn.execute(SQLITE_BEGIN_WRITE)

    def next_counter(self, txn: Txn, name: str) -> int:
        txn.execute(SQLITE_NEXT_COUNTER, (name,))
        return int(txn.fetchone()[0])

    def reserve_counter(self, txn: Txn, name: str, count: int) -> int:
        txn.execute(SQLITE_RESERVE_COUNTER, (name, count, count))
        return int(txn.fetchone()[0]) - count + 1

    def set_counter(self, txn: Txn, name: str, value: int) -> None:
        txn.execute(SQLITE_SET_COUNTER, (name, value, value))

    def retryable(self, exc: BaseException) -> bool:
        # SQLITE_BUSY ("database is locked") and SQLITE_LOCKED ("database table is locked").
        return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)
