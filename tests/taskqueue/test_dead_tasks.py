"""Dead tasks on every backend and over HTTP: listing archived failures
newest first, and requeueing them as new tasks (docs/taskqueue.md, Dead tasks)."""

from __future__ import annotations

import pytest
import pytest_twisted

from gorge.taskqueue.memory import MemoryTaskStore
from gorge.taskqueue.model import RESULT_CANCELLED, RESULT_FAILURE, EnqueueRequest
from gorge.taskqueue.store import TaskNotFound, TaskStateError
from tests.taskqueue.conftest import T0
from tests.taskqueue.helpers import Client

PHID = "PHID-TASK-tzdxqbs3s4qsrzbtcoun"


async def _archive_mix(store, clock) -> dict[str, int]:
    """Five archived tasks, one second apart: two failures of A, a failure of
    B, a success and a cancel; plus one active task."""
    ids = {}
    for name, cls in [
        ("a1", "A"),
        ("b1", "B"),
        ("ok", "A"),
        ("a2", "A"),
        ("c", "A"),
        ("live", "A"),
    ]:
        ids[name] = (
            await store.enqueue(
                EnqueueRequest(cls, f'{{"n":"{name}","t":"é ✓"}}', priority=1500, object_phid=PHID)
            )
        ).id
    await store.lease("w", 10, 600)
    for name, action in [
        ("a1", "fail"),
        ("b1", "fail"),
        ("ok", "complete"),
        ("a2", "fail"),
        ("c", "cancel"),
    ]:
        clock.advance(1)
        if action == "fail":
            await store.fail(ids[name], False, 0)  # a failure counted first
            await store.fail(ids[name], True, 0)
        elif action == "complete":
            await store.complete(ids[name], 10)
        else:
            await store.cancel(ids[name])
    return ids


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_archived_tasks_are_listed_newest_first_and_filtered(backend_store, clock):
    ids = await _archive_mix(backend_store, clock)
    every = await backend_store.list_archived(None, None, 100, 0)
    assert [a.id for a in every] == [ids[n] for n in ("c", "a2", "ok", "b1", "a1")]
    failures = await backend_store.list_archived(RESULT_FAILURE, None, 100, 0)
    assert [a.id for a in failures] == [ids["a2"], ids["b1"], ids["a1"]]
    assert all(a.failure_count == 1 and a.result == RESULT_FAILURE for a in failures)
    assert [a.id for a in await backend_store.list_archived(RESULT_FAILURE, "A", 100, 0)] == [
        ids["a2"],
        ids["a1"],
    ]
    assert [a.id for a in await backend_store.list_archived(RESULT_FAILURE, None, 1, 1)] == [
        ids["b1"]
    ]
    assert await backend_store.list_archived(RESULT_CANCELLED, "B", 100, 0) == []
    assert await backend_store.list_archived(None, None, 100, 5) == []
    assert failures[0] == await backend_store.get_archived(ids["a2"])


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_requeue_makes_a_new_task_and_keeps_the_archive_row(backend_store, clock):
    ids = await _archive_mix(backend_store, clock)
    clock.advance(10)
    before = await backend_store.get_archived(ids["a1"])
    task = await backend_store.requeue(ids["a1"])
    assert task.id == ids["live"] + 1 and task.data is None
    assert (task.task_class, task.priority, task.object_phid, task.container_phid) == (
        "A",
        1500,
        PHID,
        None,
    )
    assert (task.failure_count, task.failure_time, task.lease_owner, task.lease_expires) == (
        0,
        None,
        None,
        None,
    )
    assert task.date_created == task.date_modified == T0 + 15
    assert task.data_id not in {before.data_id}
    assert await backend_store.get_archived(ids["a1"]) == before
    loaded = await backend_store.get_task(task.id)
    assert loaded.data == '{"n":"a1","t":"é ✓"}'
    # It runs like any new task: leasable at once, in queue order.
    assert [t.id for t in await backend_store.lease("w2", 5, 600)] == [task.id]
    # A second requeue of the same archive row makes another task.
    assert (await backend_store.requeue(ids["a1"])).id == task.id + 1
    assert (await backend_store.requeue(ids["c"])).task_class == "A"  # cancelled: too
    with pytest.raises(TaskStateError, match="task already succeeded"):
        await backend_store.requeue(ids["ok"])
    with pytest.raises(TaskStateError, match="task is active, not archived"):
        await backend_store.requeue(ids["live"])
    with pytest.raises(TaskNotFound):
        await backend_store.requeue(999)
    stats = await backend_store.stats()
    assert (stats.active, stats.archived) == (4, 5)


