"""The embedded SQLite backend: Phorge's three worker tables and the counter
in one file, for single-node use and the demo."""

from __future__ import annotations

import sqlite3

from twisted.enterprise import adbapi
from twisted.internet.interfaces import IReactorTime

from gorge.db import SQLiteEngine
from gorge.db.clock import HostTime, StoreTime
from gorge.taskqueue.sqlstore import SqlTaskStore

# Same tables, columns and keys as schema/phabricator_worker.sql; nobody else
# creates this file, so the store does (the one exception to "no DDL").
# The PHID columns are VARBINARY(64) in MySQL, but SQLite would give that
# declared type NUMERIC affinity and store "0042" as the integer 42; TEXT
# affinity keeps every string as given and still compares bytewise.
SCHEMA = """
CREATE TABLE IF NOT EXISTS worker_activetask (
  id INTEGER NOT NULL PRIMARY KEY,
  taskClass VARCHAR(64) NOT NULL,
  leaseOwner VARCHAR(64) DEFAULT NULL,
  leaseExpires INTEGER DEFAULT NULL,
  failureCount INTEGER NOT NULL,
  dataID INTEGER NOT NULL,
  failureTime INTEGER DEFAULT NULL,
  priority INTEGER NOT NULL,
  objectPHID TEXT DEFAULT NULL,
  dateCreated INTEGER NOT NULL,
  dateModified INTEGER NOT NULL,
  containerPHID TEXT DEFAULT NULL
);
CREATE INDEX IF NOT EXISTS activetask_leaseExpires ON worker_activetask (leaseExpires);
CREATE INDEX IF NOT EXISTS activetask_key_failuretime ON worker_activetask (failureTime);
CREATE INDEX IF NOT EXISTS activetask_taskClass ON worker_activetask (taskClass);
CREATE INDEX IF NOT EXISTS activetask_key_owner ON worker_activetask (leaseOwner, priority, id);
CREATE INDEX IF NOT EXISTS activetask_key_object ON worker_activetask (objectPHID);
CREATE INDEX IF NOT EXISTS activetask_key_container ON worker_activetask (containerPHID);
CREATE INDEX IF NOT EXISTS activetask_queue ON worker_activetask (priority, id);
CREATE TABLE IF NOT EXISTS worker_archivetask (
  id INTEGER NOT NULL PRIMARY KEY,
  taskClass VARCHAR(64) NOT NULL,
  leaseOwner VARCHAR(64) DEFAULT NULL,
  leaseExpires INTEGER DEFAULT NULL,
  failureCount INTEGER NOT NULL,
  dataID INTEGER NOT NULL,
  result INTEGER NOT NULL,
  duration BIGINT NOT NULL,
  dateCreated INTEGER NOT NULL,
  dateModified INTEGER NOT NULL,
  priority INTEGER NOT NULL,
  objectPHID TEXT DEFAULT NULL,
  archivedEpoch INTEGER DEFAULT NULL,
  containerPHID TEXT DEFAULT NULL
);
CREATE INDEX IF NOT EXISTS archivetask_dateCreated ON worker_archivetask (dateCreated);
CREATE INDEX IF NOT EXISTS archivetask_key_modified ON worker_archivetask (dateModified);
CREATE INDEX IF NOT EXISTS archivetask_key_object ON worker_archivetask (objectPHID);
CREATE INDEX IF NOT EXISTS archivetask_key_container ON worker_archivetask (containerPHID);
CREATE TABLE IF NOT EXISTS worker_taskdata (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS lisk_counter (
  counterName VARCHAR(32) NOT NULL PRIMARY KEY,
  counterValue BIGINT NOT NULL
);
"""

# Files created before the PHID columns had TEXT affinity declared them
# VARBINARY(64); these tables are rebuilt once so new PHIDs keep their text.
_PHID_TABLES = ("worker_activetask", "worker_archivetask")


def _numeric_phid_table(connection: sqlite3.Connection, table: str) -> str | None:
    """The CREATE statement of ``table`` if it still has VARBINARY PHID columns."""
    row = connection.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    return row[0] if row is not None and "VARBINARY" in row[0] else None


def _rebuild_numeric_phid_tables(connection: sqlite3.Connection) -> None:
    for table in _PHID_TABLES:
        if _numeric_phid_table(connection, table) is None:
            continue
        connection.execute("BEGIN IMMEDIATE")
        try:
            # Again under the write lock: another process may have rebuilt it.
            old = _numeric_phid_table(connection, table)
            if old is None:
                connection.execute("ROLLBACK")
                continue
            rebuilt = f"{table}_rebuilt"
            create = old.replace("VARBINARY(64)", "TEXT").replace(table, rebuilt, 1)
            connection.execute(create)
            connection.execute(f"INSERT INTO {rebuilt} SELECT * FROM {table}")
            connection.execute(f"DROP TABLE {table}")
            connection.execute(f"ALTER TABLE {rebuilt} RENAME TO {table}")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")


def make_sqlite_pool(path: str, reactor) -> adbapi.ConnectionPool:
    return _engine().make_pool(path, reactor)


def _engine(clock: IReactorTime | None = None) -> SQLiteEngine:
    # Rebuilding first also recreates the indexes a rebuilt table lost with its old copy.
    return SQLiteEngine(schema=SCHEMA, prepare=_rebuild_numeric_phid_tables, clock=clock)


class SQLiteTaskStore(SqlTaskStore):
    new_engine = staticmethod(_engine)

    def default_time(self, clock: IReactorTime, db_clock: IReactorTime | None) -> StoreTime:
        # One process owns the file: the host's clock is everyone's.
        return HostTime(db_clock if db_clock is not None else clock)

    @classmethod
    def open(cls, path: str, reactor, clock: IReactorTime | None = None) -> SQLiteTaskStore:
        return cls(
            make_sqlite_pool(path, reactor),
            clock if clock is not None else reactor,
            reactor=reactor,
        )
