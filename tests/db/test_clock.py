"""gorge.db.clock.DatabaseClock: the database server's clock without a round
trip per call, on the session's MariaDB.

The server's clock is pinned to an injected one (MariaDB's session
``timestamp``), and the same injected clock stands in for the host's
monotonic one, so the reads can be counted and the answers compared exactly.
"""

from __future__ import annotations

import threading

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import Clock, deferLater
from twisted.internet.threads import deferToThread

from gorge.db import Database
from gorge.db.clock import RESAMPLE, DatabaseClock

pytestmark = pytest.mark.integration

T0 = 1_795_947_000.25


@pytest.fixture
def pinned(mariadb, worker_db):
    """A database whose clock reads the injected clock's time, and that clock."""
    clock = Clock()
    clock.advance(T0)
    db = Database.mysql(mariadb.settings(worker_db), reactor, name="clocktest", db_clock=clock)
    yield db, clock
    db.close()


def _reads(db: Database) -> int:
    stats = db.transactions.get("clock")
    return 0 if stats is None else stats.ok


@pytest_twisted.ensureDeferred
async def test_the_server_clock_is_read_once_and_counted_on(pinned):
    db, clock = pinned
    server = DatabaseClock(db, elapsed=clock.seconds)
    assert await server.now() == T0
    clock.advance(12.5)
    assert await server.now() == T0 + 12.5
    assert _reads(db) == 1


@pytest_twisted.ensureDeferred
async def test_calls_arriving_together_share_the_first_read(pinned):
    db, clock = pinned
    server = DatabaseClock(db, elapsed=clock.seconds)
    answers = await gatherResults([Deferred.fromCoroutine(server.now()) for _ in range(5)])
    assert answers == [T0] * 5
    assert _reads(db) == 1


@pytest_twisted.ensureDeferred
async def test_a_caller_that_goes_away_does_not_cancel_the_read(pinned):
    db, clock = pinned
    server = DatabaseClock(db, elapsed=clock.seconds)
    gone = Deferred.fromCoroutine(server.now())
    stays = Deferred.fromCoroutine(server.now())
    gone.cancel()
    assert await stays == T0
    assert gone.called


@pytest_twisted.ensureDeferred
async def test_the_server_is_read_again_after_the_resample_period(pinned):
    """A server whose clock moved against ours (stepped, slewed) is followed
    within one period; the call that finds the sample old answers from it and
    reads again beside it."""
    db, clock = pinned
    server = DatabaseClock(db, elapsed=clock.seconds)
    assert await server.now() == T0
    db.engine.clock = shifted = Clock()
    shifted.advance(T0 + 500)  # the server's clock, now 500 s ahead of ours
    clock.advance(RESAMPLE - 1)
    assert await server.now() == T0 + RESAMPLE - 1
    assert _reads(db) == 1
    clock.advance(1)
    assert await server.now() == T0 + RESAMPLE  # still the old sample
    await _until_read(db, 2)
    assert await server.now() == T0 + 500


@pytest_twisted.ensureDeferred
async def test_a_new_connection_is_a_reason_to_read_again(pinned):
    """A reconnect may have reached another server, with its own clock."""
    db, clock = pinned
    server = DatabaseClock(db, elapsed=clock.seconds)
    assert await server.now() == T0
    db.engine.clock = shifted = Clock()
    shifted.advance(T0 - 300)
    db.connections_opened += 1  # as the pool's open function counts them
    await server.now()
    await _until_read(db, 2)
    assert await server.now() == T0 - 300


@pytest_twisted.ensureDeferred
async def test_the_pool_counts_the_connections_it_opens(mariadb, worker_db):
    db = Database.mysql(mariadb.settings(worker_db), reactor, name="clocktest")
    try:
        assert db.connections_opened == 0
        await db.run("one", lambda txn: txn.execute("SELECT 1"))
        assert db.connections_opened >= 1
    finally:
        db.close()


async def _until_read(db: Database, reads: int) -> None:
    """The background read has come back (bounded: 5 s of reactor turns)."""
    for _ in range(500):
        if _reads(db) >= reads:
            return
        await deferLater(reactor, 0.01)
    raise AssertionError("the server's clock was not read again")


@pytest_twisted.ensureDeferred
async def test_a_read_that_waits_for_a_thread_counts_from_when_it_was_asked(pinned):
    """The pinned server answers the time the read was asked at: a read that
    waits for a pool thread while the test moves the clock on must not count
    from when the thread got to it (every later "now" would be behind)."""
    db, clock = pinned
    server = DatabaseClock(db, elapsed=clock.seconds)
    assert await server.now() == T0
    # Every pool thread busy until released, so the read below waits in line.
    release = threading.Event()
    started = threading.Semaphore(0)
    threads = db.pool.threadpool.max

    def hold(txn):
        started.release()
        release.wait(30)

    held = [Deferred.fromCoroutine(db.run("hold", hold)) for _ in range(threads)]
    for _ in range(threads):
        assert await deferToThread(started.acquire, True, 30)
    db.connections_opened += 1  # a reason to read again, in the background
    assert await server.now() == T0
    clock.advance(5)  # while the read waits for a thread
    release.set()
    await gatherResults(held)
    await _until_read(db, 2)
    assert await server.now() == T0 + 5