@pytest.fixture
def client(clock):
    return Client(MemoryTaskStore(clock), clock)


@pytest_twisted.ensureDeferred
async def test_dead_tasks_over_http(client, clock):
    ids = await _archive_mix(client.service.part("store"), clock)
    code, answer = await client.get("archived?result=failure&class=A&limit=1")
    assert code == 200
    (row,) = answer["data"]
    assert row == {
        "id": ids["a2"],
        "taskClass": "A",
        "leaseExpires": T0 + 4,
        "failureCount": 1,
        "dataID": ids["a2"],
        "priority": 1500,
        "objectPHID": PHID,
        "dateCreated": T0,
        "dateModified": T0 + 4,
        "result": 1,
        "duration": 0,
        "archivedEpoch": T0 + 4,
    }
    assert [r["id"] for r in (await client.get("archived?result=1&offset=1"))[1]["data"]] == [
        ids["b1"],
        ids["a1"],
    ]
    assert len((await client.get("archived"))[1]["data"]) == 5
    assert (await client.get(f"archived/{ids['c']}"))[1]["data"]["result"] == 2
    assert (await client.get("archived/77"))[0] == 404
    assert (await client.get("archived/x"))[0] == 400
    code, answer = await client.post(
        "requeue", {"taskIDs": [ids["a1"], ids["ok"], 77, ids["live"], ids["a1"]]}
    )
    assert code == 200
    requeued, succeeded, unknown, live = answer["data"]
    assert requeued["status"] == "requeued" and requeued["taskID"] == ids["a1"]
    assert requeued["task"]["id"] == ids["live"] + 1 and "leaseOwner" not in requeued["task"]
    assert succeeded == {
        "taskID": ids["ok"],
        "status": "refused",
        "code": "ERR_TASK_STATE",
        "message": "task already succeeded",
    }
    assert unknown == {
        "taskID": 77,
        "status": "refused",
        "code": "ERR_NOT_FOUND",
        "message": "task not found",
    }
    assert live["message"] == "task is active, not archived"
    code, answer = await client.get("/metrics", token=None)
    assert 'gorge_taskqueue_tasks_requeued_total{task_class="A"} 1.0' in answer


@pytest.mark.parametrize(
    "path, message",
    [
        ("archived?result=dead", "result must be success, failure or cancelled"),
        ("archived?result=3", "result must be success, failure or cancelled"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_bad_archive_query_is_400(client, path, message):
    assert await client.get(path) == (
        400,
        {"error": {"code": "ERR_BAD_REQUEST", "message": message}},
    )


@pytest.mark.parametrize(
    "body, message",
    [
        ({}, "taskIDs is required"),
        ({"taskIDs": "1"}, "taskIDs must be a list of integers"),
        ({"taskIDs": [True]}, "taskIDs must be a list of integers"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_bad_requeue_is_400(client, body, message):
    assert await client.post("requeue", body) == (
        400,
        {"error": {"code": "ERR_BAD_REQUEST", "message": message}},
    )


@pytest_twisted.ensureDeferred
async def test_dead_task_routes_need_the_token(client):
    assert (await client.get("archived", token=None))[0] == 401
    assert (await client.post("requeue", {"taskIDs": [1]}, token="wrong"))[0] == 401
