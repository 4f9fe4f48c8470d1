"""What gorge-mailer did with each ``Idempotency-Key``: one row per key, in a
database gorge-mailer owns (an SQLite file, or its own MySQL database when
replicas share it; never one of Phorge's).

A row is written *before* the send (``sending``: the fence) and completed
after it (``done``, with the answer that was given). A send that provably
handed nothing over (``ERR_SEND_FAILED``) removes its row instead, so the
next request with the key sends anew. A row left at ``sending`` by a
process that ended mid-send is never sent again: once it is older than
``abandon_after`` seconds it is settled as "outcome unknown".

Keys are stored as their SHA-256 (a bounded, fixed-width index; the keys
themselves are not needed again). Ages come from the database's clock
(``UNIX_TIMESTAMP()``), so replicas on hosts whose clocks differ agree on
them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from twisted.internet.interfaces import IReactorTime

from gorge.config import MySQLSettings
from gorge.db import Database
from gorge.db.engine import Txn
from gorge.mailer.dispatcher import Answer

DATABASE_NAME = "mailer"  # prefixes the transactions' log events: MAILER_TXN_RETRY
TABLE = "gorge_mailer_send"
SENDING, DONE = "sending", "done"
# Retryable answers leave no row: nothing was accepted, the key may send again.
RELEASED_CODES = frozenset({"ERR_SEND_FAILED"})
_TEXT_LIMIT = 2048  # Answer messages are capped at 2 KiB already
_FIELD_LIMIT = 255

MYSQL_SCHEMA = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  keyHash CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  state VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  startedAt BIGINT NOT NULL,
  finishedAt BIGINT NULL,
  httpStatus INT NULL,
  errorCode VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL,
  errorMessage TEXT NULL,
  mailerKey VARCHAR(255) NULL,
  messageId VARCHAR(255) NULL,
  UNIQUE KEY key_keyHash (keyHash),
  KEY key_startedAt (startedAt)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"""

SQLITE_SCHEMA = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  keyHash TEXT NOT NULL UNIQUE,
  state TEXT NOT NULL,
  startedAt INTEGER NOT NULL,
  finishedAt INTEGER,
  httpStatus INTEGER,
  errorCode TEXT,
  errorMessage TEXT,
  mailerKey TEXT,
  messageId TEXT
);
CREATE INDEX IF NOT EXISTS {TABLE}_startedAt ON {TABLE} (startedAt);
"""

# The one statement the two spell differently: a claim that loses to an
# existing row must neither fail nor touch it.
CLAIM = {
    "mysql": f"INSERT IGNORE INTO {TABLE} (keyHash, state, startedAt)"
    " VALUES (%s, %s, UNIX_TIMESTAMP())",
    "sqlite": f"INSERT OR IGNORE INTO {TABLE} (keyHash, state, startedAt)"
    " VALUES (%s, %s, UNIX_TIMESTAMP())",
}
READ = (
    "SELECT state, UNIX_TIMESTAMP() - startedAt, httpStatus, errorCode, errorMessage,"
    f" mailerKey, messageId FROM {TABLE} WHERE keyHash = %s"
)
FINISH = (
    f"UPDATE {TABLE} SET state = %s, finishedAt = UNIX_TIMESTAMP(), httpStatus = %s,"
    " errorCode = %s, errorMessage = %s, mailerKey = %s, messageId = %s WHERE keyHash = %s"
)
RELEASE = f"DELETE FROM {TABLE} WHERE keyHash = %s AND state = %s"
PRUNE_OLD = f"DELETE FROM {TABLE} WHERE startedAt < UNIX_TIMESTAMP() - %s"
NTH_NEWEST = f"SELECT id FROM {TABLE} ORDER BY id DESC LIMIT 1 OFFSET %s"
# Over the size bound the oldest rows go, but never a send that may still be
# under way: dropping its fence could let a retry send it twice.
PRUNE_EXCESS = (
    f"DELETE FROM {TABLE} WHERE id <= %s AND (state = %s OR startedAt < UNIX_TIMESTAMP() - %s)"
)
COUNT = f"SELECT COUNT(*) FROM {TABLE}"


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Claimed:
    """This request recorded the key first: it sends."""


@dataclass(frozen=True)
class Recorded:
    """The key's send is over; this was its answer."""

    answer: Answer


@dataclass(frozen=True)
class Pending:
    """The key's send began ``age`` seconds ago (database clock) and has no
    outcome yet: still under way elsewhere, or its process ended mid-send."""

    age: int


State = Claimed | Recorded | Pending


def _answer_of(row: Any) -> State:
    state, age, status, code, message, mailer_key, message_id = row
    if state != DONE:
        return Pending(max(0, int(age)))
    return Recorded(
        Answer(
            int(status),
            code or None,
            message or "",
            mailer_key=mailer_key or "",
            message_id=message_id or "",
        )
    )


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit]


