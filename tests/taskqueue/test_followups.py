"""Follow-up tasks (docs/taskqueue.md, Follow-up tasks): a success report
that carries them archives the parent and inserts the children in one atomic
step on every backend, a repeated report inserts nothing, and a list that
cannot be stored archives nothing."""

from __future__ import annotations

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st

from gorge.taskqueue.model import (
    PRIORITY_DEFAULT,
    EnqueueRequest,
    Followup,
    Report,
)
from gorge.taskqueue.requests import parse_followups
from gorge.taskqueue.store import LeaseConflict, TaskNotFound
from gorge.web.envelope import ApiError
from tests.taskqueue.conftest import T0
from tests.taskqueue.helpers import Client

LEASE = 600
OWNER, OTHER = "host-a:1:100:gorge-worker", "host-b:2:200:gorge-worker"
PHID = "PHID-TASK-tzdxqbs3s4qsrzbtcoun"


def followup(task_class: str = "Child", *, priority: int | None = None, **kw) -> Followup:
    """A follow-up as the API parses it: no priority means the parent's."""
    request = EnqueueRequest(
        task_class, priority=PRIORITY_DEFAULT if priority is None else priority, **kw
    )
    return Followup(request, inherits_priority=priority is None)


async def leased_parent(store, priority: int = 2500) -> int:
    task = await store.enqueue(EnqueueRequest("Parent", '{"p":1}', priority))
    assert [t.id for t in await store.lease(OWNER, 1, LEASE)] == [task.id]
    return task.id


async def stored(store, request) -> dict[str, int]:
    """Active tasks, archive rows and payloads, counted in the backend itself,
    so a stray row of a failed or repeated report cannot hide."""
    if store.backend == "redis":
        with request.getfixturevalue("redis_server").client() as sync:
            keys = [k.decode() for k in sync.execute("KEYS", store.keys.base + "*")]
        base = store.keys.base
        return {
            kind: sum(1 for k in keys if k.startswith(base + kind + ":"))
            for kind in ("task", "archived", "data")
        }

    def count(txn) -> dict[str, int]:
        out = {}
        for kind, table in (
            ("task", "worker_activetask"),
            ("archived", "worker_archivetask"),
            ("data", "worker_taskdata"),
        ):
            txn.execute(f"SELECT COUNT(*) FROM {table}")
            out[kind] = int(txn.fetchone()[0])
        return out

    return await store.db.run("count", count)


CHILDREN = (
    followup("Inherits", data='{"n":1}'),
    followup("Urgent", priority=1000, data="[]", object_phid=PHID, container_phid="PHID-X"),
    followup("Later", data="", delay_until=T0 + 900),
)


