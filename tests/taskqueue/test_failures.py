"""Each failing task's last error (docs/taskqueue.md, Last errors): what a
worker sent with its failure, kept by gorge-taskqueue because Phorge's tables
keep no error text, and answered by ``GET /api/queue/failures``."""

from __future__ import annotations

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import task

from gorge.taskqueue.failures import FailureNotes
from tests.taskqueue.conftest import T0
from tests.taskqueue.helpers import Client


@pytest.fixture
def client(sqlite_store, clock) -> Client:
    return Client(sqlite_store, clock)


async def _leased_tasks(client: Client, n: int) -> list[int]:
    for _ in range(n):
        code, answer = await client.post("enqueue", {"taskClass": "C", "data": "{}"})
        assert code == 200, answer
    code, answer = await client.post("lease", {"limit": n}, headers={"X-Lease-Owner": "w"})
    assert code == 200, answer
    return [t["id"] for t in answer["data"]]


async def _failures(client: Client, query: str = "") -> list[dict]:
    code, answer = await client.get("failures" + query)
    assert code == 200, answer
    return answer["data"]


@pytest_twisted.ensureDeferred
async def test_a_failure_s_message_is_its_task_s_last_error_until_it_completes(client, clock):
    one, two, three = await _leased_tasks(client, 3)
    await client.post("fail", {"taskID": one, "message": "boom", "retryWait": 0})
    clock.advance(5)
    code, answer = await client.post(
        "report",
        {
            "reports": [
                {"taskID": two, "outcome": "fail", "permanent": True, "message": "gone for good"},
                {"taskID": three, "outcome": "fail", "retryWait": 0},
            ]
        },
    )
    assert code == 200 and [e["status"] for e in answer["data"]] == ["reported"] * 2, answer

    assert await _failures(client) == [
        # A batch's entries in their order, after the earlier single call.
        {"taskID": three, "taskClass": "C", "message": "", "permanent": False, "failedAt": T0 + 5},
        {
            "taskID": two,
            "taskClass": "C",
            "message": "gone for good",
            "permanent": True,
            "failedAt": T0 + 5,
        },
        {"taskID": one, "taskClass": "C", "message": "boom", "permanent": False, "failedAt": T0},
    ]
    assert [n["taskID"] for n in await _failures(client, "?permanent=true")] == [two]
    assert [n["taskID"] for n in await _failures(client, "?permanent=false")] == [three, one]
    assert [n["taskID"] for n in await _failures(client, f"?taskIDs={one},{two}")] == [two, one]
    assert [n["taskID"] for n in await _failures(client, "?limit=1")] == [three]

    # Leased again: a second failure replaces the note, a success drops it.
    clock.advance(1)  # a retry wait of 0 is over a second later, as Phorge reads it
    code, answer = await client.post("lease", {"limit": 2}, headers={"X-Lease-Owner": "w"})
    assert sorted(t["id"] for t in answer["data"]) == [one, three]
    await client.post("fail", {"taskID": one, "message": "boom again", "retryWait": 0})
    await client.post("complete", {"taskID": three})
    notes = await _failures(client)
    assert [(n["taskID"], n["message"]) for n in notes] == [
        (one, "boom again"),
        (two, "gone for good"),
    ]


@pytest_twisted.ensureDeferred
async def test_a_refused_failure_leaves_no_note(client):
    [one] = await _leased_tasks(client, 1)
    code, _ = await client.post("fail", {"taskID": one, "message": "x", "leaseOwner": "other"})
    assert code == 409
    code, _ = await client.post("fail", {"taskID": 999, "message": "x"})
    assert code == 404
    assert await _failures(client) == []


@pytest.mark.parametrize(
    "query, message",
    [
        ("?taskIDs=1,x", "taskIDs must be task ids separated by commas"),
        ("?taskIDs=1,,2", "taskIDs must be task ids separated by commas"),
        ("?taskIDs=1_0", "taskIDs must be task ids separated by commas"),
        ("?taskIDs=-1", "taskIDs must be task ids separated by commas"),
        ("?permanent=yes", "permanent must be true or false"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_bad_filter_is_400_naming_it(client, query, message):
    code, answer = await client.get("failures" + query)
    assert (code, answer["error"]["code"], answer["error"]["message"]) == (
        400,
        "ERR_BAD_REQUEST",
        message,
    )


def test_notes_are_bounded_in_number_and_in_age():
    clock = task.Clock()
    notes = FailureNotes(clock, max_notes=3, max_age=100.0)
    for task_id in range(1, 6):
        notes.note(task_id, "C", f"e{task_id}", permanent=False)
        clock.advance(10)
    assert [n.task_id for n in notes.recent(10)] == [5, 4, 3]
    clock.advance(100 - 30 + 1)  # note 3 was written just over 100 s ago; 4 and 5 later
    assert [n.task_id for n in notes.recent(10)] == [5, 4]
    assert notes.last(3) is None and len(notes) == 2
    assert notes.last(4) is not None and notes.last(4).message == "e4"


def test_a_message_is_kept_to_its_first_thousand_characters():
    notes = FailureNotes(task.Clock())
    notes.note(1, "C", "é" * 5000, permanent=True)
    assert notes.last(1).message == "é" * 1000


OPS = st.lists(
    st.tuples(
        st.sampled_from(["note", "forget", "wait"]),
        st.integers(min_value=1, max_value=8),
        st.booleans(),
        st.integers(min_value=0, max_value=40),
    ),
    max_size=60,
)


@given(OPS)
def test_the_notes_are_each_task_s_newest_failure_within_the_bounds(ops):
    """Against a plain model: each task's last note, newest first, at most
    ``max_notes`` of them, none older than ``max_age``."""
    clock = task.Clock()
    notes = FailureNotes(clock, max_notes=5, max_age=60.0)
    model: list[tuple[int, str, bool, float]] = []  # oldest first
    for step, (op, task_id, permanent, seconds) in enumerate(ops):
        if op == "note":
            model = [m for m in model if m[0] != task_id]
            model.append((task_id, f"m{step}", permanent, clock.seconds()))
            notes.note(task_id, "C", f"m{step}", permanent)
            model = model[-5:]
        elif op == "forget":
            model = [m for m in model if m[0] != task_id]
            notes.forget(task_id)
        else:
            clock.advance(seconds)
        model = [m for m in model if m[3] >= clock.seconds() - 60.0]
        expected = [(m[0], m[1], m[2]) for m in reversed(model)]
        assert [(n.task_id, n.message, n.permanent) for n in notes.recent(100)] == expected
        only = [e for e in expected if e[2]]
        assert [(n.task_id, n.message, n.permanent) for n in notes.recent(100, permanent=True)] == (
            only
        )
