"""Task queue value objects, constants and JSON shaping.

Every backend converts its storage rows into :class:`Task` / :class:`ArchivedTask`
and the HTTP layer turns those into JSON with :meth:`Task.to_json` and
:meth:`ArchivedTask.to_json`, so the wire shape is decided in exactly one place.

Conventions every backend follows:

* "now" is the store's clock in whole epoch seconds (:mod:`gorge.taskqueue.store`).
* NULL columns are ``None`` here.  An empty string in ``leaseOwner``,
  ``objectPHID`` or ``containerPHID`` is treated as NULL (Redis stores NULL as
  ``""``); :func:`task_from_columns` does that normalisation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

# Phorge PhabricatorWorker priority bands; lower runs first.
PRIORITY_ALERTS = 1000
PRIORITY_DEFAULT = 2000
PRIORITY_COMMIT = 2500
PRIORITY_BULK = 3000
PRIORITY_INDEX = 3500
PRIORITY_IMPORT = 4000

# PhabricatorWorker::YIELD_OWNER; Phorge's own code compares against it.
YIELD_OWNER = "(yield)"
AWAKEN_WINDOW = 3600
MIN_YIELD = 5

# PhabricatorWorkerArchiveTask::RESULT_*
RESULT_SUCCESS = 0
RESULT_FAILURE = 1
RESULT_CANCELLED = 2

# Column limits of Phorge's worker_activetask (schema/phabricator_worker.sql).
MAX_TASK_CLASS_CHARS = 64
MAX_OWNER_CHARS = 64
MAX_PHID_BYTES = 64
UINT32_MAX = 4294967295
UINT64_MAX = 18446744073709551615

MAX_LEASE_LIMIT = 1000
DEFAULT_LIST_LIMIT = 100
MAX_LIST_LIMIT = 1000

DEFAULT_LEASE_DURATION = 7200
DEFAULT_RETRY_WAIT = 300

COUNTER_NAME = "worker_activetask"

TASK_COLUMNS = (
    "id",
    "taskClass",
    "leaseOwner",
    "leaseExpires",
    "failureCount",
    "dataID",
    "failureTime",
    "priority",
    "objectPHID",
    "containerPHID",
    "dateCreated",
    "dateModified",
)

ARCHIVE_COLUMNS = (
    "id",
    "taskClass",
    "leaseOwner",
    "leaseExpires",
    "failureCount",
    "dataID",
    "priority",
    "objectPHID",
    "containerPHID",
    "dateCreated",
    "dateModified",
    "result",
    "duration",
    "archivedEpoch",
)


class InvalidArgument(ValueError):
    """A request value that must not reach storage; the API answers 400 with ``message``.

    Stores raise it when a value they compute (``now + retryWait``, ``now + yield``)
    would not fit the unsigned 32-bit column, *before* writing anything.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def check_u32(field: str, value: int) -> int:
    """Return ``value`` or raise :class:`InvalidArgument` if it is outside 0..2^32-1."""
    if value < 0:
        raise InvalidArgument(field, f"{field} must be >= 0")
    if value > UINT32_MAX:
        raise InvalidArgument(field, f"{field} is too large")
    return value


@dataclass(frozen=True)
class EnqueueRequest:
    """A validated enqueue.  ``delay_until`` is None unless > 0."""

    task_class: str
    data: str = ""
    priority: int = PRIORITY_DEFAULT
    object_phid: str | None = None
    container_phid: str | None = None
    delay_until: int | None = None

    def new_task(self, task_id: int, data_id: int, now: int) -> Task:
        """The row this request becomes when stored as ``task_id`` at ``now``."""
        return Task(
            id=task_id,
            task_class=self.task_class,
            lease_owner=None,
            lease_expires=self.delay_until,
            failure_count=0,
            data_id=data_id,
            failure_time=None,
            priority=self.priority,
            object_phid=self.object_phid or None,
            container_phid=self.container_phid or None,
            date_created=now,
            date_modified=now,
        )


# Follow-up tasks a success report may carry (docs/taskqueue.md, Follow-up tasks).
MAX_FOLLOWUPS = 1000


@dataclass(frozen=True)
class Followup:
    """A task a completing task queues: an enqueue stored in the same atomic
    step as its parent's archive.  ``inherits_priority``: the request named
    no priority, so the child takes its parent's, as Phorge's taskmaster
    gives it (``enqueue.priority`` is then only the parser's default)."""

    enqueue: EnqueueRequest
    inherits_priority: bool = False

    def request(self, parent_priority: int) -> EnqueueRequest:
        """What is stored for this child of a parent of ``parent_priority``."""
        if self.inherits_priority:
            return replace(self.enqueue, priority=parent_priority)
        return self.enqueue


