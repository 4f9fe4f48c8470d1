"""Phorge's bin/worker verbs as queue operations, on every backend and over
HTTP (docs/taskqueue.md, Operator verbs)."""

from __future__ import annotations

import pytest
import pytest_twisted

from gorge.taskqueue.memory import MemoryTaskStore
from gorge.taskqueue.model import YIELD_OWNER, EnqueueRequest
from gorge.taskqueue.store import LeaseConflict, TaskNotFound, TaskStateError
from tests.taskqueue.conftest import T0
from tests.taskqueue.helpers import Client


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_delay_holds_an_unleased_task_until_its_time(backend_store, clock):
    a = await backend_store.enqueue(EnqueueRequest("A", "a"))
    b = await backend_store.enqueue(EnqueueRequest("A", "b"))
    clock.advance(5)
    delayed = await backend_store.delay(a.id, T0 + 100)
    assert (delayed.lease_owner, delayed.lease_expires, delayed.date_modified) == (
        None,
        T0 + 100,
        T0 + 5,
    )
    assert [t.id for t in await backend_store.lease("w", 5, 600)] == [b.id]
    clock.advance(96)  # T0+101: past the delay
    assert [t.id for t in await backend_store.lease("w", 5, 60)] == [a.id]
    await backend_store.yield_(a.id, 60)
    yielded = await backend_store.delay(a.id, T0 + 200)  # a yield's owner goes too
    assert (yielded.lease_owner, yielded.lease_expires) == (None, T0 + 200)
    await backend_store.cancel(b.id)
    with pytest.raises(TaskStateError, match="task is archived, not active"):
        await backend_store.delay(b.id, T0)
    with pytest.raises(TaskNotFound):
        await backend_store.delay(99, T0)


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_delay_takes_a_running_tasks_lease_away(backend_store, clock):
    """Unlike Phorge's bin/worker (which refuses), a delay of a held task breaks
    its lease: the holder's renewal answers lost and its report is refused,
    and nobody leases it before ``until``, not even the same worker."""
    task = await backend_store.enqueue(EnqueueRequest("A", "a"))
    [held] = await backend_store.lease("w1", 1, 600)
    clock.advance(2)
    delayed = await backend_store.delay(task.id, T0 + 50)
    assert (delayed.lease_owner, delayed.lease_expires, delayed.date_modified) == (
        None,
        T0 + 50,
        T0 + 2,
    )
    assert await backend_store.renew("w1", [task.id], 60) == {task.id: None}
    with pytest.raises(LeaseConflict):
        await backend_store.complete(task.id, 1, "w1")
    assert await backend_store.lease("w1", 1, 600) == []
    clock.advance(48)  # T0+50: not before the next second, as after a free
    assert await backend_store.lease("w2", 1, 600) == []
    clock.advance(1)
    [again] = await backend_store.lease("w2", 1, 600)
    assert (again.id, again.failure_count) == (held.id, held.failure_count)
    assert (await backend_store.get_task(task.id)).lease_owner == "w2"


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_priority_reorders_the_queue(backend_store, clock):
    ids = [(await backend_store.enqueue(EnqueueRequest("A", str(i)))).id for i in range(3)]
    clock.advance(2)
    changed = await backend_store.set_priority(ids[2], 1000)
    assert (changed.priority, changed.date_modified) == (1000, T0 + 2)
    assert [t.id for t in await backend_store.list_tasks(10, 0)] == [ids[2], ids[0], ids[1]]
    assert [t.id for t in await backend_store.lease("w", 1, 60)] == [ids[2]]
    # An expired lease is re-taken in the new order too (phase 2).
    await backend_store.set_priority(ids[2], 4000)
    await backend_store.lease("w", 2, 60)
    clock.advance(61)
    await backend_store.set_priority(ids[1], 1)
    assert [t.id for t in await backend_store.lease("w2", 1, 60)] == [ids[1]]
    await backend_store.cancel(ids[0])
    with pytest.raises(TaskStateError, match="archived"):
        await backend_store.set_priority(ids[0], 5)


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_free_breaks_a_lease_and_fences_out_its_holder(backend_store, clock):
    task = await backend_store.enqueue(EnqueueRequest("A"))
    with pytest.raises(TaskStateError, match="task has no lease"):
        await backend_store.free(task.id)
    await backend_store.lease("w", 1, 600)
    clock.advance(3)
    freed = await backend_store.free(task.id)
    assert (freed.lease_owner, freed.lease_expires, freed.date_modified) == (None, T0 + 3, T0 + 3)
    with pytest.raises(LeaseConflict):
        await backend_store.complete(task.id, 1, "w")
    assert await backend_store.lease("w2", 1, 600) == []  # not before the next second
    clock.advance(1)
    assert [t.id for t in await backend_store.lease("w2", 1, 600)] == [task.id]
    await backend_store.yield_(task.id, 600)
    assert (await backend_store.free(task.id)).lease_owner is None  # a yield is freed too
    assert (await backend_store.get_task(task.id)).lease_owner != YIELD_OWNER


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_retry_unarchives_under_the_same_id(backend_store, clock):
    failed = await backend_store.enqueue(
        EnqueueRequest("A", '{"x":"é"}', priority=2500, container_phid="PHID-X-1")
    )
    done = await backend_store.enqueue(EnqueueRequest("B", "b"))
    await backend_store.lease("w", 2, 60)
    await backend_store.fail(failed.id, False, 0)
    clock.advance(1)
    await backend_store.lease("w", 2, 60)
    await backend_store.fail(failed.id, True, 0)
    await backend_store.complete(done.id, 5)
    clock.advance(10)
    with pytest.raises(TaskStateError, match="task already succeeded"):
        await backend_store.retry(done.id, False)
    task = await backend_store.retry(failed.id, False)
    assert (task.id, task.data_id, task.task_class, task.priority, task.container_phid) == (
        failed.id,
        failed.data_id,
        "A",
        2500,
        "PHID-X-1",
    )
    assert (task.lease_owner, task.lease_expires, task.failure_count, task.failure_time) == (
        None,
        0,
        0,
        None,
    )
    assert (task.date_created, task.date_modified) == (T0, T0 + 11)
    assert await backend_store.get_archived(failed.id) is None
    with pytest.raises(TaskStateError, match="task is active, not archived"):
        await backend_store.retry(failed.id, False)
    (leased,) = await backend_store.lease("w2", 1, 60)  # phase 2, at once
    assert (leased.id, leased.data) == (failed.id, '{"x":"é"}')
    assert (await backend_store.retry(done.id, True)).id == done.id
    stats = await backend_store.stats()
    assert (stats.active, stats.archived, stats.failed) == (2, 0, 0)
    with pytest.raises(TaskNotFound):
        await backend_store.retry(99, True)
    # The unarchived task archives again normally.
    assert (await backend_store.complete(failed.id, 1, "w2")).result == 0


