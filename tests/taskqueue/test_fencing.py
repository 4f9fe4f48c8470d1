"""Fenced result reports on every backend: a holder whose lease expired and was
taken over can no longer complete, fail or yield the task (409), while
unfenced reports keep the r4 behaviour (docs/taskqueue.md, Lease fencing)."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, DeferredList

from gorge.taskqueue.memory import MemoryTaskStore
from gorge.taskqueue.model import YIELD_OWNER, EnqueueRequest
from gorge.taskqueue.store import LeaseConflict, TaskNotFound
from tests.taskqueue.helpers import Client

LEASE = 60
STALE, FRESH = "host-a:1:100:gorge-worker", "host-b:2:200:gorge-worker"


async def _taken_over(store, clock, n: int = 1) -> list[int]:
    """``n`` tasks leased by STALE, expired, then leased by FRESH."""
    ids = [(await store.enqueue(EnqueueRequest("A", f'{{"i":{i}}}'))).id for i in range(n)]
    assert [t.id for t in await store.lease(STALE, n, LEASE)] == ids
    clock.advance(LEASE + 1)
    assert [t.id for t in await store.lease(FRESH, n, LEASE)] == ids
    return ids


async def _raises(exc_type, coro) -> None:
    with pytest.raises(exc_type):
        await coro


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_stale_holder_is_refused_and_changes_nothing(backend_store, clock):
    (task_id,) = await _taken_over(backend_store, clock)
    before = await backend_store.get_task(task_id)
    await _raises(LeaseConflict, backend_store.complete(task_id, 5, STALE))
    await _raises(LeaseConflict, backend_store.fail(task_id, True, 0, STALE))
    await _raises(LeaseConflict, backend_store.fail(task_id, False, 30, STALE))
    await _raises(LeaseConflict, backend_store.yield_(task_id, 30, STALE))
    # Refused before the range check of the computed expiry, as an unknown id is.
    await _raises(LeaseConflict, backend_store.fail(task_id, False, 2**32, STALE))
    assert await backend_store.get_task(task_id) == before
    assert await backend_store.get_archived(task_id) is None
    # The holder reports; a replay by it is still a success, by anyone else a conflict.
    done = await backend_store.complete(task_id, 7, FRESH)
    assert done.lease_owner == FRESH and done.duration == 7
    assert await backend_store.complete(task_id, 9, FRESH) == done
    assert await backend_store.complete(task_id, 9) == done  # unfenced replay
    await _raises(LeaseConflict, backend_store.complete(task_id, 9, STALE))
    await _raises(LeaseConflict, backend_store.yield_(task_id, 9, FRESH))
    await _raises(TaskNotFound, backend_store.complete(task_id + 100, 9, FRESH))
    assert (await backend_store.stats()).archived == 1


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_fenced_fail_and_yield_by_the_holder_behave_as_unfenced(backend_store, clock):
    a, b = await _taken_over(backend_store, clock, 2)
    failed = await backend_store.fail(a, False, 30, FRESH)
    assert (failed.failure_count, failed.lease_owner) == (1, None)
    # The owner is cleared by the failure: the holder has let go of it.
    await _raises(LeaseConflict, backend_store.fail(a, False, 30, FRESH))
    await backend_store.yield_(b, 30, FRESH)
    assert (await backend_store.get_task(b)).lease_owner == YIELD_OWNER
    await _raises(LeaseConflict, backend_store.yield_(b, 30, FRESH))
    # An expired lease nobody took over still belongs to its holder.
    clock.advance(31)
    (again,) = await backend_store.lease(FRESH, 1, LEASE)
    clock.advance(LEASE + 5)
    archived = await backend_store.fail(again.id, True, 0, FRESH)
    assert archived.result == 1


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_cancelled_while_running_refuses_the_holder(backend_store, clock):
    (task,) = [await backend_store.enqueue(EnqueueRequest("A"))]
    await backend_store.lease(STALE, 1, LEASE)
    await backend_store.cancel(task.id)
    await _raises(LeaseConflict, backend_store.complete(task.id, 1, STALE))
    await _raises(TaskNotFound, backend_store.complete(task.id, 1))  # r4: not a success


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_race_between_stale_completes_and_the_new_holder(backend_store, clock):
    """Two holders, an expiry in between: each stale complete races the new
    holder's lease and complete.  Whatever the interleaving, every task ends
    with exactly one archive row, exactly one report succeeded, and a stale
    report that lost got 409."""
    n = 24
    ids = [(await backend_store.enqueue(EnqueueRequest("A", str(i)))).id for i in range(n)]
    assert len(await backend_store.lease(STALE, n, LEASE)) == n
    clock.advance(LEASE + 1)
    stale_results: dict[int, str] = {}
    fresh_won: list[int] = []

    async def stale(task_id: int) -> None:
        try:
            await backend_store.complete(task_id, 1, STALE)
            stale_results[task_id] = "ok"
        except LeaseConflict:
            stale_results[task_id] = "conflict"

    async def fresh() -> None:
        while True:
            batch = await backend_store.lease(FRESH, 3, LEASE)
            if not batch:
                return
            for task in batch:
                await backend_store.complete(task.id, 2, FRESH)
                fresh_won.append(task.id)

    # Started in this order, so the new holder's first lease is queued
    # behind some stale completes and ahead of the others.
    calls = []
    for k, task_id in enumerate(ids):
        if k in (n // 4, n // 2):
            calls.append(Deferred.fromCoroutine(fresh()))
        calls.append(Deferred.fromCoroutine(stale(task_id)))
    await DeferredList(calls, fireOnOneErrback=True, consumeErrors=True)
    # A stale complete that came first archived the task; the rest lost to FRESH.
    won_by_stale = {i for i, r in stale_results.items() if r == "ok"}
    assert won_by_stale.isdisjoint(fresh_won)
    assert won_by_stale | set(fresh_won) == set(ids)
    assert len(fresh_won) == len(set(fresh_won))
    assert {i for i, r in stale_results.items() if r == "conflict"} == set(fresh_won)
    stats = await backend_store.stats()
    assert (stats.active, stats.archived) == (0, n)
    for task_id in ids:
        row = await backend_store.get_archived(task_id)
        assert row.result == 0
        assert row.lease_owner == (STALE if task_id in won_by_stale else FRESH)


@pytest_twisted.ensureDeferred
async def test_owner_comes_from_header_or_body_and_409_is_enveloped(clock):
    store = MemoryTaskStore(clock)
    client = Client(store, clock)
    await client.post("enqueue", {"taskClass": "A"})
    await client.post("lease", {"limit": 1}, headers={"X-Lease-Owner": STALE})
    clock.advance(7201)
    await client.post("lease", {"limit": 1}, headers={"X-Lease-Owner": FRESH})
    conflict = {
        "error": {
            "code": "ERR_LEASE_CONFLICT",
            "message": "task lease no longer belongs to this owner",
        }
    }
    assert await client.post("complete", {"taskID": 1}, headers={"X-Lease-Owner": STALE}) == (
        409,
        conflict,
    )
    assert await client.post("fail", {"taskID": 1, "leaseOwner": STALE}) == (409, conflict)
    assert await client.post("yield", {"taskID": 1, "leaseOwner": STALE, "duration": 30}) == (
        409,
        conflict,
    )
    code, answer = await client.post(
        "complete", {"taskID": 1, "leaseOwner": STALE}, headers={"X-Lease-Owner": FRESH}
    )
    assert (code, answer["error"]["code"]) == (400, "ERR_BAD_REQUEST")
    assert "different owners" in answer["error"]["message"]
    code, answer = await client.post("complete", {"taskID": 1, "leaseOwner": "x" * 65})
    assert (code, answer["error"]["message"]) == (400, "leaseOwner must be at most 64 characters")
    code, answer = await client.post("complete", {"taskID": 1, "leaseOwner": 7})
    assert (code, answer["error"]["message"]) == (400, "leaseOwner must be a string")
    assert (await client.get("stats"))[1]["data"]["archivedCount"] == 0
    code, answer = await client.post("complete", {"taskID": 1, "leaseOwner": FRESH, "duration": 3})
    assert code == 200 and answer["data"]["leaseOwner"] == FRESH
    # Empty owner is no owner: the r4 replay answers the archived row.
    assert (await client.post("complete", {"taskID": 1, "leaseOwner": ""}))[0] == 200
