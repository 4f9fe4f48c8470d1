"""A deadlock (1213) or lock-wait timeout (1205) re-runs the whole
transaction a few times instead of answering 500; other errors are not retried.

The pool is a stand-in that raises what MariaDB raises: staging a real
deadlock would need two transactions interleaved statement by statement."""

from __future__ import annotations

import pymysql
import pytest
import pytest_twisted
from twisted.internet import defer

from gorge.db.clock import HostTime
from gorge.taskqueue.mysql import MySQLTaskStore
from tests.support.logcapture import logged_events


class ScriptedPool:
    """runInteraction fails with the queued errors, then answers ``result``."""

    def __init__(self, errors: list[Exception], result) -> None:
        self.errors = list(errors)
        self.result = result
        self.calls = 0

    def runInteraction(self, fn, *args):
        self.calls += 1
        if self.errors:
            return defer.fail(self.errors.pop(0))
        return defer.succeed(self.result)


def _deadlock() -> Exception:
    return pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock")


def _lock_wait() -> Exception:
    return pymysql.err.OperationalError(1205, "Lock wait timeout exceeded")


@pytest.mark.parametrize("errors", [[_deadlock()], [_lock_wait(), _deadlock()]])
@pytest_twisted.ensureDeferred
async def test_a_deadlock_or_lock_wait_timeout_reruns_the_transaction(clock, errors):
    pool = ScriptedPool(errors, result=[])
    store = MySQLTaskStore(pool, clock, time=HostTime(clock))
    with logged_events() as events:
        assert await store.lease("w", 5, 60) == []
    assert pool.calls == len(errors) + 1
    retries = [e for e in events if str(e.get("log_format", "")).startswith("TASKQUEUE_TXN_RETRY")]
    assert len(retries) == len(errors)


@pytest_twisted.ensureDeferred
async def test_retries_are_bounded(clock):
    pool = ScriptedPool([_deadlock() for _ in range(10)], result=[])
    store = MySQLTaskStore(pool, clock, time=HostTime(clock))
    with pytest.raises(pymysql.err.OperationalError):
        await store.lease("w", 5, 60)
    assert 2 <= pool.calls <= 5


@pytest.mark.parametrize(
    "error",
    [
        pymysql.err.IntegrityError(1062, "Duplicate entry"),
        pymysql.err.OperationalError(2003, "Can't connect to MySQL server"),
        pymysql.err.ProgrammingError(1146, "Table doesn't exist"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_other_errors_are_not_retried(clock, error):
    pool = ScriptedPool([error], result=[])
    store = MySQLTaskStore(pool, clock, time=HostTime(clock))
    with pytest.raises(type(error)):
        await store.lease("w", 5, 60)
    assert pool.calls == 1