class SendRecords:
    """The table, through one :class:`~gorge.db.Database`. Each method is one
    transaction; see the module doc for what the rows mean."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._claim_statement = CLAIM[db.engine.name]
        self._table_ready = db.engine.name == "sqlite"  # its schema runs on connect

    @classmethod
    def sqlite(
        cls, path: str, reactor: Any, *, db_clock: IReactorTime | None = None
    ) -> SendRecords:
        return cls(
            Database.sqlite(
                path, reactor, name=DATABASE_NAME, schema=SQLITE_SCHEMA, db_clock=db_clock
            )
        )

    @classmethod
    def mysql(
        cls, settings: MySQLSettings, reactor: Any, *, db_clock: IReactorTime | None = None
    ) -> SendRecords:
        return cls(Database.mysql(settings, reactor, name=DATABASE_NAME, db_clock=db_clock))

    async def _ready(self) -> None:
        # MySQL: the table is created on first use, in gorge-mailer's own
        # database; a failure is retried by the next request.
        if not self._table_ready:
            await self.db.run("create table", self._create)
            self._table_ready = True

    def _create(self, txn: Txn) -> None:
        txn.execute(MYSQL_SCHEMA)

    async def claim(self, digest: str) -> State:
        """Record the key as being sent, or say what is recorded for it."""
        await self._ready()
        return await self.db.run("claim", self._claim, digest)

    def _claim(self, txn: Txn, digest: str) -> State:
        engine = self.db.engine
        engine.begin_write(txn, read_committed=True)
        # A row released (or pruned) between the two statements: claim again.
        for _ in range(3):
            engine.execute(txn, self._claim_statement, (digest, SENDING))
            if txn.rowcount == 1:
                return Claimed()
            engine.execute(txn, READ, (digest,))
            row = txn.fetchone()
            if row is not None:
                return _answer_of(row)
        raise RuntimeError("the key's row kept disappearing")

    async def read(self, digest: str) -> State | None:
        """What is recorded for the key; None when nothing is."""
        await self._ready()
        return await self.db.run("read", self._read, digest)

    def _read(self, txn: Txn, digest: str) -> State | None:
        self.db.execute(txn, READ, (digest,))
        row = txn.fetchone()
        return None if row is None else _answer_of(row)

    async def finish(self, digest: str, answer: Answer) -> None:
        """Complete the key's row with the answer given, or remove it when
        the answer says nothing was accepted."""
        await self.db.run("finish", self._finish, digest, answer)

    def _finish(self, txn: Txn, digest: str, answer: Answer) -> None:
        if answer.code in RELEASED_CODES:
            self.db.execute(txn, RELEASE, (digest, SENDING))
            return
        self.db.execute(
            txn,
            FINISH,
            (
                DONE,
                answer.status,
                answer.code,
                _clip(answer.message, _TEXT_LIMIT),
                _clip(answer.mailer_key, _FIELD_LIMIT),
                _clip(answer.message_id, _FIELD_LIMIT),
                digest,
            ),
        )

    async def settle(self, digest: str, answer: Answer) -> State | None:
        """Settle a send left without an outcome as ``answer``, unless an
        outcome arrived meanwhile; what is recorded afterwards."""
        return await self.db.run("settle", self._settle, digest, answer)

    def _settle(self, txn: Txn, digest: str, answer: Answer) -> State | None:
        self.db.engine.begin_write(txn, read_committed=True)
        self.db.execute(
            txn,
            FINISH + " AND state = %s",
            (
                DONE,
                answer.status,
                answer.code,
                _clip(answer.message, _TEXT_LIMIT),
                answer.mailer_key,
                answer.message_id,
                digest,
                SENDING,
            ),
        )
        return self._read(txn, digest)

    async def prune(self, *, retention: int, max_entries: int, abandon_after: int) -> int:
        """Remove rows older than ``retention`` seconds, then the oldest
        finished ones beyond ``max_entries``; how many went."""
        await self._ready()
        return await self.db.run(
            "prune", self._prune, retention, max_entries, abandon_after, bounded=False
        )

    def _prune(self, txn: Txn, retention: int, max_entries: int, abandon_after: int) -> int:
        self.db.execute(txn, PRUNE_OLD, (retention,))
        removed = max(0, txn.rowcount)
        self.db.execute(txn, NTH_NEWEST, (max_entries,))
        row = txn.fetchone()
        if row is not None:
            self.db.execute(txn, PRUNE_EXCESS, (int(row[0]), DONE, abandon_after))
            removed += max(0, txn.rowcount)
        return removed

    async def count(self) -> int:
        await self._ready()
        return await self.db.run("count", self._count)

    def _count(self, txn: Txn) -> int:
        txn.execute(COUNT)
        return int(txn.fetchone()[0])

    def close(self) -> None:
        self.db.close()
