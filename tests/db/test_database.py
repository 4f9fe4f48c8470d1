"""gorge.db: one retry policy and one deadline for every store, and the two engines.

The policy is checked with pools that answer as scripted (a deadlock cannot
be staged on demand); the engines against a real SQLite file and the
session's MariaDB, with the same statements in MySQL's spelling.
"""

from __future__ import annotations

import sqlite3

import pymysql
import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from twisted.internet import defer, task
from twisted.internet.defer import Deferred

from gorge.db import ATTEMPTS, DEADLINE, Database, MySQLEngine, SQLiteEngine, TransactionTimeout
from gorge.db.sqlmetrics import TransactionMetrics
from tests.support.logcapture import logged_events

LOCKED = sqlite3.OperationalError("database is locked")
BROKEN = sqlite3.OperationalError("no such table: x")


class ScriptedPool:
    """runInteraction answers with the next scripted item: an exception, a
    Deferred (answered later, or never), or else the function's own result."""

    def __init__(self, script: list) -> None:
        self.script = list(script)
        self.calls = 0

    def runInteraction(self, fn, *args):
        self.calls += 1
        step = self.script.pop(0) if self.script else None
        if isinstance(step, Exception):
            return defer.fail(step)
        if isinstance(step, Deferred):
            return step
        return defer.succeed(("answered", args))

    def close(self) -> None:
        pass


def scripted(script: list, clock: task.Clock, **kwargs) -> tuple[Database, ScriptedPool]:
    pool = ScriptedPool(script)
    return Database(SQLiteEngine(), pool, clock, name="unit", **kwargs), pool


def outcome(d: Deferred):
    """What ``d`` has answered so far (None: nothing yet); looking again is fine."""
    if not hasattr(d, "seen"):
        d.seen = []
        d.addBoth(d.seen.append)
    return d.seen[0] if d.seen else None


@given(st.lists(st.sampled_from([LOCKED, BROKEN]), max_size=ATTEMPTS + 2))
def test_only_retryable_errors_run_again_and_at_most_attempts_times(errors):
    clock = task.Clock()
    db, pool = scripted(errors, clock)
    with logged_events() as events:
        result = outcome(Deferred.fromCoroutine(db.run("txn", lambda txn: None, 7)))
    expected_calls, expected = 0, ("answered", (7,))
    for index in range(ATTEMPTS):
        expected_calls += 1
        if index >= len(errors):
            break
        if errors[index] is BROKEN or index == ATTEMPTS - 1:
            expected = errors[index]
            break
    assert pool.calls == expected_calls
    if isinstance(expected, Exception):
        assert result.value is expected
    else:
        assert result == expected
    retries = [e for e in events if e.get("log_format", "").startswith("UNIT_TXN_RETRY ")]
    assert [(e["txn"], e["attempt"]) for e in retries] == [
        ("txn", n) for n in range(1, expected_calls)
    ]
    stats = db.transactions["txn"]
    assert (stats.ok, stats.failed, stats.retries) == (
        int(not isinstance(expected, Exception)),
        int(isinstance(expected, Exception)),
        expected_calls - 1,
    )


def test_a_transaction_that_does_not_answer_fails_at_the_deadline():
    clock = task.Clock()
    db, _ = scripted([Deferred()], clock)
    d = Deferred.fromCoroutine(db.run("lease", lambda txn: None))
    clock.advance(DEADLINE - 0.5)
    assert outcome(d) is None
    clock.advance(0.5)
    failure = outcome(d)
    assert failure.check(TransactionTimeout) and failure.check(defer.TimeoutError)
    assert "'lease'" in str(failure.value)
    assert db.transactions["lease"].timed_out == 1


def test_one_deadline_covers_the_repeats():
    clock = task.Clock()
    first = Deferred()
    db, pool = scripted([first, Deferred()], clock)
    d = Deferred.fromCoroutine(db.run("claim", lambda txn: None))
    clock.advance(20)
    first.errback(LOCKED)  # the repeat starts with 15 s left, not a fresh 35 s
    assert pool.calls == 2
    clock.advance(DEADLINE - 20 - 0.5)
    assert outcome(d) is None
    clock.advance(0.5)
    assert outcome(d).check(TransactionTimeout)
    assert db.transactions["claim"].retries == 1


def test_each_transaction_has_its_own_deadline_and_a_cancel_stays_a_cancel():
    clock = task.Clock()
    db, _ = scripted([Deferred(), Deferred(), Deferred()], clock)
    first = Deferred.fromCoroutine(db.run("poll", lambda txn: None))
    clock.advance(10)
    second = Deferred.fromCoroutine(db.run("poll", lambda txn: None))
    third = Deferred.fromCoroutine(db.run("hooks", lambda txn: None))
    third.cancel()
    assert outcome(third).check(defer.CancelledError)
    assert not outcome(third).check(TransactionTimeout)
    clock.advance(DEADLINE - 10)
    assert outcome(first).check(TransactionTimeout) and outcome(second) is None
    clock.advance(10)
    assert outcome(second).check(TransactionTimeout)
    assert (db.transactions["poll"].timed_out, db.transactions["hooks"].failed) == (2, 1)
    assert clock.getDelayedCalls() == []  # nothing left in flight: no timer either


