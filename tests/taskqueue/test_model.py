"""JSON shaping rules hold for every task."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gorge.taskqueue.model import (
    UINT32_MAX,
    ArchivedTask,
    Task,
    archive_of,
    archived_from_columns,
    task_from_columns,
)

u32 = st.integers(0, UINT32_MAX)
maybe_u32 = st.none() | u32
maybe_text = st.none() | st.text(min_size=1, max_size=64)

tasks = st.builds(
    Task,
    id=st.integers(1, UINT32_MAX),
    task_class=st.text(min_size=1, max_size=64),
    lease_owner=maybe_text,
    lease_expires=maybe_u32,
    failure_count=u32,
    data_id=st.integers(1, UINT32_MAX),
    failure_time=maybe_u32,
    priority=u32,
    object_phid=maybe_text,
    container_phid=maybe_text,
    date_created=u32,
    date_modified=u32,
    data=st.none() | st.text(max_size=20),
)


def _ints_are_ints(out: dict) -> bool:
    ints = {
        "id",
        "leaseExpires",
        "failureCount",
        "dataID",
        "failureTime",
        "priority",
        "dateCreated",
        "dateModified",
        "result",
        "duration",
        "archivedEpoch",
    }
    return all(type(out[k]) is int for k in ints & out.keys())


@given(tasks)
def test_task_json_keeps_absent_keys_absent(task):
    out = task.to_json()
    assert None not in out.values() and "" not in out.values()
    assert {
        "id",
        "taskClass",
        "failureCount",
        "dataID",
        "priority",
        "dateCreated",
        "dateModified",
    } <= out.keys()
    assert ("leaseExpires" in out) == (task.lease_expires is not None)
    assert ("failureTime" in out) == (task.failure_time is not None)
    assert ("data" in out) == bool(task.data)
    assert _ints_are_ints(out)


@given(tasks)
def test_storage_columns_round_trip(task):
    """A row read back (SQL tuple, bytes PHIDs, or Redis strings) is the same task."""
    cols = task.to_json()
    as_redis = {
        k: ("" if v is None else str(v))
        for k, v in {
            "id": task.id,
            "taskClass": task.task_class,
            "leaseOwner": task.lease_owner,
            "leaseExpires": task.lease_expires,
            "failureCount": task.failure_count,
            "dataID": task.data_id,
            "failureTime": task.failure_time,
            "priority": task.priority,
            "objectPHID": task.object_phid,
            "containerPHID": task.container_phid,
            "dateCreated": task.date_created,
            "dateModified": task.date_modified,
        }.items()
    }
    as_mysql = dict(cols, objectPHID=(task.object_phid or "").encode() or None)
    assert task_from_columns(as_redis, task.data) == task
    assert task_from_columns(as_mysql, task.data).to_json() == cols


@given(tasks, st.sampled_from([0, 1, 2]), st.integers(0, 2**63 - 1), u32)
def test_archive_drops_failure_time_and_data(task, result, duration, now):
    archived = archive_of(task, result=result, duration=duration, now=now)
    out = archived.to_json()
    assert "failureTime" not in out and "data" not in out
    assert (out["result"], out["duration"], out["archivedEpoch"], out["dateModified"]) == (
        result,
        duration,
        now,
        now,
    )
    assert out["failureCount"] == task.failure_count and _ints_are_ints(out)
    cols = dict(out)
    assert archived_from_columns(cols) == archived
    assert isinstance(archived, ArchivedTask)