@dataclass(frozen=True)
class Task:
    """One row of ``worker_activetask`` (+ its payload when loaded).

    ``data`` is None when the payload was not loaded (list endpoint, enqueue
    answer) and the payload string otherwise.
    """

    id: int
    task_class: str
    lease_owner: str | None
    lease_expires: int | None
    failure_count: int
    data_id: int
    failure_time: int | None
    priority: int
    object_phid: str | None
    container_phid: str | None
    date_created: int
    date_modified: int
    data: str | None = None

    def without_data(self) -> Task:
        return replace(self, data=None)

    def is_held(self, now: int) -> bool:
        """Owner set and lease not yet expired (yielded tasks count)."""
        expires = self.lease_expires
        return bool(self.lease_owner) and expires is not None and expires >= now

    def to_json(self) -> dict[str, Any]:
        """Absent keys stay absent; failureCount always present."""
        out = _row_json(self, self.failure_time)
        if self.data:
            out["data"] = self.data
        return out


@dataclass(frozen=True)
class ArchivedTask:
    """One row of ``worker_archivetask`` (no failureTime, no payload)."""

    id: int
    task_class: str
    lease_owner: str | None
    lease_expires: int | None
    failure_count: int
    data_id: int
    priority: int
    object_phid: str | None
    container_phid: str | None
    date_created: int
    date_modified: int
    result: int
    duration: int
    archived_epoch: int

    def to_json(self) -> dict[str, Any]:
        out = _row_json(self, None)
        out["result"] = self.result
        out["duration"] = self.duration
        out["archivedEpoch"] = self.archived_epoch
        return out


def _row_json(row: Task | ArchivedTask, failure_time: int | None) -> dict[str, Any]:
    """The keys an active and an archived task share, in the answer's order;
    absent keys stay absent (``failure_time`` is the active task's only)."""
    out: dict[str, Any] = {"id": row.id, "taskClass": row.task_class}
    if row.lease_owner:
        out["leaseOwner"] = row.lease_owner
    if row.lease_expires is not None:
        out["leaseExpires"] = row.lease_expires
    out["failureCount"] = row.failure_count
    out["dataID"] = row.data_id
    if failure_time is not None:
        out["failureTime"] = failure_time
    out["priority"] = row.priority
    if row.object_phid:
        out["objectPHID"] = row.object_phid
    if row.container_phid:
        out["containerPHID"] = row.container_phid
    out["dateCreated"] = row.date_created
    out["dateModified"] = row.date_modified
    return out


@dataclass(frozen=True)
class Completion:
    """What a success with follow-ups did: the archive row, and the children
    it inserted, in the order given (none when the report was a replay)."""

    archived: ArchivedTask
    children: tuple[Task, ...] = ()


def archive_of(task: Task, *, result: int, duration: int, now: int) -> ArchivedTask:
    """The archive row written for ``task``: owner/expiry copied as they stand."""
    return ArchivedTask(
        id=task.id,
        task_class=task.task_class,
        lease_owner=task.lease_owner,
        lease_expires=task.lease_expires,
        failure_count=task.failure_count,
        data_id=task.data_id,
        priority=task.priority,
        object_phid=task.object_phid,
        container_phid=task.container_phid,
        date_created=task.date_created,
        date_modified=now,
        result=result,
        duration=duration,
        archived_epoch=now,
    )


# Why a task is in the wrong state for an operator action (API: 409 ERR_TASK_STATE).
ACTIVE_NOT_ARCHIVED = "task is active, not archived"
SUCCEEDED = "task already succeeded"
ARCHIVED_NOT_ACTIVE = "task is archived, not active"
NOT_LEASED = "task has no lease"


def requeue_request(archived: ArchivedTask, data: str) -> EnqueueRequest:
    """What a requeue enqueues again: class, payload, priority and PHIDs."""
    return EnqueueRequest(
        task_class=archived.task_class,
        data=data,
        priority=archived.priority,
        object_phid=archived.object_phid,
        container_phid=archived.container_phid,
    )


def unarchived(archived: ArchivedTask, now: int) -> Task:
    """The active row Phorge's ``unarchiveTask()`` writes back (``bin/worker
    retry``): same id, payload row, class, priority, PHIDs and dateCreated;
    never leased with ``leaseExpires = 0``, so phase 2 takes it at once."""
    return Task(
        id=archived.id,
        task_class=archived.task_class,
        lease_owner=None,
        lease_expires=0,
        failure_count=0,
        data_id=archived.data_id,
        failure_time=None,
        priority=archived.priority,
        object_phid=archived.object_phid,
        container_phid=archived.container_phid,
        date_created=archived.date_created,
        date_modified=now,
    )