# -- every backend -----------------------------------------------------------


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_children_are_stored_as_enqueues_and_the_parent_archived(
    backend_store, clock, request
):
    parent = await leased_parent(backend_store, priority=2500)
    clock.advance(2)
    done = await backend_store.complete_with_followups(parent, 1500, CHILDREN, OWNER)

    assert (done.archived.id, done.archived.result, done.archived.duration) == (parent, 0, 1500)
    assert await backend_store.get_archived(parent) == done.archived
    now = T0 + 2
    expected = [
        ("Inherits", '{"n":1}', 2500, None, None, None),
        ("Urgent", "[]", 1000, PHID, "PHID-X", None),
        ("Later", "", 2500, None, None, T0 + 900),
    ]
    assert [
        (c.task_class, c.priority, c.object_phid, c.container_phid, c.lease_expires)
        for c in done.children
    ] == [(e[0], e[2], e[3], e[4], e[5]) for e in expected]
    children = [await backend_store.get_task(c.id) for c in done.children]
    assert [
        (
            c.task_class,
            c.data,
            c.priority,
            c.object_phid,
            c.container_phid,
            c.lease_expires,
            c.lease_owner,
            c.failure_count,
            c.date_created,
            c.date_modified,
        )
        for c in children
    ] == [(*e, None, 0, now, now) for e in expected]
    assert [c.without_data() for c in children] == list(done.children)
    # New ids from the same sequence as enqueue, after the parent's.
    assert [c.id for c in children] == [parent + 1, parent + 2, parent + 3]
    assert await stored(backend_store, request) == {
        "task": 3,
        "archived": 1,
        "data": 3 + (0 if backend_store.backend == "redis" else 1),
    }
    # The children are leasable as any enqueued task (the delayed one later).
    leased = await backend_store.lease(OTHER, 10, LEASE)
    assert [t.task_class for t in leased] == ["Urgent", "Inherits"]


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_a_repeated_success_inserts_nothing(backend_store, clock, request):
    parent = await leased_parent(backend_store)
    first = await backend_store.complete_with_followups(parent, 10, CHILDREN, OWNER)
    after_first = await stored(backend_store, request)
    clock.advance(30)

    # The worker's answer was lost: it sends the same report again, fenced or
    # not, alone or batched.
    again = await backend_store.complete_with_followups(parent, 99, CHILDREN, OWNER)
    unfenced = await backend_store.complete_with_followups(parent, 99, CHILDREN)
    batched = await backend_store.report(
        [Report(parent, "complete", 99, followups=CHILDREN)] * 2, OWNER
    )

    assert (again.archived, again.children) == (first.archived, ())
    assert (unfenced.archived, unfenced.children) == (first.archived, ())
    assert [(r.task_class, r.error, r.children) for r in batched] == [("Parent", None, ())] * 2
    assert await stored(backend_store, request) == after_first
    assert len(await backend_store.list_tasks(100, 0)) == 3


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_a_report_refused_by_its_fence_inserts_nothing(backend_store, clock, request):
    parent = await leased_parent(backend_store)
    before = await stored(backend_store, request)
    with pytest.raises(LeaseConflict):
        await backend_store.complete_with_followups(parent, 1, CHILDREN, OTHER)
    with pytest.raises(TaskNotFound):
        await backend_store.complete_with_followups(parent + 50, 1, CHILDREN, OWNER)
    [conflict] = await backend_store.report([Report(parent, "complete", followups=CHILDREN)], OTHER)
    assert isinstance(conflict.error, LeaseConflict)
    assert conflict.children == ()
    # Someone else's success is no replay for us either.
    await backend_store.complete(parent, 1, OWNER)
    with pytest.raises(LeaseConflict):
        await backend_store.complete_with_followups(parent, 1, CHILDREN, OTHER)
    assert await stored(backend_store, request) == {
        **before,
        "task": before["task"] - 1,
        "archived": 1,
        "data": before["data"] - (1 if backend_store.backend == "redis" else 0),
    }


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_a_batch_inserts_each_reports_children_once(backend_store, clock):
    a = await leased_parent(backend_store, priority=3000)
    b = (await backend_store.enqueue(EnqueueRequest("Parent", priority=1500))).id
    c = (await backend_store.enqueue(EnqueueRequest("Parent"))).id
    assert len(await backend_store.lease(OWNER, 2, LEASE)) == 2
    results = await backend_store.report(
        [
            Report(a, "complete", 5, followups=(followup("A1"), followup("A2", priority=7))),
            Report(b, "complete", 6),
            Report(c, "complete", 7, followups=(followup("C1"),)),
            Report(a, "complete", 8, followups=(followup("A1"),)),  # the same id: a replay
        ],
        OWNER,
    )
    assert [(r.task_id, r.error) for r in results] == [(a, None), (b, None), (c, None), (a, None)]
    assert [[(t.task_class, t.priority) for t in r.children] for r in results] == [
        [("A1", 3000), ("A2", 7)],
        [],
        [("C1", PRIORITY_DEFAULT)],
        [],
    ]
    active = await backend_store.list_tasks(100, 0)
    assert sorted((t.task_class, t.priority) for t in active) == [
        ("A1", 3000),
        ("A2", 7),
        ("C1", PRIORITY_DEFAULT),
    ]
    assert [(await backend_store.get_archived(i)).duration for i in (a, b, c)] == [5, 6, 7]


