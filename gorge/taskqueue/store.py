"""The one ``TaskStore`` interface every backend implements.

Conventions (all backends, pinned so the behaviour tests can compare them):

* "now" is read once per call, at the start of the call, in whole epoch
  seconds, from the store's clock: the database server's on MySQL and the
  Redis server's on Redis (:mod:`gorge.db.clock`: every host sharing the
  queue agrees on it), the injected ``clock: IReactorTime`` on SQLite and
  in memory (docs/taskqueue.md, Clocks).
* Arguments reaching a store are already type-checked by the API (ints are
  ints, strings are strings, owner <= 64 chars, class names <= 64 chars,
  PHIDs <= 64 UTF-8 bytes, priority/delay within 0..2^32-1).  Values the store
  *computes* from ``now`` (``now + lease_duration``, ``now + retry_wait``,
  ``now + yield duration``) are range-checked by the store with
  :func:`gorge.taskqueue.model.check_u32` before anything is written;
  it raises :class:`~gorge.taskqueue.model.InvalidArgument` (API: 400).
* Unknown ids raise :class:`TaskNotFound` and write nothing.  An unknown id
  is :class:`TaskNotFound` even when the value computed for it would be out
  of range (the memory model and Redis look the id up first); the range
  error is for a task that exists.
* Ids: task ids and payload ids are two separate sequences starting at 1 on
  an empty store (MySQL/SQLite: ``lisk_counter`` row ``worker_activetask`` and
  ``worker_taskdata`` AUTO_INCREMENT; Redis: ``next_task_id``/``next_data_id``).
* Every failure of the backend itself (connection, SQL error, timeout)
  propagates as whatever exception the driver raised; the API turns it into
  the opaque 500.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from twisted.internet.defer import Deferred
from twisted.logger import LogLevel
from twisted.python.failure import Failure

from gorge.db.clock import StoreTime
from gorge.log.logger import Logger
from gorge.taskqueue.model import (
    REPORT_COMPLETE,
    REPORT_FAIL,
    ArchivedTask,
    Completion,
    EnqueueRequest,
    Followup,
    InvalidArgument,
    Report,
    ReportResult,
    Stats,
    Task,
)
from gorge.taskqueue.waiting import Waiting


class TaskNotFound(LookupError):
    """The id is not an active task (and, for complete, no successful archive row)."""

    def __init__(self, task_id: int) -> None:
        super().__init__(f"task {task_id} not found")
        self.task_id = task_id


class LeaseConflict(Exception):
    """A fenced call named a lease owner that no longer holds the task (API: 409).

    Raised when the task is active but held by someone else (its lease expired
    and another owner leased it, or it was freed), or when it was archived by
    another call (a cancel, or someone else's complete).
    """

    def __init__(self, task_id: int) -> None:
        super().__init__(f"task {task_id} is no longer held by this owner")
        self.task_id = task_id


class TaskStateError(Exception):
    """The task exists but is in the wrong state for the operation (API: 409
    ``ERR_TASK_STATE``); ``message`` says which and what to do."""

    def __init__(self, task_id: int, message: str) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.message = message


@runtime_checkable
class TaskStore(Protocol):
    """The queue operations.  All methods are coroutines (``async def``)."""

    #: Where "now" comes from (see the conventions above).
    time: StoreTime

    async def enqueue(self, request: EnqueueRequest) -> Task:
        """Create the payload row and the active task atomically.

        The new task: ``failureCount`` 0, ``failureTime`` None, ``leaseOwner``
        None, ``leaseExpires`` = ``request.delay_until`` (None when not delayed),
        ``dateCreated`` = ``dateModified`` = now.  Returns the Task with
        ``data=None`` (the answer does not echo the payload).
        """
        ...

    async def lease(
        self,
        owner: str,
        limit: int,
        lease_duration: int,
        task_classes: Sequence[str] | None = None,
    ) -> list[Task]:
        """Claim up to ``limit`` tasks for ``owner`` until ``now + lease_duration``.

        Phase 1: ``leaseOwner IS NULL AND leaseExpires IS NULL``, priority ASC, id ASC.
        Phase 2 (only if phase 1 claimed fewer than ``limit``): ``leaseExpires < now``
        (strictly; regardless of owner), priority ASC, id ASC, up to the remainder.
        ``task_classes`` empty/None = every class; otherwise only those classes are
        considered and no other row is touched.  Each claim is conditional (re-checks
        its phase predicate), sets only ``leaseOwner = owner`` and ``leaseExpires = exp``
        and leaves ``dateModified`` unchanged.  Returns exactly the tasks this call
        claimed, with ``data`` loaded ("" when the payload row is missing), sorted
        priority ASC, id ASC.  ``limit`` is >= 1 (the API clamps it).
        """
        ...

    async def complete(self, task_id: int, duration: int, owner: str | None = None) -> ArchivedTask:
        """Archive with result 0 and ``duration`` µs.

        Archive row: the active row's columns except failureTime, ``dateModified``
        = ``archivedEpoch`` = now, owner/expiry copied as they stand; the active row
        is deleted in the same transaction; the payload row is kept.
        Not active but archived with result 0 -> return that archived row unchanged
        (idempotent replay, nothing written).  Otherwise :class:`TaskNotFound`.

        Fencing (see the note after :meth:`yield_`): with ``owner`` given, the
        replay applies only to an archive row carrying that owner.
        """
        ...

    async def complete_with_followups(
        self,
        task_id: int,
        duration: int,
        followups: Sequence[Followup],
        owner: str | None = None,
    ) -> Completion:
        """:meth:`complete`, and in the same atomic step (one transaction, one
        Lua script) every follow-up enqueued as :meth:`enqueue` would, in the
        order given, a child without a priority taking its parent's
        (docs/taskqueue.md, Follow-up tasks).  Either the archive and every
        child are written or nothing is.  The replay of :meth:`complete`
        answers the archive row and inserts nothing: a child is never
        inserted twice for one parent.
        """
        ...

    async def fail(
        self, task_id: int, permanent: bool, retry_wait: int, owner: str | None = None
    ) -> ArchivedTask | Task | None:
        """Report a failure.

        ``permanent``: archive with result 1, duration 0 and return the ArchivedTask.
        Temporary: ``failureCount += 1``, ``failureTime = now``, ``leaseOwner = None``,
        ``leaseExpires = now + retry_wait``, ``dateModified = now``; returns the
        updated Task without data (backends SHOULD; None is tolerated by the API,
        which then only loses the task class label of the failure metric).
        Unknown (not active) id -> :class:`TaskNotFound` in both cases.
        """
        ...

    async def yield_(self, task_id: int, duration: int, owner: str | None = None) -> None:
        """``leaseOwner = '(yield)'``, ``leaseExpires = now + max(duration, 5)``,
        ``dateModified = now``; failureCount unchanged.  Unknown id ->
        :class:`TaskNotFound` (existence decided by a read, not by a changed-row count).
        """
        ...

    # fenced: complete, fail and yield_ take the lease owner the caller leased
    # the task with.  ``owner=None`` is the unfenced r4 behaviour above.  With
    # an owner, checked in the same atomic step as the change:
    #   * active and ``leaseOwner == owner`` -> the change as above (an expired
    #     lease nobody has taken over still belongs to its holder);
    #   * active with another (or no) owner -> :class:`LeaseConflict`;
    #   * not active but archived -> :class:`LeaseConflict`, except the
    #     complete replay of a success archived with this owner;
    #   * neither -> :class:`TaskNotFound`.
    # Order of the checks: not found, then conflict, then the range of a
    # computed expiry (InvalidArgument); nothing is written unless all pass.

    async def report(
        self, reports: Sequence[Report], owner: str | None = None
    ) -> list[ReportResult]:
        """Record many result reports at once, in one transaction (or one Lua
        script): each as :meth:`complete_with_followups`, :meth:`fail` or
        :meth:`yield_` would, fenced by ``owner`` alike, answered one :class:`ReportResult`
        each, in order.  A report refused by the rules of its single call
        (not found, lease conflict, an expiry out of range) writes nothing and
        does not stop the others; a backend failure fails the whole call and
        writes nothing.  Reports of one id apply in the order given.
        """
        ...

    async def renew(
        self, owner: str, task_ids: Sequence[int], duration: int
    ) -> dict[int, int | None]:
        """Extend the leases ``owner`` holds on ``task_ids`` (docs/taskqueue.md, Renewal).

        For every distinct id, in the order given: if the task is active and
        ``leaseOwner == owner`` (expired or not, as for fencing), ``leaseExpires``
        becomes ``max(leaseExpires, now + duration)`` and the answer is that value;
        otherwise (unknown, archived, held by someone else, freed) the answer is
        None ("lost") and nothing is written for it.  ``dateModified`` is not
        touched (a lease never changes it).  ``now + duration`` out of the
        unsigned 32-bit range raises InvalidArgument before anything is written.
        """
        ...

    async def cancel(self, task_id: int) -> ArchivedTask:
        """Archive with result 2, duration 0, owner/expiry copied.
        Unknown (not active) id -> :class:`TaskNotFound` (no replay rule here)."""
        ...

    async def awaken(self, task_ids: Sequence[int]) -> int:
        """With ``ago = now - 3600``: every listed active task with
        ``leaseOwner == '(yield)'`` and ``leaseExpires > ago`` and
        ``failureCount == 0`` gets ``leaseExpires = ago`` (owner stays, dateModified
        unchanged).  Duplicates count once, unknown ids are ignored.  Returns the
        number of tasks changed.
        """
        ...

    async def stats(self) -> Stats:
        """Active, held (owner non-empty and ``leaseExpires >= now``),
        archived, active with ``failureCount > 0``."""
        ...

    async def oldest_waiting(self) -> Waiting:
        """Per task class and priority band, since when its oldest waiting
        task (no owner and no expiry, or ``leaseExpires < now``) has waited:
        its ``dateCreated``, or its ``leaseExpires`` once that passed. Read
        from the heads of the queue only (gorge/taskqueue/waiting.py)."""
        ...

    async def list_tasks(self, limit: int, offset: int) -> list[Task]:
        """Active tasks, priority ASC, id ASC, paged; ``data`` is None.
        ``limit`` >= 1 and ``offset`` >= 0 (the API clamps them)."""
        ...

    async def get_task(self, task_id: int) -> Task:
        """One active task with ``data`` loaded; not active -> :class:`TaskNotFound`."""
        ...

    async def get_archived(self, task_id: int) -> ArchivedTask | None:
        """The archived row with this id, or None (used by tests and replays)."""
        ...

    # -- dead tasks (docs/taskqueue.md, Dead tasks) ----------------------------

    async def list_archived(
        self, result: int | None, task_class: str | None, limit: int, offset: int
    ) -> list[ArchivedTask]:
        """Archived tasks, newest first (``dateModified`` DESC, id DESC; the
        archive time for every row we write), optionally only one ``result``
        and one ``task_class``, paged by ``limit`` (>= 1) / ``offset`` (>= 0)."""
        ...

    async def requeue(self, task_id: int) -> Task:
        """A new active task from an archived one: same class, payload, priority
        and PHIDs; failureCount 0, never leased, ``dateCreated`` =
        ``dateModified`` = now, a new id and payload id.  The archive row stays.
        Returns the new Task (without data).  Archived as a success, or active
        -> :class:`TaskStateError`; neither -> :class:`TaskNotFound`."""
        ...

    # -- operator verbs, as Phorge's bin/worker (docs/taskqueue.md, Operator verbs) --
    # Each answers the changed Task (without data).  An id that is archived
    # raises TaskStateError (ARCHIVED_NOT_ACTIVE) for the first three, an
    # unknown one TaskNotFound.  ``dateModified`` becomes now, as Phorge's
    # save() sets it.

    async def delay(self, task_id: int, until: int) -> Task:
        """``leaseOwner = NULL, leaseExpires = until``: not leasable before then.
        A held or yielded task loses its lease as on :meth:`free`, so its
        holder's next renewal answers lost and its handler stops (Phorge's
        ``bin/worker delay`` refuses a leased task instead)."""
        ...

    async def set_priority(self, task_id: int, priority: int) -> Task:
        """A new priority; the task keeps its place among equal priorities by id."""
        ...

    async def free(self, task_id: int) -> Task:
        """Break the lease: ``leaseOwner = NULL``, ``leaseExpires = now`` (leasable
        in phase 2 from the next second).  No owner -> TaskStateError NOT_LEASED."""
        ...

    async def retry(self, task_id: int, repeat: bool) -> Task:
        """Phorge's unarchive: the archived task becomes active again under the
        same id and payload row, never leased with ``leaseExpires = 0``
        (leasable at once), failureCount 0, failureTime NULL, its dateCreated
        kept; the archive row is removed.  Active -> TaskStateError
        ACTIVE_NOT_ARCHIVED; a success without ``repeat`` -> SUCCEEDED."""
        ...

    # -- moving tasks between backends (docs/taskqueue.md, Moving between backends) --
    # A ledger is a named watermark in the target: the highest source id a
    # migration from that source has imported.  It is written in the same
    # atomic step as the tasks, which is what makes an interrupted run safe to
    # run again.

    async def active_ids(self) -> list[int]:
        """Every active task id, ascending."""
        ...

    async def export_tasks(self, task_ids: Sequence[int]) -> list[Task]:
        """The active tasks among ``task_ids``, with data, ascending by id."""
        ...

    async def import_tasks(self, tasks: Sequence[Task], ledger: str, mark: int) -> list[int]:
        """Insert ``tasks`` as new active tasks (new ids and payload rows, every
        other column kept: class, payload, priority, PHIDs, owner, expiry,
        failure count and time, dates) and set ``ledger`` to ``mark``, all in
        one atomic step.  Returns the new ids, in order."""
        ...

    async def migration_mark(self, ledger: str) -> int | None:
        """The watermark of ``ledger``, or None."""
        ...

    async def clear_migration_mark(self, ledger: str) -> None:
        """Forget ``ledger`` (a finished migration)."""
        ...

    async def delete_tasks(self, tasks: Sequence[Task]) -> int:
        """Remove these active tasks and their payloads (they moved elsewhere);
        returns how many were still there."""
        ...

    async def wake_check(self, since: int, now: int) -> tuple[int, bool]:
        """What held lease calls watch (docs/taskqueue.md, Long-poll): a value
        that changes whenever a task is added (the highest task id or the id
        sequence), and whether some active task's ``leaseExpires`` lies in
        ``[since, now)``, i.e. became leasable since the last check.  One
        cheap statement or script; called every few milliseconds while
        anyone waits."""
        ...

    async def ping(self) -> str | None:
        """None when the backend answers, else a short reason (for /readyz).
        Never raises; bounded by the store (<= 5 s)."""
        ...

    async def close(self) -> None:
        """Release connections; the last step of the service stop."""
        ...


_REPORT_ERRORS = (TaskNotFound, LeaseConflict, InvalidArgument)

log = Logger()


def outliving_caller(work: Deferred, abandoned: Callable[[Any], None]) -> Deferred:
    """What ``work`` answers, for a backend call that runs to its end once
    sent (a transaction in a pool thread, a Lua script).  Cancelling the
    answer (the caller went away) leaves ``work`` running and hands its
    eventual result to ``abandoned``: a lease uses it to give back what it
    claimed for nobody, instead of leaving it leased until the lease expires."""
    answer: Deferred = Deferred()

    def relay(result):
        if not answer.called:
            answer.callback(result)
        elif isinstance(result, Failure):
            log.failure("TASKQUEUE_ABANDONED_CALL_FAILED", result, level=LogLevel.warn)
        else:
            abandoned(result)

    work.addBoth(relay)
    return answer


def log_handed_back(owner: str, task_ids: list[int]) -> None:
    log.warn(
        "TASKQUEUE_LEASE_HANDED_BACK owner={owner} task_ids={task_ids} reason={reason}",
        owner=owner,
        task_ids=task_ids,
        reason="the caller went away during the lease",
    )


async def report_each(
    store: TaskStore, reports: Sequence[Report], owner: str | None
) -> list[ReportResult]:
    """:meth:`TaskStore.report` as a series of single calls, for a store
    whose single calls are already atomic and cheap (the in-memory model)."""
    results = []
    for report in reports:
        row: ArchivedTask | Task | None
        children: tuple[Task, ...] = ()
        try:
            if report.outcome == REPORT_COMPLETE:
                done = await store.complete_with_followups(
                    report.task_id, report.duration, report.followups, owner
                )
                row, children = done.archived, done.children
            elif report.outcome == REPORT_FAIL:
                row = await store.fail(report.task_id, report.permanent, report.retry_wait, owner)
            else:
                row = None
                await store.yield_(report.task_id, report.duration, owner)
        except _REPORT_ERRORS as e:
            results.append(ReportResult(report.task_id, error=e))
            continue
        results.append(ReportResult(report.task_id, getattr(row, "task_class", ""), None, children))
    return results
