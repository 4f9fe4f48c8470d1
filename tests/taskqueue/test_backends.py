"""Every backend leases correctly under concurrency."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, DeferredList, gatherResults

from gorge.taskqueue.model import EnqueueRequest

pytestmark = pytest.mark.integration

TASKS = 1000
CLIENTS = 4


async def _enqueue_many(store, n: int, lanes: int = 8) -> list[int]:
    ids: list[int] = []

    async def lane(k: int) -> None:
        for i in range(k, n, lanes):
            task = await store.enqueue(
                EnqueueRequest(f"C{i % 3}", f'{{"i":{i}}}', priority=1000 + (i % 4) * 1000)
            )
            ids.append(task.id)

    await gatherResults([Deferred.fromCoroutine(lane(k)) for k in range(lanes)])
    return ids


@pytest_twisted.ensureDeferred
async def test_parallel_lessees_get_disjoint_sets_covering_every_task(backend_store):
    ids = await _enqueue_many(backend_store, TASKS)
    assert sorted(ids) == list(range(1, TASKS + 1))

    async def client(owner: str) -> list[int]:
        got: list[int] = []
        while True:
            batch = await backend_store.lease(owner, 25, 7200)
            if not batch:
                return got
            assert all(t.lease_owner == owner for t in batch)
            assert [(t.priority, t.id) for t in batch] == sorted((t.priority, t.id) for t in batch)
            got += [t.id for t in batch]

    results = await DeferredList(
        [Deferred.fromCoroutine(client(f"worker-{k}")) for k in range(CLIENTS)],
        fireOnOneErrback=True,
        consumeErrors=True,
    )
    sets = [set(r) for _, r in results]
    lists = [r for _, r in results]
    assert sum(len(x) for x in lists) == TASKS  # nobody got a task twice
    assert set().union(*sets) == set(range(1, TASKS + 1))  # every task handed out
    for i in range(CLIENTS):
        for j in range(i + 1, CLIENTS):
            assert not sets[i] & sets[j]
    stats = await backend_store.stats()
    assert (stats.active, stats.leased) == (TASKS, TASKS)


@pytest_twisted.ensureDeferred
async def test_class_filter_touches_nothing_else(backend_store):
    await backend_store.enqueue(EnqueueRequest("A", "a"))
    await backend_store.enqueue(EnqueueRequest("B", "b", priority=1))
    (task,) = await backend_store.lease("w", 5, 60, ["A"])
    assert task.task_class == "A" and task.data == "a"
    other = await backend_store.get_task(2)
    assert other.lease_owner is None and other.lease_expires is None


@pytest_twisted.ensureDeferred
async def test_awaken_takes_a_long_id_list(backend_store):
    task = await backend_store.enqueue(EnqueueRequest("A", "a"))
    await backend_store.yield_(task.id, 600)
    ids = list(range(2, 40_000)) + [task.id]
    assert await backend_store.awaken(ids) == 1
    assert await backend_store.awaken(ids) == 0


@pytest_twisted.ensureDeferred
async def test_phids_come_back_verbatim_even_when_they_look_like_numbers(backend_store):
    """A PHID is a string stored as given; a column that converts numeric-looking
    text (SQLite's NUMERIC affinity) would hand back "42" for "0042"."""
    phids = ("0042", "1e5", "-7", " 12", "3.0")
    for phid in phids:
        await backend_store.enqueue(EnqueueRequest("A", "", object_phid=phid, container_phid=phid))
    active = await backend_store.list_tasks(10, 0)
    assert [(t.object_phid, t.container_phid) for t in active] == [(p, p) for p in phids]
    archived = await backend_store.cancel(active[0].id)
    assert (await backend_store.get_archived(archived.id)).object_phid == "0042"