async def _break_the_second_child(store, request) -> None:
    """Make the backend fail after the parent's archive (SQL) or after the
    first write of the script (Redis) has begun."""
    if store.backend == "redis":
        # The task id is taken, then the payload sequence cannot be read.
        with request.getfixturevalue("redis_server").client() as sync:
            sync.execute("SET", store.keys.next_data_id, "not a number")
        return

    # A row under the id the second child will get: its insert fails on the
    # primary key, after the archive and the first child were written.
    def block(txn) -> None:
        txn.execute("SELECT counterValue FROM lisk_counter WHERE counterName = 'worker_activetask'")
        taken = int(txn.fetchone()[0])
        store.db.engine.execute(
            txn,
            "INSERT INTO worker_activetask (id, taskClass, failureCount, dataID, priority,"
            " dateCreated, dateModified) VALUES (%s, 'Blocker', 0, 0, 1, 0, 0)",
            (taken + 2,),
        )

    await store.db.run("block", block)


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_a_failure_half_way_writes_neither_archive_nor_child(backend_store, clock, request):
    parent = await leased_parent(backend_store)
    await _break_the_second_child(backend_store, request)
    before = await stored(backend_store, request)

    with pytest.raises(Exception) as single:
        await backend_store.complete_with_followups(parent, 1, CHILDREN, OWNER)
    with pytest.raises(Exception) as batched:
        await backend_store.report([Report(parent, "complete", followups=CHILDREN)], OWNER)

    for failure in (single, batched):
        assert not isinstance(failure.value, (LeaseConflict, TaskNotFound))
    assert await stored(backend_store, request) == before
    assert await backend_store.get_archived(parent) is None
    task = await backend_store.get_task(parent)
    assert (task.lease_owner, task.data) == (OWNER, '{"p":1}')
    assert {t.task_class for t in await backend_store.list_tasks(100, 0)} <= {"Parent", "Blocker"}


# -- the HTTP API ------------------------------------------------------------


BAD = [
    ({"followups": "Child"}, "followups must be a list of objects"),
    (
        {"followups": [{"taskClass": "A"}] * 1001},
        "followups must have at most 1000 entries, got 1001",
    ),
    ({"followups": [{"taskClass": "A"}, 7]}, "followups[1] must be an object"),
    ({"followups": [{"taskClass": "A"}, {"data": "{}"}]}, "followups[1]: taskClass is required"),
    (
        {"followups": [{"taskClass": "A" * 65}]},
        "followups[0]: taskClass must be at most 64 characters",
    ),
    ({"followups": [{"taskClass": "A", "data": {}}]}, "followups[0]: data must be a string"),
    (
        {"followups": [{"taskClass": "A"}, {"taskClass": "A", "priority": -1}]},
        "followups[1]: priority must be >= 0",
    ),
    (
        {"followups": [{"taskClass": "A", "priority": True}]},
        "followups[0]: priority must be an integer",
    ),
    (
        {"followups": [{"taskClass": "A", "delayUntil": 2**32}]},
        "followups[0]: delayUntil must be <= 4294967295",
    ),
    (
        {"followups": [{"taskClass": "A", "objectPHID": "P" * 65}]},
        "followups[0]: objectPHID must be at most 64 characters",
    ),
    (
        {"followups": [{"taskClass": "A", "containerPHID": 3}]},
        "followups[0]: containerPHID must be a string",
    ),
]


async def _report_bad_list(store, clock, extra: dict) -> tuple[int, tuple, tuple]:
    """A leased parent reported complete, alone and batched, with ``extra``."""
    parent = await leased_parent(store)
    client = Client(store, clock)
    fence = {"X-Lease-Owner": OWNER}
    single = await client.post("complete", {"taskID": parent, **extra}, headers=fence)
    batched = await client.post(
        "report", {"reports": [{"taskID": parent, "outcome": "complete", **extra}]}, headers=fence
    )
    return parent, single, batched


def _refused(parent: int, message: str) -> tuple[tuple, tuple]:
    error = {"code": "ERR_BAD_REQUEST", "message": message}
    return (400, {"error": error}), (
        200,
        {"data": [{"taskID": parent, "status": "refused", **error}]},
    )