@pytest.fixture
def client(clock):
    return Client(MemoryTaskStore(clock), clock)


@pytest_twisted.ensureDeferred
async def test_verbs_over_http(client, clock):
    for _ in range(2):
        await client.post("enqueue", {"taskClass": "A"})
    code, answer = await client.post("delay", {"taskID": 1, "until": T0 + 60})
    assert (code, answer["data"]["leaseExpires"]) == (200, T0 + 60)
    code, answer = await client.post("priority", {"taskID": 2, "priority": 10})
    assert (code, answer["data"]["priority"]) == (200, 10)
    await client.post("lease", {"limit": 1}, headers={"X-Lease-Owner": "w"})
    code, answer = await client.post("free", {"taskID": 2})
    assert code == 200 and "leaseOwner" not in answer["data"]
    assert await client.post("free", {"taskID": 2}) == (
        409,
        {"error": {"code": "ERR_TASK_STATE", "message": "task has no lease"}},
    )
    clock.advance(1)
    await client.post("lease", {"limit": 1}, headers={"X-Lease-Owner": "w"})
    code, answer = await client.post("delay", {"taskID": 2, "until": T0 + 90})
    assert (code, answer["data"]["leaseExpires"]) == (200, T0 + 90)
    assert "leaseOwner" not in answer["data"]  # a running task's lease is taken away
    await client.post("cancel", {"taskID": 2})
    code, answer = await client.post("retry", {"taskID": 2})
    assert (code, answer["data"]["leaseExpires"]) == (200, 0)
    assert (await client.post("retry", {"taskID": 7}))[0] == 404


@pytest.mark.parametrize(
    "path, body, message",
    [
        ("delay", {"taskID": 1}, "until is required"),
        ("delay", {"taskID": 1, "until": -1}, "until must be >= 0"),
        ("delay", {"taskID": 1, "until": 2**32}, "until must be <= 4294967295"),
        ("delay", {"until": 5}, "taskID is required"),
        ("priority", {"taskID": 1}, "priority is required"),
        ("priority", {"taskID": 1, "priority": "1"}, "priority must be an integer"),
        ("priority", {"taskID": 1, "priority": -1}, "priority must be >= 0"),
        ("free", {}, "taskID is required"),
        ("retry", {"taskID": 1, "repeat": "yes"}, "repeat must be a boolean"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_bad_verb_is_400(client, path, body, message):
    await client.post("enqueue", {"taskClass": "A"})
    assert await client.post(path, body) == (
        400,
        {"error": {"code": "ERR_BAD_REQUEST", "message": message}},
    )
    assert (await client.get("tasks/1"))[1]["data"]["dateModified"] == T0


@pytest.mark.parametrize("path", ["delay", "priority", "free", "retry"])
@pytest_twisted.ensureDeferred
async def test_verbs_need_the_token(client, path):
    assert (await client.post(path, {"taskID": 1}, token=None))[0] == 401
