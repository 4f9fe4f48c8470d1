"""TaskStore over Phorge's worker tables, shared by the MySQL and SQLite backends.

The statements are written once, in MySQL's spelling with ``%s``
placeholders; everything that differs between the two databases (placeholder
style, the lisk_counter upsert, row locks, transaction start, which errors
are worth a retry) is the engine's (gorge/db/engine.py), so the methods
below have no per-backend branches. Every transaction runs through
:meth:`gorge.db.database.Database.run`, named after the store method.

This module holds enqueue and the reports (complete, fail, yield, cancel,
batched), each deciding by the report rule (:mod:`gorge.taskqueue.report_rule`)
on the row it read with a lock; the lease, the reads, the operator verbs and
the migration calls are :mod:`~gorge.taskqueue.sql_lease`,
:mod:`~gorge.taskqueue.sql_reads`, :mod:`~gorge.taskqueue.sql_operator` and
:mod:`~gorge.taskqueue.sql_migration`, over :mod:`~gorge.taskqueue.sql_calls`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from gorge.taskqueue.model import (
    ARCHIVE_COLUMNS,
    AWAKEN_WINDOW,
    COUNTER_NAME,
    MIN_YIELD,
    REPORT_COMPLETE,
    REPORT_FAIL,
    RESULT_SUCCESS,
    YIELD_OWNER,
    ArchivedTask,
    Completion,
    EnqueueRequest,
    Followup,
    InvalidArgument,
    Report,
    ReportResult,
    Task,
    archive_of,
    archived_from_columns,
    check_u32,
)
from gorge.taskqueue.report_rule import (
    REFUSALS,
    RowFacts,
    Step,
    Verdict,
    archive_result,
    judge,
    refusal,
    refuse,
    step_of,
)
from gorge.taskqueue.sql_calls import A_COLS, CHUNK, COLS, SELECT_ACTIVE, marks
from gorge.taskqueue.sql_lease import SqlLeasing
from gorge.taskqueue.sql_migration import SqlMigration
from gorge.taskqueue.sql_operator import SqlOperatorVerbs
from gorge.taskqueue.sql_reads import SqlReads
from gorge.taskqueue.store import (
    LeaseConflict,
    TaskNotFound,
)

INSERT_ARCHIVE = (
    f"INSERT INTO worker_archivetask ({A_COLS})"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
DELETE_ACTIVE = "DELETE FROM worker_activetask WHERE id = %s"
# Batched reports archive many tasks with one locking read, one insert and
# one delete, instead of three statements each.
SELECT_ACTIVE_MANY = f"SELECT {COLS} FROM worker_activetask WHERE id IN ({{ids}}){{lock}}"
SELECT_ARCHIVED_MANY = f"SELECT {A_COLS} FROM worker_archivetask WHERE id IN ({{ids}})"
INSERT_ARCHIVE_MANY = f"INSERT INTO worker_archivetask ({A_COLS}) VALUES {{rows}}"
DELETE_ACTIVE_MANY = "DELETE FROM worker_activetask WHERE id IN ({ids})"

TEMPORARY_FAIL = (
    "UPDATE worker_activetask SET failureCount = failureCount + 1, failureTime = %s,"
    " leaseOwner = NULL, leaseExpires = %s, dateModified = %s WHERE id = %s"
)
YIELD = (
    "UPDATE worker_activetask SET leaseOwner = %s, leaseExpires = %s, dateModified = %s"
    " WHERE id = %s"
)
AWAKEN = (
    "UPDATE worker_activetask SET leaseExpires = %s WHERE id IN ({ids})"
    " AND leaseOwner = %s AND leaseExpires > %s AND failureCount = 0"
)
# Renewal: extend only leases the owner holds, never shorten one; then read
# back (locked, so what we answer is what is stored) the rows still ours.
RENEW = (
    "UPDATE worker_activetask SET leaseExpires = %s WHERE id IN ({ids}) AND leaseOwner = %s"
    " AND (leaseExpires IS NULL OR leaseExpires < %s)"
)
RENEWED = (
    "SELECT id, leaseExpires FROM worker_activetask WHERE id IN ({ids}) AND leaseOwner = %s{lock}"
)

# How long closing waits for leases being given back.
GIVE_BACK_BUDGET = 2.0
# Tasks archived per statement of a batched report: 14 values a row stay
# under SQLite's oldest limit of 999 bound parameters.
_REPORT_CHUNK = 64
_ARCHIVE_ROW = "(" + ", ".join(["%s"] * len(ARCHIVE_COLUMNS)) + ")"


class SqlTaskStore(SqlLeasing, SqlReads, SqlOperatorVerbs, SqlMigration):
    """TaskStore over ``worker_activetask`` / ``worker_archivetask`` /
    ``worker_taskdata`` / ``lisk_counter``; see :mod:`gorge.taskqueue.store`.

    ``clock`` gives "now"; ``reactor`` (default: ``clock``) bounds each
    transaction. A subclass names its engine.
    """

    # -- enqueue -------------------------------------------------------------

    async def enqueue(self, request: EnqueueRequest) -> Task:
        now = await self._now()
        return await self.db.run("enqueue", self._enqueue_txn, request, now)

    def _enqueue_txn(self, txn, request: EnqueueRequest, now: int) -> Task:
        self._engine.begin_write(txn)
        return self._insert_txn(txn, request, now)

    # -- archive -------------------------------------------------------------

    async def complete(self, task_id: int, duration: int, owner: str | None = None) -> ArchivedTask:
        return (await self.complete_with_followups(task_id, duration, (), owner)).archived

    async def complete_with_followups(
        self,
        task_id: int,
        duration: int,
        followups: Sequence[Followup],
        owner: str | None = None,
    ) -> Completion:
        return await self.db.run(
            "complete",
            self._complete_txn,
            task_id,
            duration,
            await self._now(),
            owner,
            tuple(followups),
        )

    def _complete_txn(
        self,
        txn,
        task_id: int,
        duration: int,
        now: int,
        owner: str | None,
        followups: tuple[Followup, ...],
    ) -> Completion:
        self._engine.begin_write(txn)
        return self._complete_in(txn, task_id, duration, now, owner, followups)

    def _complete_in(
        self,
        txn,
        task_id: int,
        duration: int,
        now: int,
        owner: str | None,
        followups: tuple[Followup, ...],
    ) -> Completion:
        """Archive a success and insert its follow-ups, in the caller's
        transaction: a failure of any statement rolls back every one."""
        verdict, task = self._judged_txn(txn, Step.COMPLETE, task_id, owner)
        if isinstance(task, ArchivedTask):
            # A replay: the report that archived it inserted the children.
            return Completion(task)
        archived = self._write_archive(txn, task, archive_result(verdict), duration, now)
        if not followups:
            return Completion(archived)
        first = self._engine.reserve_counter(txn, COUNTER_NAME, len(followups))
        children = tuple(
            self._insert_txn(txn, followup.request(archived.priority), now, first + offset)
            for offset, followup in enumerate(followups)
        )
        return Completion(archived, children)

    async def cancel(self, task_id: int) -> ArchivedTask:
        return await self.db.run(
            "cancel", self._archive_txn, Step.CANCEL, task_id, await self._now()
        )

    async def fail(
        self, task_id: int, permanent: bool, retry_wait: int, owner: str | None = None
    ) -> ArchivedTask | Task | None:
        now = await self._now()
        if permanent:
            return await self.db.run(
                "fail", self._archive_txn, Step.FAIL_PERMANENT, task_id, now, owner
            )
        return await self.db.run(
            "fail_temporarily", self._temporary_fail_txn, task_id, now, now + retry_wait, owner
        )

    def _judged_txn(
        self, txn, step: Step, task_id: int, owner: str | None
    ) -> tuple[Verdict, Task | ArchivedTask]:
        """The report rule's verdict on the task, read with a row lock, and the
        row it is about: the active one, or the archived success a replay
        answers. Raises the rule's refusals (TaskNotFound, LeaseConflict)."""
        self._exec(txn, SELECT_ACTIVE.format(lock=self._engine.for_update), (task_id,))
        row = txn.fetchone()
        task = None if row is None else self._task_row(row)
        archived = None if task is not None else self._archived_txn(txn, task_id)
        verdict = refuse(judge(step, owner, RowFacts.of(task, archived)), task_id)
        if task is None:
            assert archived is not None and verdict is Verdict.REPLAY
            return verdict, archived
        return verdict, task

    def _held_txn(self, txn, step: Step, task_id: int, owner: str | None) -> Task:
        """The active row ``step`` changes (no replay), read with a row lock."""
        verdict, task = self._judged_txn(txn, step, task_id, owner)
        assert isinstance(task, Task), verdict
        return task

    def _archive_txn(
        self, txn, step: Step, task_id: int, now: int, owner: str | None = None
    ) -> ArchivedTask:
        """A cancel or a permanent failure (duration 0, no replay)."""
        self._engine.begin_write(txn)
        return self._archive_in(txn, step, task_id, now, owner)

    def _archive_in(
        self, txn, step: Step, task_id: int, now: int, owner: str | None
    ) -> ArchivedTask:
        verdict, task = self._judged_txn(txn, step, task_id, owner)
        assert isinstance(task, Task), verdict
        return self._write_archive(txn, task, archive_result(verdict), 0, now)

    def _write_archive(self, txn, task: Task, result: int, duration: int, now: int) -> ArchivedTask:
        """Move ``task``, read with its row lock, to the archive."""
        archived = archive_of(task, result=result, duration=duration, now=now)
        self._exec(
            txn,
            INSERT_ARCHIVE,
            (
                archived.id,
                archived.task_class,
                archived.lease_owner,
                archived.lease_expires,
                archived.failure_count,
                archived.data_id,
                archived.priority,
                archived.object_phid,
                archived.container_phid,
                archived.date_created,
                archived.date_modified,
                archived.result,
                archived.duration,
                archived.archived_epoch,
            ),
        )
        self._exec(txn, DELETE_ACTIVE, (task.id,))
        return archived

    def _temporary_fail_txn(
        self, txn, task_id: int, now: int, expires: int, owner: str | None
    ) -> Task:
        self._engine.begin_write(txn)
        return self._temporary_fail_in(txn, task_id, now, expires, owner)

    def _temporary_fail_in(
        self, txn, task_id: int, now: int, expires: int, owner: str | None
    ) -> Task:
        # The rule's refusals come before the range check of the expiry, as
        # in the model and Redis stores.
        self._held_txn(txn, Step.FAIL_TEMPORARY, task_id, owner)
        expires = check_u32("retryWait", expires)
        self._exec(txn, TEMPORARY_FAIL, (now, expires, now, task_id))
        self._exec(txn, SELECT_ACTIVE.format(lock=""), (task_id,))
        return self._task_row(txn.fetchone())

    async def yield_(self, task_id: int, duration: int, owner: str | None = None) -> None:
        now = await self._now()
        await self.db.run(
            "yield", self._yield_txn, task_id, now, now + max(duration, MIN_YIELD), owner
        )

    def _yield_txn(self, txn, task_id: int, now: int, expires: int, owner: str | None) -> None:
        self._engine.begin_write(txn)
        self._yield_in(txn, task_id, now, expires, owner)

    def _yield_in(self, txn, task_id: int, now: int, expires: int, owner: str | None) -> None:
        # Existence by a locking read: an identical yield in the same second
        # changes no row, and the pool reports changed rows, not matched ones.
        self._held_txn(txn, Step.YIELD, task_id, owner)
        expires = check_u32("duration", expires)
        self._exec(txn, YIELD, (YIELD_OWNER, expires, now, task_id))

    # -- batched reports ---------------------------------------------------------

    async def report(
        self, reports: Sequence[Report], owner: str | None = None
    ) -> list[ReportResult]:
        reports = list(reports)
        if not reports:
            return []
        return await self.db.run("report", self._report_txn, reports, owner, await self._now())

    def _report_txn(
        self, txn, reports: list[Report], owner: str | None, now: int
    ) -> list[ReportResult]:
        self._engine.begin_write(txn)
        results: list[ReportResult | None] = [None] * len(reports)
        # Archives of distinct ids go together; an id reported twice, and a
        # complete with follow-ups to insert, go one report after the other,
        # in order, like everything else.
        seen = Counter(r.task_id for r in reports)
        together = [
            i
            for i, r in enumerate(reports)
            if r.archives and not r.followups and seen[r.task_id] == 1
        ]
        for start in range(0, len(together), _REPORT_CHUNK):
            self._archive_many(
                txn, reports, together[start : start + _REPORT_CHUNK], owner, now, results
            )
        return [
            result if result is not None else self._report_one(txn, report, owner, now)
            for report, result in zip(reports, results, strict=True)
        ]

    def _report_one(self, txn, report: Report, owner: str | None, now: int) -> ReportResult:
        task_id = report.task_id
        row: ArchivedTask | Task | None
        try:
            if report.outcome == REPORT_COMPLETE:
                done = self._complete_in(
                    txn, task_id, report.duration, now, owner, report.followups
                )
                return ReportResult(task_id, done.archived.task_class, None, done.children)
            elif report.outcome == REPORT_FAIL and report.permanent:
                row = self._archive_in(txn, Step.FAIL_PERMANENT, task_id, now, owner)
            elif report.outcome == REPORT_FAIL:
                row = self._temporary_fail_in(txn, task_id, now, now + report.retry_wait, owner)
            else:
                self._yield_in(txn, task_id, now, now + max(report.duration, MIN_YIELD), owner)
                return ReportResult(task_id)
        except (TaskNotFound, LeaseConflict, InvalidArgument) as e:
            return ReportResult(task_id, error=e)
        return ReportResult(task_id, row.task_class)

    def _archive_many(
        self,
        txn,
        reports: list[Report],
        indexes: list[int],
        owner: str | None,
        now: int,
        results: list[ReportResult | None],
    ) -> None:
        """Archive the reports at ``indexes`` (distinct ids, each a complete or a
        permanent failure) by the report rule, as :meth:`_judged_txn` does."""
        ids = sorted(reports[i].task_id for i in indexes)
        self._exec(
            txn, SELECT_ACTIVE_MANY.format(ids=marks(len(ids)), lock=self._engine.for_update), ids
        )
        active = {task.id: task for task in map(self._task_row, txn.fetchall())}
        missing = [task_id for task_id in ids if task_id not in active]
        previous: dict[int, ArchivedTask] = {}
        if missing:
            self._exec(txn, SELECT_ARCHIVED_MANY.format(ids=marks(len(missing))), missing)
            previous = {
                row.id: row
                for row in (
                    archived_from_columns(dict(zip(ARCHIVE_COLUMNS, values, strict=True)))
                    for values in txn.fetchall()
                )
            }
        rows: list[ArchivedTask] = []
        for i in indexes:
            report = reports[i]
            task_id, task, was = report.task_id, active.get(report.task_id), None
            if task is None:
                was = previous.get(task_id)
            verdict = judge(step_of(report), owner, RowFacts.of(task, was))
            if verdict in REFUSALS:
                results[i] = ReportResult(task_id, error=refusal(verdict, task_id))
            elif was is not None:
                results[i] = ReportResult(task_id, was.task_class)  # a replay
            elif task is not None:
                result = archive_result(verdict)
                duration = report.duration if result == RESULT_SUCCESS else 0
                rows.append(archive_of(task, result=result, duration=duration, now=now))
                results[i] = ReportResult(task_id, task.task_class)
        if not rows:
            return
        values: list[Any] = []
        for a in rows:
            values += (
                a.id,
                a.task_class,
                a.lease_owner,
                a.lease_expires,
                a.failure_count,
                a.data_id,
                a.priority,
                a.object_phid,
                a.container_phid,
                a.date_created,
                a.date_modified,
                a.result,
                a.duration,
                a.archived_epoch,
            )
        self._exec(
            txn, INSERT_ARCHIVE_MANY.format(rows=", ".join([_ARCHIVE_ROW] * len(rows))), values
        )
        self._exec(txn, DELETE_ACTIVE_MANY.format(ids=marks(len(rows))), [a.id for a in rows])

    async def renew(
        self, owner: str, task_ids: Sequence[int], duration: int
    ) -> dict[int, int | None]:
        ids = tuple(dict.fromkeys(int(i) for i in task_ids))
        exp = check_u32("duration", await self._now() + duration)
        if not ids:
            return {}
        return await self.db.run("renew", self._renew_txn, owner, ids, exp)

    def _renew_txn(self, txn, owner: str, ids: tuple[int, ...], exp: int) -> dict[int, int | None]:
        self._engine.begin_write(txn)
        held: dict[int, int | None] = {}
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start : start + CHUNK]
            placeholders = marks(len(chunk))
            self._exec(txn, RENEW.format(ids=placeholders), (exp, *chunk, owner, exp))
            self._exec(
                txn, RENEWED.format(ids=placeholders, lock=self._engine.for_update), (*chunk, owner)
            )
            held.update((int(row[0]), int(row[1])) for row in txn.fetchall())
        return {task_id: held.get(task_id) for task_id in ids}

    async def awaken(self, task_ids: Sequence[int]) -> int:
        ids = tuple(dict.fromkeys(int(i) for i in task_ids))
        if not ids:
            return 0
        ago = await self._now() - AWAKEN_WINDOW
        return await self.db.run("awaken", self._awaken_txn, ids, ago)

    def _awaken_txn(self, txn, ids: tuple[int, ...], ago: int) -> int:
        self._engine.begin_write(txn)
        changed = 0
        # Chunked: SQLite caps the number of bound parameters per statement.
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start : start + CHUNK]
            self._exec(txn, AWAKEN.format(ids=marks(len(chunk))), (ago, *chunk, YIELD_OWNER, ago))
            changed += int(txn.rowcount)
        return changed

    async def ping(self) -> str | None:
        return await self.db.ping()

    async def close(self) -> None:
        await self._giving_back.drain(GIVE_BACK_BUDGET, self._clock)
        self.db.close()
