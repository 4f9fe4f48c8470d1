"""RedisTaskStore as a whole: parallel leasing, laziness, bounded waits, and the
same observable behaviour as the in-memory model for any operation sequence."""

from __future__ import annotations

from dataclasses import replace

import pytest
import pytest_twisted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet import defer, task

from gorge.db.clock import HostTime
from gorge.db.redis import RedisSettings, make_redis
from gorge.taskqueue.memory import MemoryTaskStore
from gorge.taskqueue.model import UINT32_MAX, EnqueueRequest, InvalidArgument
from gorge.taskqueue.redis import RedisTaskStore
from gorge.taskqueue.store import TaskNotFound
from gorge_testing.procs import free_port

T0 = 1_700_000_000


def _clock() -> task.Clock:
    c = task.Clock()
    c.advance(T0)
    return c


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_four_parallel_leasers_split_a_thousand_tasks_exactly(redis_server, redis_prefix):
    clock = _clock()
    conns = [make_redis(replace(redis_server.settings(), poolsize=1)) for _ in range(4)]
    stores = [
        RedisTaskStore(c, clock=clock, time=HostTime(clock), key_prefix=redis_prefix) for c in conns
    ]
    try:
        created = await defer.gatherResults(
            [
                defer.Deferred.fromCoroutine(
                    stores[i % 4].enqueue(EnqueueRequest("C", priority=i % 7))
                )
                for i in range(1000)
            ]
        )
        assert len({t.id for t in created}) == 1000

        async def drain(store: RedisTaskStore, owner: str) -> list[int]:
            won: list[int] = []
            while batch := await store.lease(owner, 23, 7200):
                assert {t.lease_owner for t in batch} == {owner}
                won += [t.id for t in batch]
            return won

        results = await defer.gatherResults(
            [defer.Deferred.fromCoroutine(drain(s, f"w{i}")) for i, s in enumerate(stores)]
        )
    finally:
        await defer.gatherResults([c.disconnect() for c in conns])
    every = [i for won in results for i in won]
    assert len(every) == len(set(every)) == 1000  # disjoint, nothing twice
    assert set(every) == {t.id for t in created}
    assert sum(1 for won in results if won) >= 2  # they really competed


@pytest_twisted.ensureDeferred
async def test_dead_server_costs_nothing_at_start_and_every_wait_is_bounded():
    clock = _clock()
    conn = make_redis(RedisSettings(host="127.0.0.1", port=free_port(), connect_timeout=1))
    store = RedisTaskStore(
        conn, clock=clock, time=HostTime(clock), key_prefix="dead:", op_timeout=10, ping_timeout=5
    )
    try:
        ping = defer.Deferred.fromCoroutine(store.ping())
        stats = defer.Deferred.fromCoroutine(store.stats())
        assert not ping.called and not stats.called
        clock.advance(5)
        assert await ping == "redis ping timed out"
        assert not stats.called
        clock.advance(5)
        with pytest.raises(defer.TimeoutError):
            await stats
    finally:
        await conn.disconnect()


# -- differential test against the in-memory model --------------------------------

_ids = st.integers(min_value=1, max_value=8)
_ops = st.one_of(
    st.tuples(
        st.just("enqueue"),
        st.sampled_from(["A", "B"]),
        st.sampled_from([0, 1000, 2000, UINT32_MAX]),
        st.sampled_from([None, "past", "soon"]),
        st.sampled_from(["", "{}", "payload ü"]),
    ),
    st.tuples(
        st.just("lease"),
        st.sampled_from(["w1", "w2"]),
        st.integers(1, 4),
        st.sampled_from([5, 60, UINT32_MAX]),
        st.sampled_from([None, (), ("A",), ("B", "Z")]),
    ),
    st.tuples(st.just("complete"), _ids, st.integers(0, 2**64 - 1)),
    st.tuples(st.just("fail"), _ids, st.booleans(), st.sampled_from([0, 3, 30, UINT32_MAX])),
    st.tuples(st.just("yield_"), _ids, st.sampled_from([-1, 0, 5, 20, UINT32_MAX])),
    st.tuples(st.just("cancel"), _ids),
    st.tuples(st.just("awaken"), st.lists(_ids, min_size=1, max_size=4)),
    st.tuples(st.just("advance"), st.sampled_from([1, 4, 5, 30, 4000])),
    st.tuples(st.just("stats")),
    st.tuples(st.just("list_tasks"), st.integers(1, 5), st.integers(0, 4)),
    st.tuples(st.just("get_task"), _ids),
    st.tuples(st.just("get_archived"), _ids),
)


async def _apply(store, clock: task.Clock, op: tuple):
    name, *args = op
    if name == "advance":
        clock.advance(args[0])
        return None
    if name == "enqueue":
        task_class, priority, delay, data = args
        now = int(clock.seconds())
        delay_until = {None: None, "past": now - 10, "soon": now + 5}[delay]
        return await store.enqueue(
            EnqueueRequest(task_class, data=data, priority=priority, delay_until=delay_until)
        )
    try:
        return await getattr(store, name)(*args)
    except (TaskNotFound, InvalidArgument) as e:
        return (type(e).__name__, getattr(e, "field", None))


@pytest.mark.integration
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(_ops, min_size=1, max_size=30))
@pytest_twisted.ensureDeferred
async def test_behaves_like_the_in_memory_model(redis_server, ops):
    clock = _clock()
    model = MemoryTaskStore(clock)
    conn = make_redis(replace(redis_server.settings(), poolsize=1))
    store = RedisTaskStore(
        conn, clock=clock, time=HostTime(clock), key_prefix=redis_server.unique_prefix("diff")
    )
    try:
        for step, op in enumerate(ops):
            expected = await _apply(model, clock, op)
            if op[0] == "advance":
                continue
            got = await _apply(store, clock, op)
            assert got == expected, (step, op)
        assert await store.stats() == await model.stats()
        assert await store.list_tasks(100, 0) == await model.list_tasks(100, 0)
    finally:
        await conn.disconnect()