def test_an_unbounded_transaction_waits_for_the_driver():
    clock = task.Clock()
    first = Deferred()
    db, pool = scripted([first], clock)
    d = Deferred.fromCoroutine(db.run("stats", lambda txn: None, bounded=False))
    clock.advance(DEADLINE * 3)
    assert outcome(d) is None  # unbounded: only the driver bounds it
    first.callback("counted")
    assert outcome(d) == "counted" and pool.calls == 1


def test_the_description_comes_first():
    db, _ = scripted([], task.Clock())
    with pytest.raises(TypeError, match="description"):
        # The old ``_run(fn, *args)`` order fails loudly, not as a strange SQL error.
        outcome(Deferred.fromCoroutine(db.run(lambda txn, x: None, 7))).raiseException()


def test_metrics_name_each_transaction():
    clock = task.Clock()
    db, _ = scripted([LOCKED, None, BROKEN], clock)
    outcome(Deferred.fromCoroutine(db.run("renew", lambda txn: None)))
    outcome(Deferred.fromCoroutine(db.run("complete", lambda txn: None)))
    registry = CollectorRegistry()
    registry.register(TransactionMetrics(db))
    text = generate_latest(registry).decode()
    assert 'gorge_sql_transactions_total{outcome="ok",txn="renew"} 1.0' in text
    assert 'gorge_sql_transactions_total{outcome="error",txn="complete"} 1.0' in text
    assert 'gorge_sql_transaction_retries_total{txn="renew"} 1.0' in text
    assert 'gorge_sql_transaction_seconds_count{txn="complete"} 1.0' in text


@pytest.mark.parametrize(
    "error, retryable",
    [
        (pymysql.err.OperationalError(1213, "Deadlock found"), True),
        (pymysql.err.OperationalError(1205, "Lock wait timeout exceeded"), True),
        (pymysql.err.OperationalError(2013, "Lost connection"), False),
        (pymysql.err.IntegrityError(1062, "Duplicate entry"), False),
        (LOCKED, False),
    ],
)
def test_mysql_retries_deadlocks_and_lock_waits_only(error, retryable):
    assert MySQLEngine().retryable(error) is retryable


def test_sqlite_retries_a_locked_file_only():
    engine = SQLiteEngine()
    assert engine.retryable(LOCKED)
    assert engine.retryable(sqlite3.OperationalError("database table is locked"))
    assert not engine.retryable(BROKEN)
    assert not engine.retryable(pymysql.err.OperationalError(1213, "Deadlock found"))


COUNTER_TABLE = """
CREATE TABLE IF NOT EXISTS lisk_counter (
  counterName VARCHAR(32) NOT NULL PRIMARY KEY,
  counterValue BIGINT NOT NULL
);
"""


async def exercise(db: Database) -> dict:
    """The same transactions, in MySQL's spelling, on either engine."""

    def counters(txn) -> tuple:
        db.engine.begin_write(txn)
        first = db.engine.next_counter(txn, "c")
        second = db.engine.next_counter(txn, "c")
        batch = db.engine.reserve_counter(txn, "c", 5)
        db.engine.set_counter(txn, "mark", 42)
        return first, second, batch

    def read(txn) -> tuple:
        db.execute(
            txn,
            "SELECT counterValue FROM lisk_counter WHERE counterName = %s" + db.engine.for_update,
            ("c",),
        )
        value = txn.fetchone()[0]
        db.execute(txn, "SELECT counterValue FROM lisk_counter WHERE counterName = %s", ("mark",))
        mark = txn.fetchone()[0]
        db.execute(txn, "SELECT 7 DIV 2, GREATEST(4, 9, 2)")
        return int(value), int(mark), tuple(int(v) for v in txn.fetchone())

    return {"counters": await db.run("counters", counters), "read": await db.run("read", read)}


EXPECTED = {"counters": (1, 2, 3), "read": (7, 42, (3, 9))}


@pytest_twisted.ensureDeferred
async def test_sqlite_engine_sets_up_the_file_and_speaks_mysql(tmp_path):
    from twisted.internet import reactor

    path = str(tmp_path / "x.sqlite3")
    db = Database.sqlite(path, reactor, name="t", schema=COUNTER_TABLE)
    try:
        assert await exercise(db) == EXPECTED

        def pragmas(txn) -> tuple:
            txn.execute("PRAGMA journal_mode")
            journal = txn.fetchone()[0]
            txn.execute("PRAGMA busy_timeout")
            return journal, txn.fetchone()[0]

        assert await db.run("pragmas", pragmas) == ("wal", 5000)
        assert await db.ping() is None
    finally:
        db.close()


@pytest_twisted.ensureDeferred
async def test_sqlite_ping_says_what_failed(tmp_path):
    from twisted.internet import reactor

    db = Database.sqlite(str(tmp_path / "missing" / "x.sqlite3"), reactor, name="t")
    try:
        assert await db.ping() == "open database: OperationalError"
    finally:
        db.close()


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_mysql_engine_gives_the_same_answers(mariadb, worker_db):
    from twisted.internet import reactor

    db = Database.mysql(mariadb.settings(worker_db), reactor, name="t")
    try:
        assert await exercise(db) == EXPECTED
        assert await db.ping() is None
    finally:
        db.close()


def test_an_autocommit_connection_refuses_a_write_transaction():
    with pytest.raises(RuntimeError):
        MySQLEngine(autocommit=True).begin_write(object())
