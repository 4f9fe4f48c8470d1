"""The embedded backend's own file: PHIDs keep their text, also in
a file an earlier version created with VARBINARY (NUMERIC affinity) columns."""

from __future__ import annotations

import sqlite3

import pytest_twisted
from twisted.internet.defer import Deferred

from gorge.taskqueue.model import EnqueueRequest
from gorge.taskqueue.sqlite import SCHEMA
from tests.taskqueue.conftest import open_sqlite_store

OLD_SCHEMA = SCHEMA.replace("objectPHID TEXT", "objectPHID VARBINARY(64)").replace(
    "containerPHID TEXT", "containerPHID VARBINARY(64)"
)


def _indexes(path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}


@pytest_twisted.ensureDeferred
async def test_an_old_file_is_rebuilt_once_keeping_its_rows_and_indexes(tmp_path, clock):
    path = str(tmp_path / "old.sqlite3")
    with sqlite3.connect(path) as conn:
        conn.executescript(OLD_SCHEMA)
        conn.execute("INSERT INTO worker_taskdata (data) VALUES ('{}')")
        conn.execute("INSERT INTO lisk_counter VALUES ('worker_activetask', 1)")
        conn.execute(
            "INSERT INTO worker_activetask VALUES"
            " (1, 'A', NULL, NULL, 0, 1, NULL, 2000, 'PHID-TASK-x', 5, 5, NULL)"
        )
        conn.execute(
            "INSERT INTO worker_archivetask VALUES"
            " (7, 'A', NULL, NULL, 0, 1, 0, 9, 5, 6, 2000, 'PHID-TASK-y', 6, NULL)"
        )
    conn.close()
    before = _indexes(path)
    store = open_sqlite_store(path, clock)
    try:
        kept = await store.get_task(1)
        assert (kept.object_phid, kept.data) == ("PHID-TASK-x", "{}")
        assert (await store.get_archived(7)).object_phid == "PHID-TASK-y"
        task = await store.enqueue(EnqueueRequest("A", object_phid="0042", container_phid="1e5"))
        got = await store.get_task(task.id)
        assert (task.id, got.object_phid, got.container_phid) == (2, "0042", "1e5")
        archived = await store.cancel(task.id)
        assert (await store.get_archived(archived.id)).container_phid == "1e5"
    finally:
        await Deferred.fromCoroutine(store.close())
    assert _indexes(path) == before
    with sqlite3.connect(path) as conn:
        tables = [r[0] for r in conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table'")]
    conn.close()
    assert not any("VARBINARY" in sql for sql in tables)
    assert not any("_rebuilt" in sql for sql in tables)
