"""The queue's host clock 10 minutes ahead of or behind the database's
(docs/taskqueue.md, Clocks): on MySQL every lease, expiry, yield and retry
time is the database's, as Phorge's ``UNIX_TIMESTAMP()`` makes it, so no
lease is handed out already expired, none is taken early or kept late, and
tasks still run. On Redis the same times are the server's ``TIME``.

Two kinds of database clock: the real one (compared with
``SELECT UNIX_TIMESTAMP()`` on a connection of the test's own, within the
second a sample of the clock may be off by at a second boundary), and one
pinned to an injected clock (MariaDB's session ``timestamp``), which lets a
test move the database's time past an expiry and compare exactly.
"""

from __future__ import annotations

import pymysql
import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.task import Clock, deferLater

from gorge.db.clock import DatabaseClock
from gorge.db.mysql import make_pool
from gorge.taskqueue.model import YIELD_OWNER, EnqueueRequest
from gorge.taskqueue.mysql import MySQLTaskStore
from gorge.taskqueue.wakeup import LeaseWaiters

pytestmark = pytest.mark.integration

SKEWS = [-600, 600]
T0 = 1_795_947_000
LEASE = 60
# Seconds of the real reactor a wake-up may take to come (a bound, not a timing).
BOUND = 10


class SkewedClock:
    """The host's clock ``offset`` seconds off: timers as the reactor's."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def seconds(self) -> float:
        return reactor.seconds() + self.offset

    def callLater(self, delay, f, *args, **kwargs) -> IDelayedCall:
        return reactor.callLater(delay, f, *args, **kwargs)

    def getDelayedCalls(self):
        return reactor.getDelayedCalls()


class Direct:
    """A connection of the test's own, as Phorge's ``bin/worker`` would read."""

    def __init__(self, mariadb, database: str) -> None:
        self.conn = mariadb.connect(database)

    def one(self, sql: str, args=()):
        with self.conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute(sql, args)
            return cur.fetchone()

    def db_now(self) -> int:
        return int(self.one("SELECT UNIX_TIMESTAMP() AS now")["now"])

    def active(self, task_id: int) -> dict:
        return self.one("SELECT * FROM worker_activetask WHERE id = %s", (task_id,))

    def archived(self, task_id: int) -> dict:
        return self.one("SELECT * FROM worker_archivetask WHERE id = %s", (task_id,))

    def leasable_at(self, at: float) -> list[int]:
        """What Phorge's lease query (phase 2) finds expired, the database's
        clock set to ``at``."""
        with self.conn.cursor() as cur:
            cur.execute("SET timestamp = %s", (at,))
            cur.execute("SELECT id FROM worker_activetask WHERE leaseExpires < UNIX_TIMESTAMP()")
            ids = [int(row[0]) for row in cur.fetchall()]
            cur.execute("SET timestamp = DEFAULT")
        return ids

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def direct(mariadb, worker_db):
    d = Direct(mariadb, worker_db)
    yield d
    d.close()


def _store(mariadb, worker_db, host, db_clock=None) -> MySQLTaskStore:
    return MySQLTaskStore(
        make_pool(mariadb.settings(worker_db), reactor), host, reactor=reactor, db_clock=db_clock
    )


def _within(value: int | None, low: int, high: int) -> bool:
    # One second each way: the store's sample of the server's clock may sit
    # on the other side of a second boundary from the test's own reads.
    return value is not None and low - 1 <= value <= high + 1


@pytest.mark.parametrize("skew", SKEWS)
@pytest_twisted.ensureDeferred
async def test_times_written_are_the_database_clock(mariadb, worker_db, direct, skew):
    store = _store(mariadb, worker_db, SkewedClock(skew))
    try:
        ids = [(await store.enqueue(EnqueueRequest("A"))).id for _ in range(4)]
        before = direct.db_now()
        leased = await store.lease("w", 4, LEASE)
        after = direct.db_now()
        assert sorted(t.id for t in leased) == ids
        for task in leased:
            assert task.lease_expires is not None
            assert _within(task.lease_expires, before + LEASE, after + LEASE)
        # Not one of them is expired for Phorge the moment it was handed out.
        assert direct.leasable_at(after) == []

        yielded, failed, done, renewed = ids
        before = direct.db_now()
        await store.yield_(yielded, 300, owner="w")
        await store.fail(failed, False, 120, owner="w")
        await store.complete(done, 5, owner="w")
        assert (await store.renew("w", [renewed], 90))[renewed] is not None
        after = direct.db_now()

        row = direct.active(yielded)
        assert row["leaseOwner"] == YIELD_OWNER
        assert _within(row["leaseExpires"], before + 300, after + 300)
        assert _within(row["dateModified"], before, after)
        row = direct.active(failed)
        assert row["leaseOwner"] is None and row["failureCount"] == 1
        assert _within(row["leaseExpires"], before + 120, after + 120)
        assert _within(row["failureTime"], before, after)
        row = direct.archived(done)
        assert _within(row["dateModified"], before, after)
        assert _within(row["archivedEpoch"], before, after)
        assert _within(direct.active(renewed)["leaseExpires"], before + 90, after + 90)
        created = await store.enqueue(EnqueueRequest("A"))
        assert _within(created.date_created, after, direct.db_now())
    finally:
        await store.close()


@pytest.mark.parametrize("skew", SKEWS)
@pytest_twisted.ensureDeferred
async def test_no_lease_is_taken_early_or_kept_late(mariadb, worker_db, direct, skew):
    db_clock, host = Clock(), Clock()
    db_clock.advance(T0)
    host.advance(T0 + skew)
    store = _store(mariadb, worker_db, host, db_clock)
    server_clock = store.time
    assert isinstance(server_clock, DatabaseClock)

    async def tick(seconds: float) -> None:
        # Not while the store reads the database's clock in the background:
        # a pinned clock is read when the transaction is sent, the host's
        # stand-in when the statement runs, and both must be the same time.
        await server_clock.settled()
        db_clock.advance(seconds)
        host.advance(seconds)

    try:
        task = await store.enqueue(EnqueueRequest("A"))
        (first,) = await store.lease("first", 1, LEASE)
        assert first.lease_expires == T0 + LEASE
        await tick(LEASE)
        # Phorge's rule: expired strictly before now. Not yet, for either.
        assert await store.lease("second", 1, LEASE) == []
        assert direct.leasable_at(db_clock.seconds()) == []
        await tick(1)
        assert direct.leasable_at(db_clock.seconds()) == [task.id]
        (second,) = await store.lease("second", 1, LEASE)
        assert second.id == task.id and second.lease_expires == T0 + 1 + 2 * LEASE
        # The yield and the retry wait land on the database's time as well.
        await store.yield_(task.id, 300, owner="second")
        assert direct.active(task.id)["leaseExpires"] == T0 + LEASE + 1 + 300
        await tick(300)
        assert await store.lease("third", 1, LEASE) == []
        await tick(1)
        (third,) = await store.lease("third", 1, LEASE)
        await store.fail(task.id, False, 120, owner="third")
        row = direct.active(task.id)
        assert row["failureTime"] == T0 + LEASE + 302
        assert row["leaseExpires"] == T0 + LEASE + 302 + 120
        await tick(121)
        (fourth,) = await store.lease("fourth", 1, LEASE)
        # And the task still runs to its end.
        archived = await store.complete(task.id, 7, owner="fourth")
        assert archived.archived_epoch == T0 + LEASE + 302 + 121
    finally:
        await store.close()


@pytest.mark.parametrize("skew", SKEWS)
@pytest_twisted.ensureDeferred
async def test_held_lease_calls_wake_when_a_lease_expires_at_the_database_time(
    mariadb, worker_db, skew
):
    """The long-poll's shared check looks for leases come due in the
    database's time: a held call wakes when the database's clock passes an
    expiry, not 10 minutes before or after it."""
    db_clock, host = Clock(), Clock()
    db_clock.advance(T0)
    host.advance(T0 + skew)
    store = _store(mariadb, worker_db, host, db_clock)
    server_clock = store.time
    assert isinstance(server_clock, DatabaseClock)
    waiters = LeaseWaiters(store.wake_check, host, 1.0, now=store.time)

    async def tick(seconds: float) -> None:
        await server_clock.settled()
        db_clock.advance(seconds)
        host.advance(seconds)  # runs the shared check when one is due

    try:
        await store.enqueue(EnqueueRequest("A"))
        (leased,) = await store.lease("first", 1, LEASE)
        assert leased.lease_expires == T0 + LEASE
        # The first check always wakes (it has nothing to compare with).
        first = waiters.wait(None, 10_000, waiters.generation)
        await tick(1)
        assert await first.addTimeout(BOUND, reactor) is True
        # The wake-up resumed this test inside the check; one reactor turn
        # lets the check end and arm the next one.
        await deferLater(reactor, 0)
        held = waiters.wait(None, 10_000, waiters.generation)
        await tick(LEASE + 1)  # the database's clock is past the expiry now
        assert await held.addTimeout(BOUND, reactor) is True
        assert [t.id for t in await store.lease("second", 1, LEASE)] == [leased.id]
    finally:
        waiters.close()
        await store.close()


@pytest.mark.parametrize("skew", SKEWS)
@pytest_twisted.ensureDeferred
async def test_redis_times_are_the_server_clock(redis_server, skew):
    """Every time the scripts write, and the expiry they compare with, is
    Redis' TIME, whatever the queue host's clock says."""
    from dataclasses import replace

    from gorge.db.redis import make_redis
    from gorge.taskqueue.redis import RedisTaskStore

    conn = make_redis(replace(redis_server.settings(), poolsize=1))
    store = RedisTaskStore(
        conn, clock=SkewedClock(skew), key_prefix=redis_server.unique_prefix("clock")
    )
    with redis_server.client() as sync:

        def server_now() -> int:
            return int(sync.execute("TIME")[0])

        try:
            ids = [(await store.enqueue(EnqueueRequest("A"))).id for _ in range(4)]
            before = server_now()
            leased = await store.lease("w", 4, LEASE)
            after = server_now()
            assert sorted(t.id for t in leased) == ids
            for task in leased:
                assert task.lease_expires is not None
                assert _within(task.lease_expires, before + LEASE, after + LEASE)
            # None of them can be leased again now: not expired at the server's time.
            assert await store.lease("other", 4, LEASE) == []

            yielded, failed, done, renewed = ids
            before = server_now()
            await store.yield_(yielded, 300, owner="w")
            await store.fail(failed, False, 120, owner="w")
            archived = await store.complete(done, 5, owner="w")
            assert (await store.renew("w", [renewed], 90))[renewed] is not None
            after = server_now()
            got = await store.get_task(yielded)
            assert got.lease_owner == YIELD_OWNER
            assert _within(got.lease_expires, before + 300, after + 300)
            assert _within(got.date_modified, before, after)
            got = await store.get_task(failed)
            assert _within(got.lease_expires, before + 120, after + 120)
            assert _within(got.failure_time, before, after)
            assert _within(archived.archived_epoch, before, after)
            assert _within((await store.get_task(renewed)).lease_expires, before + 90, after + 90)
        finally:
            await store.close()