# What one entry of a batched result report asks for (docs/taskqueue.md,
# Batched reports).
REPORT_COMPLETE = "complete"
REPORT_FAIL = "fail"
REPORT_YIELD = "yield"
REPORT_OUTCOMES = (REPORT_COMPLETE, REPORT_FAIL, REPORT_YIELD)
MAX_REPORTS = 1000


@dataclass(frozen=True)
class Report:
    """One result report: what ``complete``, ``fail`` or ``yield`` would ask.

    ``duration`` is microseconds for a complete and seconds for a yield (the
    store raises it to the 5 s minimum); ``permanent`` and ``retry_wait``
    only matter for a failure, ``followups`` only for a complete.
    """

    task_id: int
    outcome: str
    duration: int = 0
    permanent: bool = False
    retry_wait: int = 0
    followups: tuple[Followup, ...] = ()
    message: str = ""  # a failure's error text, for its note (gorge/taskqueue/failures.py)

    @property
    def archives(self) -> bool:
        """A complete or a permanent failure: the task leaves the active table."""
        return self.outcome == REPORT_COMPLETE or (self.outcome == REPORT_FAIL and self.permanent)


@dataclass(frozen=True)
class ReportResult:
    """The answer to one :class:`Report`: the task's class when it was
    recorded (empty for a yield, which reads no row), else the error the
    single call would have raised
    (``TaskNotFound``, ``LeaseConflict`` or ``InvalidArgument``).
    ``children``: the follow-ups a complete inserted (none on a replay)."""

    task_id: int
    task_class: str = ""
    error: Exception | None = None
    children: tuple[Task, ...] = ()


RESULT_NAMES = {"success": RESULT_SUCCESS, "failure": RESULT_FAILURE, "cancelled": RESULT_CANCELLED}


@dataclass(frozen=True)
class Stats:
    """Computed live from storage."""

    active: int
    leased: int
    archived: int
    failed: int

    def to_json(self) -> dict[str, int]:
        return {
            "activeCount": self.active,
            "leasedCount": self.leased,
            "archivedCount": self.archived,
            "failedCount": self.failed,
        }


def _text(value: Any) -> str | None:
    """NULL and "" -> None; bytes (pymysql VARBINARY) decoded."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value).decode("utf-8")
    value = str(value)
    return value or None


def _int(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("ascii")
    if isinstance(value, str):
        if value == "":
            return None
        return int(value)
    return int(value)


def _required_int(value: Any) -> int:
    parsed = _int(value)
    if parsed is None:
        raise TypeError(f"expected an integer column, got {value!r}")
    return parsed


def task_from_columns(cols: Mapping[str, Any], data: Any = None) -> Task:
    """Build a Task from Phorge column names (SQL row dict or Redis hash)."""
    payload = None
    if data is not None:
        payload = bytes(data).decode("utf-8") if isinstance(data, (bytes, bytearray)) else str(data)
    return Task(
        id=_required_int(cols["id"]),
        task_class=_text(cols["taskClass"]) or "",
        lease_owner=_text(cols.get("leaseOwner")),
        lease_expires=_int(cols.get("leaseExpires")),
        failure_count=_int(cols.get("failureCount")) or 0,
        data_id=_required_int(cols["dataID"]),
        failure_time=_int(cols.get("failureTime")),
        priority=_required_int(cols["priority"]),
        object_phid=_text(cols.get("objectPHID")),
        container_phid=_text(cols.get("containerPHID")),
        date_created=_required_int(cols["dateCreated"]),
        date_modified=_required_int(cols["dateModified"]),
        data=payload,
    )


def archived_from_columns(cols: Mapping[str, Any]) -> ArchivedTask:
    """Build an ArchivedTask from ``worker_archivetask`` column names."""
    return ArchivedTask(
        id=_required_int(cols["id"]),
        task_class=_text(cols["taskClass"]) or "",
        lease_owner=_text(cols.get("leaseOwner")),
        lease_expires=_int(cols.get("leaseExpires")),
        failure_count=_int(cols.get("failureCount")) or 0,
        data_id=_required_int(cols["dataID"]),
        priority=_required_int(cols["priority"]),
        object_phid=_text(cols.get("objectPHID")),
        container_phid=_text(cols.get("containerPHID")),
        date_created=_required_int(cols["dateCreated"]),
        date_modified=_required_int(cols["dateModified"]),
        result=_required_int(cols["result"]),
        duration=_required_int(cols["duration"]),
        archived_epoch=int(_int(cols["archivedEpoch"]) or 0),
    )


def sort_key(task: Task) -> tuple[int, int]:
    """Queue order everywhere: priority ASC, id ASC."""
    return (task.priority, task.id)
