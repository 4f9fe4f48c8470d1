"""Batched result reports (docs/taskqueue.md, Batched reports): one call, one
transaction, one answer per report, each exactly what its single call would
have answered and changed."""

from __future__ import annotations

import pytest
import pytest_twisted

from gorge.taskqueue.memory import MemoryTaskStore
from gorge.taskqueue.model import EnqueueRequest, Report
from tests.taskqueue.helpers import Client

LEASE = 60
OWNER, OTHER = "host-a:1:100:gorge-worker", "host-b:2:200:gorge-worker"


def _answers(results) -> list[tuple]:
    return [(r.task_id, r.task_class, type(r.error).__name__ if r.error else None) for r in results]


async def _scenario(store, clock) -> tuple[list, list, dict]:
    """Tasks in every state a report can meet, then one batch over them."""
    ids = [(await store.enqueue(EnqueueRequest(f"C{i % 2}", f'{{"i":{i}}}'))).id for i in range(8)]
    assert len(await store.lease(OWNER, 7, LEASE)) == 7  # ids[7] stays unleased
    await store.complete(ids[0], 3, OWNER)  # archived, a success
    await store.cancel(ids[1])  # archived, cancelled
    batch = [
        Report(ids[0], "complete", 9),  # replay of our success
        Report(ids[1], "complete", 9),  # cancelled: conflict
        Report(ids[2], "complete", 11),
        Report(ids[3], "fail", permanent=True),
        Report(ids[4], "fail", retry_wait=30),
        Report(ids[5], "yield", 2),  # raised to 5 s
        Report(ids[6], "fail", retry_wait=2**32),  # expiry out of range
        Report(ids[7], "complete", 1),  # not ours: conflict
        Report(ids[2], "complete", 12),  # same id again: replay
        Report(999, "complete", 1),  # unknown
    ]
    clock.advance(1)
    results = await store.report(batch, OWNER)
    state = {
        "stats": await store.stats(),
        "active": await store.list_tasks(100, 0),
        "archived": [await store.get_archived(i) for i in ids],
    }
    return ids, results, state


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_a_batch_answers_and_changes_what_its_single_calls_would(backend_store, clock):
    model_clock = type(clock)()
    model_clock.advance(clock.seconds())
    _, expected, expected_state = await _scenario(MemoryTaskStore(model_clock), model_clock)
    ids, results, state = await _scenario(backend_store, clock)
    assert _answers(results) == _answers(expected)
    assert _answers(results) == [
        (ids[0], "C0", None),
        (ids[1], "", "LeaseConflict"),
        (ids[2], "C0", None),
        (ids[3], "C1", None),
        (ids[4], "C0", None),
        (ids[5], "", None),
        (ids[6], "", "InvalidArgument"),
        (ids[7], "", "LeaseConflict"),
        (ids[2], "C0", None),
        (999, "", "TaskNotFound"),
    ]
    assert state == expected_state
    archived = {a.id: a for a in state["archived"] if a is not None}
    assert (archived[ids[2]].result, archived[ids[2]].duration) == (0, 11)
    assert (archived[ids[3]].result, archived[ids[3]].duration) == (1, 0)
    assert archived[ids[0]].duration == 3  # the replay wrote nothing


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_unfenced_batch_replays_and_refuses_as_r4(backend_store, clock):
    a = (await backend_store.enqueue(EnqueueRequest("A"))).id
    b = (await backend_store.enqueue(EnqueueRequest("A"))).id
    await backend_store.lease(OWNER, 2, LEASE)
    await backend_store.cancel(b)
    first = await backend_store.report([Report(a, "complete", 5)])
    again = await backend_store.report(
        [Report(a, "complete", 6), Report(b, "complete", 1), Report(a, "fail", permanent=True)]
    )
    assert _answers(first) == [(a, "A", None)]
    assert _answers(again) == [(a, "A", None), (b, "", "TaskNotFound"), (a, "", "TaskNotFound")]
    assert (await backend_store.get_archived(a)).duration == 5


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_many_reports_of_distinct_tasks_in_one_call(backend_store, clock):
    """More reports than one statement archives, all in one call."""
    n = 150
    for i in range(n):
        await backend_store.enqueue(EnqueueRequest("A", str(i)))
    leased = await backend_store.lease(OWNER, n, LEASE)
    results = await backend_store.report(
        [Report(t.id, "complete", t.id) for t in leased[:140]]
        + [Report(t.id, "fail", permanent=True) for t in leased[140:]],
        OWNER,
    )
    assert [r.error for r in results] == [None] * n
    stats = await backend_store.stats()
    assert (stats.active, stats.archived) == (0, n)
    assert (await backend_store.get_archived(leased[17].id)).duration == leased[17].id
    assert (await backend_store.get_archived(leased[145].id)).result == 1


