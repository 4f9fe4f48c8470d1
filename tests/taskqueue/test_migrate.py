"""Moving active tasks between backends (docs/taskqueue.md, Moving between
backends): every column kept, and an interrupted run re-run to the end moves
every task exactly once."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import pytest_twisted
from twisted.internet import task as ttask
from twisted.internet.defer import Deferred, gatherResults

from gorge.taskqueue.memory import MemoryTaskStore
from gorge.taskqueue.migrate import Migration, ledger_name
from gorge.taskqueue.model import EnqueueRequest
from tests.taskqueue.conftest import (
    T0,
    open_mysql_store,
    open_redis_store,
    open_sqlite_store,
)

pytestmark = pytest.mark.integration

PAIRS = [
    ("mysql", "redis"),
    ("redis", "mysql"),
    ("mysql", "sqlite"),
    ("sqlite", "mysql"),
    ("redis", "sqlite"),
    ("sqlite", "redis"),
]


class Crash(Exception):
    """The process dies here."""


class Interrupted:
    """A store whose ``method`` fails on its ``at``-th call (counting from 0)."""

    def __init__(self, store, method: str, at: int) -> None:
        self._store, self._method, self._at, self.calls = store, method, at, 0

    def __getattr__(self, name):
        attr = getattr(self._store, name)
        if name != self._method:
            return attr

        async def wrapped(*args):
            self.calls += 1
            if self.calls - 1 == self._at:
                raise Crash(name)
            return await attr(*args)

        return wrapped


@pytest.fixture
def open_store(request, tmp_path, clock):
    opened = []

    def open_(backend: str):
        if backend == "mysql":
            mariadb = request.getfixturevalue("mariadb")
            store = open_mysql_store(mariadb, mariadb.create_database("worker"), clock)
        elif backend == "sqlite":
            store = open_sqlite_store(tmp_path / f"q{len(opened)}.sqlite3", clock)
        else:
            redis_server = request.getfixturevalue("redis_server")
            store = open_redis_store(redis_server, redis_server.unique_prefix("mig"), clock)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        pytest_twisted.blockon(Deferred.fromCoroutine(store.close()))


def _shape(task) -> tuple:
    """Everything a move keeps: all but the id and payload id."""
    j = task.to_json()
    for key in ("id", "dataID"):
        j.pop(key)
    return tuple(sorted((k, json.dumps(v)) for k, v in j.items()))


async def _everything(store) -> list:
    return await store.export_tasks(await store.active_ids())


async def _seed_states(store, clock) -> None:
    """Tasks in every state a stopped queue can hold."""
    phid = "PHID-TASK-tzdxqbs3s4qsrzbtcoun"
    for i in range(12):
        await store.enqueue(
            EnqueueRequest(
                f"C{i % 3}",
                json.dumps({"i": i, "t": "é ✓ 😀"}),
                priority=1000 + 500 * (i % 4),
                object_phid=phid if i % 2 else None,
                container_phid="PHID-X" if i % 5 else None,
                delay_until=T0 + 900 if i == 4 else None,
            )
        )
    clock.advance(2)
    leased = await store.lease("host:1:2:gorge-worker", 5, 600)
    await store.fail(leased[0].id, False, 120)  # backing off, failed once
    await store.yield_(leased[1].id, 300)  # yielded
    await store.fail(leased[2].id, False, 0)
    clock.advance(5)  # leased[3:], still held
    await store.cancel(12)  # archived: stays behind


async def _migrate(source, target, source_name, target_name, clock, batch):
    return await Migration(
        source,
        target,
        source_name=source_name,
        target_name=target_name,
        batch=batch,
        now=clock.seconds,
    ).run()


@pytest.mark.parametrize("source_name, target_name", PAIRS)
@pytest_twisted.ensureDeferred
async def test_every_column_moves_and_nothing_else(open_store, clock, source_name, target_name):
    source, target = open_store(source_name), open_store(target_name)
    await _seed_states(source, clock)
    await target.enqueue(EnqueueRequest("AlreadyThere", "x"))  # the target keeps its own
    before = await _everything(source)
    archived_before = await source.get_archived(12)
    summary = await _migrate(source, target, source_name, target_name, clock, batch=4)
    assert (summary.total, summary.moved, summary.finished) == (11, 11, 0)
    assert summary.held == 2
    assert await source.active_ids() == []
    assert await source.get_archived(12) == archived_before
    after = await _everything(target)
    assert Counter(map(_shape, after)) == Counter(map(_shape, before)) + Counter(
        [_shape((await target.export_tasks([1]))[0])]
    )
    assert [t.data for t in after[1:]] == [t.data for t in before]  # id order kept
    assert await target.migration_mark(ledger_name(source_name)) is None
    stats = await target.stats()
    assert (stats.active, stats.failed) == (12, 2)
    # The moved tasks behave in the target: once the leases, the back-off and
    # the yield are over, everything is leased but the task delayed for longer.
    clock.advance(600)
    leased = await target.lease("w2", 20, 60)
    assert len(leased) == 11
    assert not any('"i": 4,' in t.data for t in leased)


async def _seed_many(store, backend: str, n: int) -> None:
    if backend == "redis":

        async def lane(k: int) -> None:
            for i in range(k, n, 16):
                await store.enqueue(
                    EnqueueRequest(f"C{i % 7}", f'{{"i":{i}}}', priority=1000 * (1 + i % 3))
                )

        await gatherResults([Deferred.fromCoroutine(lane(k)) for k in range(16)])
        return

    def insert(txn) -> None:
        mark = "%s" if backend == "mysql" else "?"
        for i in range(n):
            txn.execute(f"INSERT INTO worker_taskdata (data) VALUES ({mark})", (f'{{"i":{i}}}',))
        txn.execute("SELECT id FROM worker_taskdata ORDER BY id")
        data_ids = [int(r[0]) for r in txn.fetchall()]
        marks = ", ".join([mark] * 7)
        rows = [(i + 1, f"C{i % 7}", 0, data_ids[i], 1000 * (1 + i % 3), T0, T0) for i in range(n)]
        txn.executemany(
            "INSERT INTO worker_activetask (id, taskClass, failureCount, dataID, priority,"
            f" dateCreated, dateModified) VALUES ({marks})",
            rows,
        )
        txn.execute(
            f"INSERT INTO lisk_counter (counterName, counterValue) VALUES ({mark}, {mark})",
            ("worker_activetask", n),
        )

    if backend == "sqlite":

        def wrapped(txn) -> None:
            txn.execute("BEGIN IMMEDIATE")
            insert(txn)

        await store.db.pool.runInteraction(wrapped)
    else:
        await store.db.pool.runInteraction(insert)


@pytest.mark.time_limit(900)
@pytest.mark.parametrize("source_name, target_name", [("mysql", "redis"), ("redis", "sqlite")])
@pytest_twisted.ensureDeferred
async def test_ten_thousand_tasks_interrupted_halfway_arrive_exactly_once(
    open_store, clock, source_name, target_name
):
    n, batch = 10_000, 500
    source, target = open_store(source_name), open_store(target_name)
    await _seed_many(source, source_name, n)
    expected = Counter(f'{{"i":{i}}}' for i in range(n))
    assert Counter(t.data for t in await _everything(source)) == expected
    # The worst moment: batch 11 is in the target, and the process dies
    # before it leaves the source.
    crashing = Interrupted(source, "delete_tasks", at=10)
    first = Migration(
        crashing,
        target,
        source_name=source_name,
        target_name=target_name,
        batch=batch,
        now=clock.seconds,
    )
    with pytest.raises(Crash):
        await first.run()
    assert first.summary.moved == 10 * batch
    assert len(await target.active_ids()) == 11 * batch
    assert len(await source.active_ids()) == n - 10 * batch
    mark = await target.migration_mark(ledger_name(source_name))
    assert mark is not None
    dry = await Migration(
        source,
        target,
        source_name=source_name,
        target_name=target_name,
        batch=batch,
        now=clock.seconds,
    ).run(dry_run=True)
    assert (dry.finished, sum(dry.by_class.values())) == (batch, n - 11 * batch)
    summary = await _migrate(source, target, source_name, target_name, clock, batch)
    assert (summary.finished, summary.moved) == (batch, n - 11 * batch)
    moved = await _everything(target)
    assert Counter(t.data for t in moved) == expected  # each exactly once
    assert len(moved) == n
    assert await source.active_ids() == []
    assert await target.migration_mark(ledger_name(source_name)) is None
    assert (await target.stats()).active == n


@pytest.mark.parametrize(
    "method, at", [("import_tasks", 3), ("export_tasks", 2), ("clear_migration_mark", 0)]
)
@pytest.mark.parametrize("source_name, target_name", [("sqlite", "redis"), ("redis", "mysql")])
@pytest_twisted.ensureDeferred
async def test_an_interruption_anywhere_is_finished_by_a_rerun(
    open_store, clock, method, at, source_name, target_name
):
    source, target = open_store(source_name), open_store(target_name)
    for i in range(40):
        await source.enqueue(EnqueueRequest("A", str(i)))
    broken_target = Interrupted(target, method, at) if method != "export_tasks" else target
    broken_source = Interrupted(source, method, at) if method == "export_tasks" else source
    with pytest.raises(Crash):
        await Migration(
            broken_source,
            broken_target,
            source_name=source_name,
            target_name=target_name,
            batch=7,
            now=clock.seconds,
        ).run()
    await _migrate(source, target, source_name, target_name, clock, 7)
    assert sorted(t.data for t in await _everything(target)) == sorted(str(i) for i in range(40))
    assert await source.active_ids() == []


@pytest_twisted.ensureDeferred
async def test_a_batch_is_cut_by_payload_size_too(monkeypatch):
    from gorge.taskqueue import migrate

    clock = ttask.Clock()
    clock.advance(T0)
    source, target = MemoryTaskStore(clock), MemoryTaskStore(clock)
    for _ in range(6):
        await source.enqueue(EnqueueRequest("A", "x" * 400))
    monkeypatch.setattr(migrate, "MAX_BATCH_BYTES", 1000)
    imports = []
    original = target.import_tasks

    async def recorded(tasks, ledger, mark):
        imports.append([t.id for t in tasks])
        return await original(tasks, ledger, mark)

    target.import_tasks = recorded
    await Migration(
        source, target, source_name="sqlite", target_name="redis", batch=5, now=clock.seconds
    ).run()
    assert imports == [[1, 2], [3, 4], [5], [6]]