@pytest.mark.parametrize(("extra", "message"), BAD)
@pytest_twisted.ensureDeferred
async def test_a_bad_followup_list_is_a_400_naming_entry_and_field(
    memory_store, clock, extra, message
):
    parent, single, batched = await _report_bad_list(memory_store, clock, extra)
    assert (single, batched) == _refused(parent, message)
    assert [t.id for t in await memory_store.list_tasks(100, 0)] == [parent]
    assert (await memory_store.get_task(parent)).lease_owner == OWNER


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_a_bad_followup_list_archives_nothing_on_any_backend(backend_store, clock, request):
    await backend_store.enqueue(EnqueueRequest("Other", priority=4000))  # the counts keep it
    before = await stored(backend_store, request)
    extra = {"followups": [{"taskClass": "Fine"}, {"taskClass": "Bad", "delayUntil": -5}]}
    parent, single, batched = await _report_bad_list(backend_store, clock, extra)
    assert (single, batched) == _refused(parent, "followups[1]: delayUntil must be >= 0")
    assert await stored(backend_store, request) == {
        **before,
        "task": before["task"] + 1,
        "data": before["data"] + 1,
    }
    assert await backend_store.get_archived(parent) is None
    assert (await backend_store.get_task(parent)).lease_owner == OWNER


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_followups_over_http_single_and_batched(backend_store, clock):
    client = Client(backend_store, clock)
    for priority in (3000, 1500):
        await client.post("enqueue", {"taskClass": "Parent", "priority": priority})
    fence = {"X-Lease-Owner": OWNER}
    await client.post("lease", {"limit": 2}, headers=fence)
    followups = [
        {"taskClass": "A", "data": '{"x":1}', "priority": None, "objectPHID": None},
        {"taskClass": "B", "priority": 10, "delayUntil": T0 + 60, "containerPHID": PHID},
    ]

    code, single = await client.post(
        "complete", {"taskID": 1, "duration": 5, "followups": followups}, headers=fence
    )
    code_again, again = await client.post(
        "complete", {"taskID": 1, "duration": 6, "followups": followups}, headers=fence
    )
    code_batch, batch = await client.post(
        "report",
        {"reports": [{"taskID": 2, "outcome": "complete", "followups": followups[:1]}]},
        headers=fence,
    )

    assert (code, single["data"]["id"], single["data"]["result"]) == (200, 1, 0)
    assert (code_again, again) == (200, single)  # the same answer, nothing inserted
    assert (code_batch, batch) == (200, {"data": [{"taskID": 2, "status": "reported"}]})
    _, tasks = await client.get("tasks")
    assert [
        (t["id"], t["taskClass"], t["priority"], t.get("leaseExpires"), t.get("containerPHID"))
        for t in tasks["data"]
    ] == [(4, "B", 10, T0 + 60, PHID), (5, "A", 1500, None, None), (3, "A", 3000, None, None)]
    _, child = await client.get("tasks/3")
    assert child["data"]["data"] == '{"x":1}'
    _, metrics = await client.call("GET", "/metrics")
    assert 'gorge_taskqueue_tasks_enqueued_total{task_class="A"} 2.0' in metrics


# -- the parser, for every input ---------------------------------------------

_ASCII = st.characters(max_codepoint=127)
_VALID = st.fixed_dictionaries(
    {"taskClass": st.text(min_size=1, max_size=64)},
    optional={
        "data": st.one_of(st.none(), st.text()),
        "priority": st.one_of(st.none(), st.integers(0, 2**32 - 1)),
        "objectPHID": st.one_of(st.none(), st.text(_ASCII, max_size=64)),
        "containerPHID": st.one_of(st.none(), st.text(_ASCII, max_size=64)),
        "delayUntil": st.one_of(st.none(), st.integers(0, 2**32 - 1)),
    },
)
_INVALID = st.one_of(
    st.fixed_dictionaries({"taskClass": st.just("")}),
    st.fixed_dictionaries({"taskClass": st.just("A"), "priority": st.integers(max_value=-1)}),
    st.fixed_dictionaries({"taskClass": st.just("A"), "delayUntil": st.integers(min_value=2**32)}),
    st.fixed_dictionaries({"taskClass": st.integers()}),
    st.lists(st.integers(), max_size=2),
)


@given(st.lists(_VALID, max_size=8))
def test_every_valid_entry_is_parsed_as_its_enqueue(items):
    parsed = parse_followups({"followups": items})
    assert len(parsed) == len(items)
    for item, entry in zip(items, parsed, strict=True):
        assert entry.inherits_priority == (item.get("priority") is None)
        given_priority = item.get("priority")
        assert entry.request(4321).priority == (4321 if given_priority is None else given_priority)
        assert entry.enqueue.task_class == item["taskClass"]
        assert entry.enqueue.data == (item.get("data") or "")
        delay = item.get("delayUntil")
        assert entry.enqueue.delay_until == (delay if delay else None)


@given(st.lists(_VALID, max_size=5), _INVALID, st.lists(_VALID, max_size=5))
def test_the_first_bad_entry_is_named_by_its_index(before, bad, after):
    with pytest.raises(ApiError) as refused:
        parse_followups({"followups": [*before, bad, *after]})
    assert refused.value.status == 400
    assert refused.value.message.startswith(f"followups[{len(before)}]")
