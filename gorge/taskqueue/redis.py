"""The Redis TaskStore: hashes, sorted sets and Lua.

This module holds the worker's side (enqueue, lease, the reports, renewals)
and puts the store together; the key layout is
:mod:`gorge.taskqueue.redis_layout`, the scripts
:mod:`gorge.taskqueue.redis_scripts`, and the other parts of the TaskStore
:mod:`~gorge.taskqueue.redis_reads`, :mod:`~gorge.taskqueue.redis_operator`
and :mod:`~gorge.taskqueue.redis_migration`.  What a report does to the task
it names is the report rule (:mod:`gorge.taskqueue.report_rule`), which the
scripts read as a table.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import LogLevel

from gorge.config import ConfigError
from gorge.db import redis as gredis
from gorge.log.logger import Logger
from gorge.taskqueue.model import (
    AWAKEN_WINDOW,
    MIN_YIELD,
    YIELD_OWNER,
    ArchivedTask,
    Completion,
    EnqueueRequest,
    Followup,
    InvalidArgument,
    Report,
    ReportResult,
    Task,
    archived_from_columns,
    check_u32,
    sort_key,
)
from gorge.taskqueue.redis_layout import (
    DEFAULT_KEY_PREFIX,
    children_of,
    followup_fields,
    key_base,
    member,
    pack,
    task_of,
)
from gorge.taskqueue.redis_migration import RedisMigration
from gorge.taskqueue.redis_operator import RedisOperatorVerbs
from gorge.taskqueue.redis_reads import RedisReads
from gorge.taskqueue.redis_scripts import expiry_or_marker, raise_refusal, report_result
from gorge.taskqueue.report_rule import RowFacts, Step, judge, refuse, step_of
from gorge.taskqueue.store import log_handed_back, outliving_caller

log = Logger()

# A filtered phase 1 reads the unleased index in pages of this many ids.
SCAN_BATCH = 200
# How long closing waits for leases being given back.
GIVE_BACK_BUDGET = 2.0


def _report_entry(report: Report, now: int) -> list[Any]:
    """A report as report.lua takes it: [member, step, value, followups?]."""
    m, step = member(report.task_id), step_of(report)
    if step is Step.COMPLETE and report.followups:
        fields = [followup_fields(f) for f in report.followups]
        return [m, step.value, str(report.duration), fields]
    if step is Step.COMPLETE:
        return [m, step.value, str(report.duration)]
    if step is Step.FAIL_PERMANENT:
        return [m, step.value, ""]
    if step is Step.FAIL_TEMPORARY:
        return [m, step.value, expiry_or_marker(now + report.retry_wait)]
    return [m, step.value, expiry_or_marker(now + max(report.duration, MIN_YIELD))]


class RedisTaskStore(RedisReads, RedisOperatorVerbs, RedisMigration):
    """Implements :class:`gorge.taskqueue.store.TaskStore` on Redis; see
    :class:`gorge.taskqueue.redis_calls.RedisCalls` for the arguments."""

    async def enqueue(self, request: EnqueueRequest) -> Task:
        now = await self._now()
        delay = "" if request.delay_until is None else str(request.delay_until)
        task_id, data_id = await self._run_packed(
            self.scripts.enqueue,
            self.keys.next_task_id,
            [
                request.task_class,
                request.priority,
                request.object_phid or "",
                request.container_phid or "",
                delay,
                now,
            ],
            request.data,
        )
        return request.new_task(int(task_id), int(data_id), now)

    async def lease(
        self,
        owner: str,
        limit: int,
        lease_duration: int,
        task_classes: Sequence[str] | None = None,
    ) -> list[Task]:
        now = await self._now()
        exp = check_u32("leaseExpires", now + lease_duration)
        classes = list(dict.fromkeys(task_classes or ()))
        # Unfiltered, the first `limit` unleased ids are all claimable: one page.
        batch = SCAN_BATCH if classes else max(limit, 1)
        claim = self._run_packed(
            self.scripts.lease, self.keys.unleased, [limit, owner, exp, now, batch, *classes]
        )
        rows = await outliving_caller(claim, lambda won: self._give_back(owner, exp, won))
        return sorted((task_of(doc) for doc in json.loads(rows)), key=sort_key)

    def _give_back(self, owner: str, exp: int, rows: str) -> None:
        ids = [int(doc["id"]) for doc in json.loads(rows)]
        if not ids:
            return
        log_handed_back(owner, ids)

        async def giving_back() -> None:
            await self._run(
                self.scripts.give_back,
                [self.keys.leased],
                [owner, exp, await self._now(), *(member(i) for i in ids)],
            )

        d = self._giving_back.track(Deferred.fromCoroutine(giving_back()))
        d.addErrback(
            lambda f: log.failure(
                "TASKQUEUE_LEASE_HAND_BACK_FAILED task_ids={task_ids}",
                f,
                level=LogLevel.error,
                task_ids=ids,
            )
        )

    async def _archive_task(
        self, task_id: int, step: Step, duration: int, owner: str | None = None
    ) -> ArchivedTask:
        now = await self._now()
        reply = await self._run_packed(
            self.scripts.archive,
            self.keys.task(task_id),
            [member(task_id), step.value, duration, now, self._cutoff(now), owner or ""],
        )
        raise_refusal(task_id, reply)
        return archived_from_columns(json.loads(reply))

    async def _row_facts(self, task_id: int) -> RowFacts:
        """What the report rule asks of the task, read outside a script."""
        k = self.keys
        active = await self._bounded(self._conn.hmget(k.task(task_id), ["id", "leaseOwner"]))
        if active[0] not in (None, ""):
            return RowFacts(active=True, active_owner=active[1] or None)
        was = await self._bounded(self._conn.hmget(k.archived(task_id), ["result", "leaseOwner"]))
        if was[0] in (None, ""):
            return RowFacts()
        return RowFacts(archived_result=int(was[0]), archived_owner=was[1] or None)

    async def _checked_expiry(
        self, task_id: int, step: Step, field: str, expires: int, owner: str | None
    ) -> int:
        """``expires`` if it fits the column; else the error the model gives:
        the report rule's refusal if it refuses, InvalidArgument otherwise."""
        try:
            return check_u32(field, expires)
        except InvalidArgument:
            refuse(judge(step, owner or None, await self._row_facts(task_id)), task_id)
            raise

    async def complete(self, task_id: int, duration: int, owner: str | None = None) -> ArchivedTask:
        return await self._archive_task(task_id, Step.COMPLETE, duration, owner)

    async def complete_with_followups(
        self,
        task_id: int,
        duration: int,
        followups: Sequence[Followup],
        owner: str | None = None,
    ) -> Completion:
        if not followups:
            return Completion(await self.complete(task_id, duration, owner))
        now = await self._now()
        reply = await self._run_packed(
            self.scripts.archive,
            self.keys.task(task_id),
            [member(task_id), Step.COMPLETE.value, duration, now, self._cutoff(now), owner or ""],
            pack([followup_fields(f) for f in followups]),
        )
        raise_refusal(task_id, reply)
        row, children = json.loads(reply)
        archived = archived_from_columns(row)
        if not children:
            # A replay ({}, cjson's empty table): the first report inserted them.
            return Completion(archived)
        return Completion(archived, children_of(followups, archived.priority, children, now))

    async def fail(
        self, task_id: int, permanent: bool, retry_wait: int, owner: str | None = None
    ) -> ArchivedTask | Task | None:
        if permanent:
            return await self._archive_task(task_id, Step.FAIL_PERMANENT, 0, owner)
        now = await self._now()
        expires = await self._checked_expiry(
            task_id, Step.FAIL_TEMPORARY, "retryWait", now + retry_wait, owner
        )
        row = await self._run(
            self.scripts.fail_temporary,
            [self.keys.task(task_id)],
            [member(task_id), now, expires, owner or ""],
        )
        raise_refusal(task_id, row)
        return task_of(json.loads(row))

    async def yield_(self, task_id: int, duration: int, owner: str | None = None) -> None:
        now = await self._now()
        expires = await self._checked_expiry(
            task_id, Step.YIELD, "duration", now + max(duration, MIN_YIELD), owner
        )
        found = await self._run(
            self.scripts.yield_task,
            [self.keys.task(task_id)],
            [member(task_id), now, expires, owner or "", YIELD_OWNER],
        )
        raise_refusal(task_id, found)

    async def cancel(self, task_id: int) -> ArchivedTask:
        return await self._archive_task(task_id, Step.CANCEL, 0)

    async def report(
        self, reports: Sequence[Report], owner: str | None = None
    ) -> list[ReportResult]:
        reports = list(reports)
        if not reports:
            return []
        now = await self._now()
        answers = json.loads(
            await self._run_packed(
                self.scripts.report,
                self.keys.active,
                [now, self._cutoff(now), owner or "", YIELD_OWNER],
                pack([_report_entry(report, now) for report in reports]),
            )
        )
        return [
            report_result(report, answer, now)
            for report, answer in zip(reports, answers, strict=True)
        ]

    async def awaken(self, task_ids: Sequence[int]) -> int:
        ids = list(dict.fromkeys(task_ids))
        if not ids:
            return 0
        ago = await self._now() - AWAKEN_WINDOW
        k = self.keys
        changed = await self._run(
            self.scripts.awaken,
            [k.leased, *(k.task(i) for i in ids)],
            [ago, YIELD_OWNER, *(member(i) for i in ids)],
        )
        return int(changed)

    async def renew(
        self, owner: str, task_ids: Sequence[int], duration: int
    ) -> dict[int, int | None]:
        ids = list(dict.fromkeys(task_ids))
        exp = check_u32("duration", await self._now() + duration)
        if not ids:
            return {}
        k = self.keys
        answers = await self._run(
            self.scripts.renew,
            [k.leased, *(k.task(i) for i in ids)],
            [owner, exp, *(member(i) for i in ids)],
        )
        return {
            task_id: (int(a) if a not in (None, "") else None)
            for task_id, a in zip(ids, answers, strict=True)
        }

    async def close(self) -> None:
        await self._giving_back.drain(GIVE_BACK_BUDGET, self._clock)
        await self._bounded(self._conn.disconnect())


def make_redis_task_store(
    settings: gredis.RedisSettings,
    reactor: Any,
    *,
    key_prefix: str = DEFAULT_KEY_PREFIX,
    archive_retention: int | None = None,
) -> RedisTaskStore:
    """A store on a lazy pool: nothing connects until the first call.

    Raises ConfigError for a key prefix whose hash tag is malformed.
    """
    try:
        key_base(key_prefix)
    except ValueError as e:
        raise ConfigError("GORGE_TASKQUEUE_REDIS_KEY_PREFIX", str(e)) from None
    return RedisTaskStore(
        gredis.make_redis(settings, reactor),
        clock=reactor,
        key_prefix=key_prefix,
        archive_retention=archive_retention,
    )
