"""RedisTaskStore against the session's real redis-server.

Each test gets its own key prefix; "now" comes from a ``task.Clock`` set to a
realistic epoch, so expiry is decided by advancing it, never by sleeping.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import pytest_twisted
from twisted.internet import task

from gorge.db.clock import HostTime
from gorge.db.redis import make_redis
from gorge.taskqueue.model import (
    RESULT_CANCELLED,
    RESULT_FAILURE,
    RESULT_SUCCESS,
    UINT32_MAX,
    YIELD_OWNER,
    EnqueueRequest,
    InvalidArgument,
    Stats,
)
from gorge.taskqueue.redis import RedisTaskStore
from gorge.taskqueue.redis_layout import member
from gorge.taskqueue.store import TaskNotFound, TaskStore

pytestmark = pytest.mark.integration

T0 = 1_700_000_000
LEASE = 7200


@pytest.fixture
def clock() -> task.Clock:
    c = task.Clock()
    c.advance(T0)
    return c


@pytest.fixture
def conn(redis_server):
    c = make_redis(replace(redis_server.settings(), poolsize=1))
    yield c
    pytest_twisted.blockon(c.disconnect())


@pytest.fixture
def store(conn, clock, redis_prefix) -> RedisTaskStore:
    return RedisTaskStore(conn, clock=clock, time=HostTime(clock), key_prefix=redis_prefix)


@pytest.fixture
def sync(redis_server):
    with redis_server.client() as client:
        yield client


def keys_of(sync, store: RedisTaskStore) -> set[bytes]:
    return set(sync.execute("KEYS", store.keys.base + "*"))


def req(task_class: str = "C", **kw) -> EnqueueRequest:
    return EnqueueRequest(task_class=task_class, **kw)


def test_store_implements_the_interface(store):
    assert isinstance(store, TaskStore)


# -- enqueue -----------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_enqueue_writes_hash_payload_and_indexes(store, sync):
    t = await store.enqueue(
        req("PhabricatorSearchWorker", data='{"x":1}', priority=3500, object_phid="PHID-X")
    )
    assert (t.id, t.data_id, t.failure_count, t.priority) == (1, 1, 0, 3500)
    assert t.lease_owner is None and t.lease_expires is None and t.data is None
    assert t.date_created == t.date_modified == T0
    k = store.keys
    raw = sync.execute("HGETALL", k.task(1))
    fields = dict(zip(raw[::2], raw[1::2], strict=True))
    assert fields[b"leaseOwner"] == b"" and fields[b"failureTime"] == b""
    assert fields[b"containerPHID"] == b"" and fields[b"objectPHID"] == b"PHID-X"
    assert sync.execute("GET", k.data(1)) == b'{"x":1}'
    assert sync.execute("ZSCORE", k.active, member(1)) == b"3500"
    assert sync.execute("ZSCORE", k.unleased, member(1)) == b"3500"
    assert sync.execute("ZSCORE", k.leased, member(1)) is None
    second = await store.enqueue(req())
    assert (second.id, second.data_id) == (2, 2)
    got = await store.get_task(1)
    assert got.data == '{"x":1}' and got.object_phid == "PHID-X" and got.container_phid is None


@pytest_twisted.ensureDeferred
async def test_delayed_task_is_not_leased_until_the_delay_has_passed(store, clock, sync):
    t = await store.enqueue(req(delay_until=T0 + 60))
    assert t.lease_expires == T0 + 60
    assert sync.execute("ZSCORE", store.keys.leased, member(t.id)) == str(T0 + 60).encode()
    assert sync.execute("ZSCORE", store.keys.unleased, member(t.id)) is None
    assert await store.lease("w", 10, LEASE) == []
    clock.advance(60)  # expiry is strict: leaseExpires == now is not expired
    assert await store.lease("w", 10, LEASE) == []
    clock.advance(1)
    [leased] = await store.lease("w", 10, LEASE)
    assert leased.id == t.id


# -- lease -------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_lease_phase1_orders_by_priority_then_id_and_keeps_date_modified(store, clock):
    for prio in (3000, 1000, 3000, 2000, 1000):
        await store.enqueue(req(data=f"p{prio}", priority=prio))
    clock.advance(5)
    got = await store.lease("owner-1", 3, LEASE)
    assert [(t.priority, t.id) for t in got] == [(1000, 2), (1000, 5), (2000, 4)]
    for t in got:
        assert t.lease_owner == "owner-1" and t.lease_expires == T0 + 5 + LEASE
        assert t.date_modified == T0  # a lease never bumps dateModified
        assert t.data == f"p{t.priority}"
    rest = await store.lease("owner-2", 10, LEASE)
    assert [t.id for t in rest] == [1, 3]  # never returns what an earlier call claimed
    assert await store.lease("owner-1", 10, LEASE) == []


@pytest_twisted.ensureDeferred
async def test_lease_phase2_takes_expired_strictly_before_now_by_priority(store, clock):
    a = await store.enqueue(req(priority=2000))
    b = await store.enqueue(req(priority=1000))
    await store.lease("crashed", 2, 100)
    clock.advance(100)  # leaseExpires == now: still held
    assert await store.lease("w", 5, LEASE) == []
    clock.advance(1)
    fresh = await store.enqueue(req(priority=4000))
    got = await store.lease("w", 5, LEASE)
    # The phase-1 task and the phase-2 tasks are returned in queue order.
    assert [t.id for t in got] == [b.id, a.id, fresh.id]
    assert {t.lease_owner for t in got} == {"w"}


@pytest_twisted.ensureDeferred
async def test_lease_phase2_only_fills_what_phase1_left(store, clock):
    old = await store.enqueue(req(priority=1000))
    await store.lease("crashed", 1, 10)
    clock.advance(11)
    new = await store.enqueue(req(priority=4000))
    [first] = await store.lease("w", 1, LEASE)
    assert first.id == new.id  # phase 1 first even though the expired one is more urgent
    [second] = await store.lease("w", 1, LEASE)
    assert second.id == old.id


@pytest_twisted.ensureDeferred
async def test_lease_class_filter_touches_nothing_else(store, sync):
    others = [await store.enqueue(req("Other", priority=1000)) for _ in range(250)]
    wanted = await store.enqueue(req("Wanted", priority=4000))
    before = sync.execute("HGETALL", store.keys.task(others[0].id))
    got = await store.lease("w", 5, LEASE, task_classes=["Wanted", "Missing"])
    assert [t.id for t in got] == [wanted.id]
    assert sync.execute("HGETALL", store.keys.task(others[0].id)) == before
    assert sync.execute("ZCARD", store.keys.unleased) == 250
    assert (await store.stats()).leased == 1
    assert len(await store.lease("w", 1000, LEASE, task_classes=[])) == 250


@pytest_twisted.ensureDeferred
async def test_lease_of_missing_payload_returns_empty_data(store, sync):
    t = await store.enqueue(req(data="gone"))
    sync.execute("DEL", store.keys.data(t.data_id))
    [got] = await store.lease("w", 1, LEASE)
    assert got.data == ""


@pytest_twisted.ensureDeferred
async def test_lease_expiry_out_of_range_writes_nothing(store, sync):
    await store.enqueue(req())
    before = keys_of(sync, store)
    with pytest.raises(InvalidArgument):
        await store.lease("w", 1, UINT32_MAX)
    assert keys_of(sync, store) == before
    assert sync.execute("ZCARD", store.keys.unleased) == 1


# -- complete / fail / cancel --------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_complete_archives_atomically_and_replays_idempotently(store, clock, sync):
    t = await store.enqueue(req(data="payload", object_phid="PHID-O"))
    await store.lease("w", 1, LEASE)
    clock.advance(30)
    archived = await store.complete(t.id, 1234)
    assert archived.result == RESULT_SUCCESS and archived.duration == 1234
    assert archived.lease_owner == "w" and archived.lease_expires == T0 + LEASE
    assert archived.date_modified == archived.archived_epoch == T0 + 30
    assert archived.date_created == T0 and archived.object_phid == "PHID-O"
    assert "failureTime" not in archived.to_json() and "data" not in archived.to_json()
    k = store.keys
    assert sync.execute("EXISTS", k.task(t.id)) == 0
    assert sync.execute("EXISTS", k.data(t.data_id)) == 0  # moved into the archive record
    assert sync.execute("HGET", k.archived(t.id), "data") == b"payload"
    for index in (k.active, k.unleased, k.leased):
        assert sync.execute("ZSCORE", index, member(t.id)) is None
    assert await store.get_archived(t.id) == archived
    snapshot = {key: sync.execute("DUMP", key) for key in keys_of(sync, store)}
    clock.advance(30)
    assert await store.complete(t.id, 999) == archived  # replay: first answer, nothing written
    assert {key: sync.execute("DUMP", key) for key in keys_of(sync, store)} == snapshot
    assert await store.stats() == Stats(active=0, leased=0, archived=1, failed=0)
    with pytest.raises(TaskNotFound):
        await store.get_task(t.id)


@pytest_twisted.ensureDeferred
async def test_complete_keeps_duration_beyond_double_precision(store):
    t = await store.enqueue(req())
    huge = 2**64 - 1
    assert (await store.complete(t.id, huge)).duration == huge


@pytest_twisted.ensureDeferred
async def test_archive_calls_on_unknown_or_archived_ids_are_404_and_write_nothing(store, sync):
    cancelled = await store.enqueue(req())
    await store.cancel(cancelled.id)
    before = {key: sync.execute("DUMP", key) for key in keys_of(sync, store)}
    for call in (
        lambda: store.complete(cancelled.id, 0),  # replay only for result 0
        lambda: store.complete(999, 0),
        lambda: store.cancel(cancelled.id),
        lambda: store.cancel(999),
        lambda: store.fail(999, True, 0),
        lambda: store.fail(999, False, 10),
        lambda: store.fail(cancelled.id, False, 10),
        lambda: store.yield_(999, 30),
        lambda: store.get_task(999),
    ):
        with pytest.raises(TaskNotFound):
            await call()
    assert {key: sync.execute("DUMP", key) for key in keys_of(sync, store)} == before
    assert await store.get_archived(999) is None


@pytest_twisted.ensureDeferred
async def test_temporary_fail_backs_off_and_counts_failed_once(store, clock, sync):
    t = await store.enqueue(req())
    await store.lease("w", 1, LEASE)
    clock.advance(10)
    updated = await store.fail(t.id, False, 60)
    assert updated.failure_count == 1 and updated.failure_time == T0 + 10
    assert updated.lease_owner is None and updated.lease_expires == T0 + 70
    assert updated.date_modified == T0 + 10 and updated.data is None
    assert sync.execute("ZSCORE", store.keys.leased, member(t.id)) == str(T0 + 70).encode()
    assert await store.stats() == Stats(active=1, leased=0, archived=0, failed=1)
    clock.advance(60)
    assert await store.lease("w", 1, LEASE) == []  # back-off ends strictly after
    clock.advance(1)
    [again] = await store.lease("w2", 1, LEASE)
    assert again.failure_count == 1 and again.lease_owner == "w2"
    await store.fail(t.id, False, 0)
    assert (await store.stats()).failed == 1  # a task counts once, however often it failed
    archived = await store.fail(t.id, True, 0)
    assert archived.result == RESULT_FAILURE and archived.duration == 0
    assert archived.failure_count == 2
    assert await store.stats() == Stats(active=0, leased=0, archived=1, failed=0)


@pytest_twisted.ensureDeferred
async def test_retry_wait_out_of_range_writes_nothing(store, sync):
    t = await store.enqueue(req())
    before = sync.execute("HGETALL", store.keys.task(t.id))
    with pytest.raises(InvalidArgument):
        await store.fail(t.id, False, UINT32_MAX)
    assert sync.execute("HGETALL", store.keys.task(t.id)) == before


@pytest_twisted.ensureDeferred
async def test_cancel_copies_owner_and_expiry_as_they_stand(store, clock):
    never = await store.enqueue(req())
    held = await store.enqueue(req())
    await store.lease("w", 1, LEASE, task_classes=None)  # takes `never` (lower id)
    clock.advance(3)
    a = await store.cancel(held.id)
    assert a.result == RESULT_CANCELLED and a.lease_owner is None and a.lease_expires is None
    b = await store.cancel(never.id)
    assert b.lease_owner == "w" and b.lease_expires == T0 + LEASE
    assert (await store.stats()).archived == 2


# -- yield / awaken ----------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_yield_is_held_then_expires_and_never_creates_ghosts(store, clock, sync):
    t = await store.enqueue(req())
    await store.lease("w", 1, LEASE)
    clock.advance(2)
    await store.yield_(t.id, 1)  # raised to the 5 s minimum
    got = await store.get_task(t.id)
    assert got.lease_owner == YIELD_OWNER and got.lease_expires == T0 + 7
    assert got.date_modified == T0 + 2 and got.failure_count == 0
    assert (await store.stats()).leased == 1  # a yield inside its window is held
    assert await store.lease("x", 1, LEASE) == []
    clock.advance(6)
    [back] = await store.lease("x", 1, LEASE)
    assert back.id == t.id
    before = keys_of(sync, store)
    with pytest.raises(TaskNotFound):
        await store.yield_(4242, 30)
    assert keys_of(sync, store) == before
    assert sync.execute("ZSCORE", store.keys.leased, member(4242)) is None


@pytest_twisted.ensureDeferred
async def test_awaken_makes_recent_unfailed_yields_leasable_in_phase2(store, clock, sync):
    yielded = await store.enqueue(req(priority=3000))
    failed = await store.enqueue(req(priority=3000))
    plain = await store.enqueue(req(priority=3000))
    await store.lease("w", 3, LEASE)
    await store.fail(failed.id, False, 0)
    await store.lease("w", 3, LEASE)
    clock.advance(2)
    await store.yield_(yielded.id, 600)
    await store.yield_(failed.id, 600)
    fresh = await store.enqueue(req(priority=1000))
    n = await store.awaken([yielded.id, yielded.id, failed.id, plain.id, 31337])
    assert n == 1
    got = await store.get_task(yielded.id)
    now = T0 + 2
    assert got.lease_owner == YIELD_OWNER and got.lease_expires == now - 3600
    # Kept in the leased index with the new score, never in the unleased one.
    assert sync.execute("ZSCORE", store.keys.leased, member(yielded.id)) == str(now - 3600).encode()
    assert sync.execute("ZSCORE", store.keys.unleased, member(yielded.id)) is None
    assert (await store.get_task(failed.id)).lease_expires == now + 600
    assert await store.awaken([yielded.id]) == 0  # already outside the window
    assert [t.id for t in await store.lease("x", 5, LEASE)] == [fresh.id, yielded.id]


# -- reads -------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_stats_count_only_held_tasks_as_leased(store, clock):
    delayed = await store.enqueue(req(delay_until=T0 + 1000))  # owner NULL, future expiry
    backoff = await store.enqueue(req())
    crashed = await store.enqueue(req())
    held = await store.enqueue(req())
    await store.enqueue(req())  # waiting
    await store.lease("w", 3, LEASE, task_classes=None)
    await store.fail(backoff.id, False, 500)
    await store.yield_(crashed.id, 5)  # will be expired below
    clock.advance(10)
    s = await store.stats()
    assert s == Stats(active=5, leased=1, archived=0, failed=1)
    assert (await store.get_task(held.id)).is_held(T0 + 10)
    assert delayed.lease_expires == T0 + 1000


@pytest_twisted.ensureDeferred
async def test_list_pages_in_queue_order_without_payload(store):
    for prio in (5, 3, 5, 1, 3):
        await store.enqueue(req(data="secret", priority=prio))
    listed = await store.list_tasks(100, 0)
    assert [(t.priority, t.id) for t in listed] == [(1, 4), (3, 2), (3, 5), (5, 1), (5, 3)]
    assert all(t.data is None for t in listed)
    assert [t.id for t in await store.list_tasks(2, 1)] == [2, 5]
    assert await store.list_tasks(10, 5) == []


@pytest_twisted.ensureDeferred
async def test_fifo_order_is_exact_for_every_unsigned_32_bit_priority(store):
    """Priority × 10^12 + id would collapse these in a double."""
    top = UINT32_MAX
    ids = [(await store.enqueue(req(priority=p))).id for p in (top, top, top - 1, top, 9001, 9001)]
    expected = [ids[4], ids[5], ids[2], ids[0], ids[1], ids[3]]
    assert [t.id for t in await store.list_tasks(10, 0)] == expected
    assert [t.id for t in await store.lease("w", 10, LEASE)] == expected


@pytest_twisted.ensureDeferred
async def test_archive_retention_prunes_old_records_and_their_replays(
    conn, clock, redis_prefix, sync
):
    store = RedisTaskStore(
        conn, clock=clock, time=HostTime(clock), key_prefix=redis_prefix, archive_retention=100
    )
    old = await store.enqueue(req())
    new = await store.enqueue(req())
    await store.complete(old.id, 1)
    clock.advance(100)
    await store.cancel(new.id)  # old is exactly at the cutoff: kept
    assert (await store.stats()).archived == 2
    third = await store.enqueue(req())
    clock.advance(1)
    await store.complete(third.id, 1)
    assert await store.stats() == Stats(active=0, leased=0, archived=2, failed=0)
    assert sync.execute("EXISTS", store.keys.archived(old.id)) == 0
    assert sync.execute("GET", store.keys.counter_archived) == b"2"
    assert await store.get_archived(old.id) is None
    with pytest.raises(TaskNotFound):
        await store.complete(old.id, 1)  # too old to replay
    assert (await store.complete(third.id, 7)).duration == 1