@pytest_twisted.ensureDeferred
async def test_report_endpoint_answers_each_report(clock):
    store = MemoryTaskStore(clock)
    client = Client(store, clock)
    for _ in range(3):
        await client.post("enqueue", {"taskClass": "A"})
    await client.post("lease", {"limit": 2}, headers={"X-Lease-Owner": OWNER})
    code, answer = await client.post(
        "report",
        {
            "reports": [
                {"taskID": 1, "outcome": "complete", "duration": 7},
                {
                    "taskID": 2,
                    "outcome": "fail",
                    "permanent": False,
                    "retryWait": 60,
                    "message": "later",
                },
                {"taskID": 3, "outcome": "yield", "duration": 30},
                {"taskID": 9, "outcome": "complete"},
                {"taskID": "x", "outcome": "complete"},
                {"taskID": 1, "outcome": "finish"},
                7,
            ]
        },
        headers={"X-Lease-Owner": OWNER},
    )
    conflict = "task lease no longer belongs to this owner"
    assert (code, answer) == (
        200,
        {
            "data": [
                {"taskID": 1, "status": "reported"},
                {"taskID": 2, "status": "reported"},
                {
                    "taskID": 3,
                    "status": "refused",
                    "code": "ERR_LEASE_CONFLICT",
                    "message": conflict,
                },
                {
                    "taskID": 9,
                    "status": "refused",
                    "code": "ERR_NOT_FOUND",
                    "message": "task not found",
                },
                {
                    "taskID": "x",
                    "status": "refused",
                    "code": "ERR_BAD_REQUEST",
                    "message": "taskID must be an integer",
                },
                {
                    "taskID": 1,
                    "status": "refused",
                    "code": "ERR_BAD_REQUEST",
                    "message": "outcome must be one of complete, fail, yield",
                },
                {
                    "taskID": None,
                    "status": "refused",
                    "code": "ERR_BAD_REQUEST",
                    "message": "each report must be an object",
                },
            ]
        },
    )
    assert (await store.get_archived(1)).duration == 7
    assert (await store.get_task(2)).failure_count == 1
    assert (await store.get_task(3)).lease_owner is None
    # The replay answers as the single complete's replay does.
    code, answer = await client.post(
        "report",
        {"leaseOwner": OWNER, "reports": [{"taskID": 1, "outcome": "complete", "duration": 8}]},
    )
    assert (code, answer) == (200, {"data": [{"taskID": 1, "status": "reported"}]})
    metrics = (await client.get("/metrics", token=None))[1]
    assert 'gorge_taskqueue_tasks_completed_total{task_class="A"} 2.0' in metrics
    assert 'gorge_taskqueue_tasks_failed_total{permanent="false",task_class="A"} 1.0' in metrics


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize(
    "body,message",
    [
        ({}, "reports is required"),
        ({"reports": []}, "reports is required"),
        ({"reports": {"taskID": 1}}, "reports must be a list"),
        (
            {"reports": [{"taskID": 1, "outcome": "complete"}] * 1001},
            "reports must have at most 1000 entries",
        ),
        (
            {"reports": [{"taskID": 1, "outcome": "complete"}], "leaseOwner": "x" * 65},
            "leaseOwner must be at most 64 characters",
        ),
    ],
)
async def test_report_endpoint_refuses_a_malformed_call(clock, body, message):
    store = MemoryTaskStore(clock)
    client = Client(store, clock)
    await client.post("enqueue", {"taskClass": "A"})
    assert await client.post("report", body) == (
        400,
        {"error": {"code": "ERR_BAD_REQUEST", "message": message}},
    )
    assert (await store.stats()).archived == 0


@pytest_twisted.ensureDeferred
async def test_report_store_failure_is_the_opaque_500_and_writes_nothing(clock):
    store = MemoryTaskStore(clock)
    client = Client(store, clock)
    await client.post("enqueue", {"taskClass": "A"})

    async def broken(reports, owner=None):
        raise OSError("backend gone")

    store.report = broken
    code, answer = await client.post("report", {"reports": [{"taskID": 1, "outcome": "complete"}]})
    assert (code, answer) == (
        500,
        {"error": {"code": "ERR_INTERNAL", "message": "internal server error"}},
    )
    assert (await store.stats()).active == 1
