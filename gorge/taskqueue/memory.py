"""Plain in-memory TaskStore: the reference model for the behaviour tests and
the fake for handler tests.  Written for obviousness, not speed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from twisted.internet.interfaces import IReactorTime

from gorge.db.clock import HostTime, StoreTime
from gorge.taskqueue.model import (
    ACTIVE_NOT_ARCHIVED,
    ARCHIVED_NOT_ACTIVE,
    AWAKEN_WINDOW,
    MIN_YIELD,
    NOT_LEASED,
    RESULT_SUCCESS,
    SUCCEEDED,
    YIELD_OWNER,
    ArchivedTask,
    Completion,
    EnqueueRequest,
    Followup,
    Report,
    ReportResult,
    Stats,
    Task,
    archive_of,
    check_u32,
    requeue_request,
    sort_key,
    unarchived,
)
from gorge.taskqueue.report_rule import RowFacts, Step, Verdict, archive_result, judge, refuse
from gorge.taskqueue.store import TaskNotFound, TaskStateError, report_each
from gorge.taskqueue.waiting import Waiting, oldest_waiting


class MemoryTaskStore:
    """Implements :class:`gorge.taskqueue.store.TaskStore` with dicts."""

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self.time: StoreTime = HostTime(clock)
        self._active: dict[int, Task] = {}
        self._archived: dict[int, ArchivedTask] = {}
        self._payloads: dict[int, str] = {}
        self._next_task_id = 1
        self._next_data_id = 1
        self._ledgers: dict[str, int] = {}
        self.unreachable: str | None = None

    def _now(self) -> int:
        return int(self._clock.seconds())

    async def enqueue(self, request: EnqueueRequest) -> Task:
        return self._insert(request, self._now())

    def _insert(self, request: EnqueueRequest, now: int) -> Task:
        data_id, self._next_data_id = self._next_data_id, self._next_data_id + 1
        task_id, self._next_task_id = self._next_task_id, self._next_task_id + 1
        self._payloads[data_id] = request.data
        task = request.new_task(task_id, data_id, now)
        self._active[task_id] = task
        return task

    async def lease(
        self,
        owner: str,
        limit: int,
        lease_duration: int,
        task_classes: Sequence[str] | None = None,
    ) -> list[Task]:
        now = self._now()
        exp = check_u32("leaseExpires", now + lease_duration)
        allowed = set(task_classes) if task_classes else None
        ordered = sorted(self._active.values(), key=sort_key)
        if allowed is not None:
            ordered = [t for t in ordered if t.task_class in allowed]
        phase1 = [t for t in ordered if t.lease_owner is None and t.lease_expires is None][:limit]
        claimed = [t.id for t in phase1]
        if len(claimed) < limit:
            phase2 = [
                t
                for t in ordered
                if t.id not in claimed and t.lease_expires is not None and t.lease_expires < now
            ]
            claimed += [t.id for t in phase2[: limit - len(claimed)]]
        out = []
        for task_id in claimed:
            task = replace(self._active[task_id], lease_owner=owner, lease_expires=exp)
            self._active[task_id] = task
            out.append(replace(task, data=self._payloads.get(task.data_id, "")))
        return sorted(out, key=sort_key)

    def _judged(self, step: Step, task_id: int, owner: str | None) -> Verdict:
        """The report rule's verdict on the task; raises its refusals."""
        facts = RowFacts.of(self._active.get(task_id), self._archived.get(task_id))
        return refuse(judge(step, owner, facts), task_id)

    def _archive(self, step: Step, task_id: int, duration: int, owner: str | None) -> ArchivedTask:
        return self._archive_as(self._judged(step, task_id, owner), task_id, duration)

    def _archive_as(self, verdict: Verdict, task_id: int, duration: int) -> ArchivedTask:
        archived = archive_of(
            self._active.pop(task_id),
            result=archive_result(verdict),
            duration=duration,
            now=self._now(),
        )
        self._archived[task_id] = archived
        return archived

    async def complete(self, task_id: int, duration: int, owner: str | None = None) -> ArchivedTask:
        return (await self.complete_with_followups(task_id, duration, (), owner)).archived

    async def complete_with_followups(
        self,
        task_id: int,
        duration: int,
        followups: Sequence[Followup],
        owner: str | None = None,
    ) -> Completion:
        verdict = self._judged(Step.COMPLETE, task_id, owner)
        if verdict is Verdict.REPLAY:
            # The report that archived it inserted the children.
            return Completion(self._archived[task_id])
        archived = self._archive_as(verdict, task_id, duration)
        now = self._now()
        children = tuple(self._insert(f.request(archived.priority), now) for f in followups)
        return Completion(archived, children)

    async def fail(
        self, task_id: int, permanent: bool, retry_wait: int, owner: str | None = None
    ) -> ArchivedTask | Task | None:
        if permanent:
            return self._archive(Step.FAIL_PERMANENT, task_id, 0, owner)
        self._judged(Step.FAIL_TEMPORARY, task_id, owner)
        task = self._active[task_id]
        now = self._now()
        expires = check_u32("retryWait", now + retry_wait)
        task = replace(
            task,
            failure_count=task.failure_count + 1,
            failure_time=now,
            lease_owner=None,
            lease_expires=expires,
            date_modified=now,
        )
        self._active[task_id] = task
        return task

    async def yield_(self, task_id: int, duration: int, owner: str | None = None) -> None:
        self._judged(Step.YIELD, task_id, owner)
        task = self._active[task_id]
        now = self._now()
        expires = check_u32("duration", now + max(duration, MIN_YIELD))
        self._active[task_id] = replace(
            task, lease_owner=YIELD_OWNER, lease_expires=expires, date_modified=now
        )

    async def report(
        self, reports: Sequence[Report], owner: str | None = None
    ) -> list[ReportResult]:
        return await report_each(self, reports, owner)

    async def renew(
        self, owner: str, task_ids: Sequence[int], duration: int
    ) -> dict[int, int | None]:
        exp = check_u32("duration", self._now() + duration)
        out: dict[int, int | None] = {}
        for task_id in dict.fromkeys(task_ids):
            task = self._active.get(task_id)
            if task is None or task.lease_owner != owner:
                out[task_id] = None
                continue
            expires = max(task.lease_expires or 0, exp)
            self._active[task_id] = replace(task, lease_expires=expires)
            out[task_id] = expires
        return out

    async def cancel(self, task_id: int) -> ArchivedTask:
        return self._archive(Step.CANCEL, task_id, 0, None)

    async def awaken(self, task_ids: Sequence[int]) -> int:
        ago = self._now() - AWAKEN_WINDOW
        changed = 0
        for task_id in set(task_ids):
            task = self._active.get(task_id)
            if (
                task is not None
                and task.lease_owner == YIELD_OWNER
                and task.lease_expires is not None
                and task.lease_expires > ago
                and task.failure_count == 0
            ):
                self._active[task_id] = replace(task, lease_expires=ago)
                changed += 1
        return changed

    async def stats(self) -> Stats:
        now = self._now()
        tasks = self._active.values()
        return Stats(
            active=len(self._active),
            leased=sum(1 for t in tasks if t.is_held(now)),
            archived=len(self._archived),
            failed=sum(1 for t in tasks if t.failure_count > 0),
        )

    async def oldest_waiting(self) -> Waiting:
        # Every waiting task: the heads the other backends read hold the same
        # answer while a queue is shorter than they are.
        now = self._now()
        heads = [
            (t.task_class, t.priority, t.date_created)
            for t in self._active.values()
            if t.lease_owner is None and t.lease_expires is None
        ]
        heads += [
            (t.task_class, t.priority, max(t.lease_expires, t.date_created))
            for t in self._active.values()
            if t.lease_expires is not None and t.lease_expires < now
        ]
        return oldest_waiting(now, heads)

    async def list_tasks(self, limit: int, offset: int) -> list[Task]:
        ordered = sorted(self._active.values(), key=sort_key)
        return ordered[offset : offset + limit]

    async def get_task(self, task_id: int) -> Task:
        task = self._active.get(task_id)
        if task is None:
            raise TaskNotFound(task_id)
        return replace(task, data=self._payloads.get(task.data_id, ""))

    async def get_archived(self, task_id: int) -> ArchivedTask | None:
        return self._archived.get(task_id)

    async def list_archived(
        self, result: int | None, task_class: str | None, limit: int, offset: int
    ) -> list[ArchivedTask]:
        rows = [
            a
            for a in self._archived.values()
            if (result is None or a.result == result)
            and (task_class is None or a.task_class == task_class)
        ]
        rows.sort(key=lambda a: (a.date_modified, a.id), reverse=True)
        return rows[offset : offset + limit]

    async def requeue(self, task_id: int) -> Task:
        archived = self._archived.get(task_id)
        if archived is None:
            if task_id in self._active:
                raise TaskStateError(task_id, ACTIVE_NOT_ARCHIVED)
            raise TaskNotFound(task_id)
        if archived.result == RESULT_SUCCESS:
            raise TaskStateError(task_id, SUCCEEDED)
        return self._insert(
            requeue_request(archived, self._payloads.get(archived.data_id, "")), self._now()
        )

    def _active_task(self, task_id: int) -> Task:
        task = self._active.get(task_id)
        if task is None:
            if task_id in self._archived:
                raise TaskStateError(task_id, ARCHIVED_NOT_ACTIVE)
            raise TaskNotFound(task_id)
        return task

    async def delay(self, task_id: int, until: int) -> Task:
        task = replace(
            self._active_task(task_id),
            lease_owner=None,
            lease_expires=until,
            date_modified=self._now(),
        )
        self._active[task_id] = task
        return task

    async def set_priority(self, task_id: int, priority: int) -> Task:
        task = replace(self._active_task(task_id), priority=priority, date_modified=self._now())
        self._active[task_id] = task
        return task

    async def free(self, task_id: int) -> Task:
        task = self._active_task(task_id)
        if task.lease_owner is None:
            raise TaskStateError(task_id, NOT_LEASED)
        now = self._now()
        task = replace(task, lease_owner=None, lease_expires=now, date_modified=now)
        self._active[task_id] = task
        return task

    async def retry(self, task_id: int, repeat: bool) -> Task:
        archived = self._archived.get(task_id)
        if archived is None:
            if task_id in self._active:
                raise TaskStateError(task_id, ACTIVE_NOT_ARCHIVED)
            raise TaskNotFound(task_id)
        if archived.result == RESULT_SUCCESS and not repeat:
            raise TaskStateError(task_id, SUCCEEDED)
        task = unarchived(archived, self._now())
        del self._archived[task_id]
        self._active[task_id] = task
        return task

    async def active_ids(self) -> list[int]:
        return sorted(self._active)

    async def export_tasks(self, task_ids: Sequence[int]) -> list[Task]:
        return [
            replace(self._active[i], data=self._payloads.get(self._active[i].data_id, ""))
            for i in sorted(set(task_ids))
            if i in self._active
        ]

    async def import_tasks(self, tasks: Sequence[Task], ledger: str, mark: int) -> list[int]:
        out = []
        for task in tasks:
            data_id, self._next_data_id = self._next_data_id, self._next_data_id + 1
            task_id, self._next_task_id = self._next_task_id, self._next_task_id + 1
            self._payloads[data_id] = task.data or ""
            self._active[task_id] = replace(task, id=task_id, data_id=data_id, data=None)
            out.append(task_id)
        self._ledgers[ledger] = mark
        return out

    async def migration_mark(self, ledger: str) -> int | None:
        return self._ledgers.get(ledger)

    async def clear_migration_mark(self, ledger: str) -> None:
        self._ledgers.pop(ledger, None)

    async def delete_tasks(self, tasks: Sequence[Task]) -> int:
        gone = 0
        for task in tasks:
            if self._active.pop(task.id, None) is not None:
                self._payloads.pop(task.data_id, None)
                gone += 1
        return gone

    async def wake_check(self, since: int, now: int) -> tuple[int, bool]:
        due = any(
            t.lease_expires is not None and since <= t.lease_expires < now
            for t in self._active.values()
        )
        return self._next_task_id, due

    async def ping(self) -> str | None:
        return self.unreachable

    async def close(self) -> None:
        return None
