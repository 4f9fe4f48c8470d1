"""A master that turns read-only, against the session's MariaDB: ``SET GLOBAL
read_only=1`` refuses writes to a daemon user without the READ ONLY ADMIN
privilege (error 1290), as on a demoted master.

The pool runs on the real reactor (its threads need one); the database's own
timers (deadlines, the health check) run on an injected clock, so the health
check is stepped by hand and awaited through the log line it writes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import pytest_twisted
from twisted.internet import reactor, task

from gorge.config import MySQLSettings
from gorge.db import Database, DatabaseReadOnly, MySQLEngine
from gorge.db.database import HEALTH_INTERVAL
from gorge.db.mysql import error_reason, is_transient
from tests.db.readonly import plain_user, root, set_read_only
from tests.support.logcapture import first_event, logged_events

pytestmark = pytest.mark.integration


@pytest.fixture
def plain_user_db(mariadb) -> Iterator[MySQLSettings]:
    name = "t_failover_readonly"
    conn = root(mariadb)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name}")
            cur.execute(f"CREATE DATABASE {name}")
            cur.execute(f"CREATE TABLE {name}.t (id INT PRIMARY KEY AUTO_INCREMENT, v INT)")
        with plain_user(mariadb, name) as settings:
            yield settings
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.close()


def health_checks(clock: task.Clock) -> list:
    """The health check's pending calls (the deadline timer may linger)."""
    return [c for c in clock.getDelayedCalls() if "LoopingCall" in repr(c)]


def _insert(txn, value: int) -> None:
    txn.execute("INSERT INTO t (v) VALUES (%s)", (value,))


def _count(txn) -> int:
    txn.execute("SELECT COUNT(*) FROM t")
    return int(txn.fetchone()[0])


@pytest_twisted.ensureDeferred
async def test_read_only_master_refuses_fast_is_reported_once_and_recovers_by_itself(
    mariadb, plain_user_db
):
    clock = task.Clock()
    engine = MySQLEngine(autocommit=True)
    db = Database(engine, engine.make_pool(plain_user_db, reactor), clock, name="unit")
    try:
        await db.run("insert", _insert, 1)
        assert db.writable and await db.ping() is None

        set_read_only(mariadb, True)
        with logged_events() as events:
            for value in (2, 3, 4):
                with pytest.raises(DatabaseReadOnly) as refused:
                    await db.run("insert", _insert, value)
            assert not db.writable
            # The driver's code survives: the helpers read it as the driver's error.
            assert refused.value.args[0] == 1290
            assert error_reason(refused.value) == "database read-only"
            assert not is_transient(refused.value)
            # Reads still work on a read-only master.
            assert await db.run("count", _count) == 1
            assert await db.ping() == "database read-only"
        transitions = [e for e in events if "_DB_" in str(e.get("log_format", ""))]
        assert [e["log_format"].split()[0] for e in transitions] == ["UNIT_DB_READ_ONLY"]
        # Not retried as a deadlock would be: one attempt per call, no retry line.
        assert not [e for e in events if "TXN_RETRY" in str(e.get("log_format", ""))]
        assert db.transactions["insert"].failed == 3

        # Asked again while still read-only: nothing changes, nothing logged.
        with first_event("UNIT_DB_") as logged:
            assert await db.ping() == "database read-only"
        assert not logged.called and not db.writable and health_checks(clock)

        set_read_only(mariadb, False)
        with first_event("UNIT_DB_WRITABLE") as writable:
            clock.advance(HEALTH_INTERVAL)  # the health check, not a caller, notices
            event = await writable.addTimeout(10, reactor)
        assert db.writable
        assert event["after"] == HEALTH_INTERVAL
        # The check stops once writable: stepping the clock asks nothing more.
        assert not health_checks(clock)
        await db.run("insert", _insert, 5)
        assert await db.run("count", _count) == 2
    finally:
        db.close()


@pytest_twisted.ensureDeferred
async def test_ping_alone_finds_a_read_only_master(mariadb, plain_user_db):
    """A daemon that writes nothing at the moment still turns unready."""
    clock = task.Clock()
    engine = MySQLEngine()
    db = Database(engine, engine.make_pool(plain_user_db, reactor), clock, name="unit")
    try:
        set_read_only(mariadb, True)
        with first_event("UNIT_DB_READ_ONLY") as logged:
            assert await db.ping() == "database read-only"
        assert logged.called and not db.writable
        set_read_only(mariadb, False)
        assert await db.ping() is None
        assert db.writable and not health_checks(clock)
    finally:
        db.close()
