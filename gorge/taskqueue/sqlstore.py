"""TaskStore over Phorge's worker tables, shared by the MySQL and SQLite backends.

The statements are written once, in MySQL's spelling with ``%s``
placeholders; everything that differs between the two databases (placeholder
style, the lisk_counter upsert, row locks, transaction start, which errors
are worth a retry) is the engine's (gorge/db/engine.py), so the methods
below have no per-backend branches. Every transaction runs through
:meth:`gorge.db.database.Database.run`, named after the store method.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

from twisted.enterprise import adbapi
from twisted.internet.defer import Deferred, DeferredLock
from twisted.internet.interfaces import IReactorTime
from twisted.logger import LogLevel

from gorge.app.inflight import InFlight
from gorge.db import Database, Engine
from gorge.log.logger import Logger
from gorge.taskqueue.counts import TaskCounts
from gorge.taskqueue.model import (
    ACTIVE_NOT_ARCHIVED,
    ARCHIVE_COLUMNS,
    ARCHIVED_NOT_ACTIVE,
    AWAKEN_WINDOW,
    COUNTER_NAME,
    LEASED,
    MIN_YIELD,
    NOT_LEASED,
    REPORT_COMPLETE,
    REPORT_FAIL,
    RESULT_CANCELLED,
    RESULT_FAILURE,
    RESULT_SUCCESS,
    SUCCEEDED,
    TASK_COLUMNS,
    YIELD_OWNER,
    ArchivedTask,
    Completion,
    EnqueueRequest,
    Followup,
    InvalidArgument,
    Report,
    ReportResult,
    Stats,
    Task,
    archive_of,
    archived_from_columns,
    check_u32,
    requeue_request,
    task_from_columns,
    unarchived,
)
from gorge.taskqueue.store import (
    LeaseConflict,
    TaskNotFound,
    TaskStateError,
    log_handed_back,
    outliving_caller,
)

log = Logger()

DATABASE_NAME = "taskqueue"  # prefixes the transactions' log events: TASKQUEUE_TXN_RETRY

_COLS = ", ".join(TASK_COLUMNS)
_T_COLS = ", ".join(f"t.{c}" for c in TASK_COLUMNS)
_A_COLS = ", ".join(ARCHIVE_COLUMNS)

INSERT_DATA = "INSERT INTO worker_taskdata (data) VALUES (%s)"

INSERT_TASK = (
    "INSERT INTO worker_activetask (id, taskClass, leaseOwner, leaseExpires, failureCount,"
    " dataID, failureTime, priority, objectPHID, containerPHID, dateCreated, dateModified)"
    " VALUES (%s, %s, NULL, %s, 0, %s, NULL, %s, %s, %s, %s, %s)"
)

# Phase 1: never leased and not delayed (r4 predicate).
PHASE1_CANDIDATES = (
    "SELECT id FROM worker_activetask WHERE leaseOwner IS NULL AND leaseExpires IS NULL{classes}"
    " ORDER BY priority, id LIMIT %s"
)
PHASE1_CLAIM = (
    "UPDATE worker_activetask SET leaseOwner = %s, leaseExpires = %s"
    " WHERE id = %s AND leaseOwner IS NULL AND leaseExpires IS NULL"
)
# Phase 2: expired, strictly before now, whoever held it.
PHASE2_CANDIDATES = (
    "SELECT id FROM worker_activetask WHERE leaseExpires < %s{classes}"
    " ORDER BY priority, id LIMIT %s"
)
PHASE2_CLAIM = (
    "UPDATE worker_activetask SET leaseOwner = %s, leaseExpires = %s"
    " WHERE id = %s AND leaseExpires < %s"
)
# The same claims for a whole candidate list in one statement.  Every
# candidate that still matches changes, so a row count equal to the list's
# length means all of them are ours; anything less is a race with another
# claimer, settled by the per-row claims above.
PHASE1_CLAIM_ALL = (
    "UPDATE worker_activetask SET leaseOwner = %s, leaseExpires = %s"
    " WHERE id IN ({ids}) AND leaseOwner IS NULL AND leaseExpires IS NULL"
)
PHASE2_CLAIM_ALL = (
    "UPDATE worker_activetask SET leaseOwner = %s, leaseExpires = %s"
    " WHERE id IN ({ids}) AND leaseExpires < %s"
)
# A claim whose caller went away before the answer: break exactly the leases
# this claim took (owner and expiry), as ``free`` does.
GIVE_BACK = (
    "UPDATE worker_activetask SET leaseOwner = NULL, leaseExpires = %s"
    " WHERE id IN ({ids}) AND leaseOwner = %s AND leaseExpires = %s"
)
FETCH_WON = (
    f"SELECT {_T_COLS}, COALESCE(d.data, '') FROM worker_activetask t"
    " LEFT JOIN worker_taskdata d ON d.id = t.dataID"
    " WHERE t.id IN ({ids}) AND t.leaseOwner = %s ORDER BY t.priority, t.id"
)

SELECT_ACTIVE = f"SELECT {_COLS} FROM worker_activetask WHERE id = %s{{lock}}"
INSERT_ARCHIVE = (
    f"INSERT INTO worker_archivetask ({_A_COLS})"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
DELETE_ACTIVE = "DELETE FROM worker_activetask WHERE id = %s"
# Batched reports archive many tasks with one locking read, one insert and
# one delete, instead of three statements each.
SELECT_ACTIVE_MANY = f"SELECT {_COLS} FROM worker_activetask WHERE id IN ({{ids}}){{lock}}"
SELECT_ARCHIVED_MANY = f"SELECT {_A_COLS} FROM worker_archivetask WHERE id IN ({{ids}})"
INSERT_ARCHIVE_MANY = f"INSERT INTO worker_archivetask ({_A_COLS}) VALUES {{rows}}"
DELETE_ACTIVE_MANY = "DELETE FROM worker_activetask WHERE id IN ({ids})"
SELECT_ARCHIVED = f"SELECT {_A_COLS} FROM worker_archivetask WHERE id = %s{{lock}}"
# Newest first by the archive time; Phorge keys dateModified, and sets it on archive too.
LIST_ARCHIVED = (
    f"SELECT {_A_COLS} FROM worker_archivetask{{where}}"
    " ORDER BY dateModified DESC, id DESC LIMIT %s OFFSET %s"
)
SELECT_DATA = "SELECT data FROM worker_taskdata WHERE id = %s"

# Operator verbs (Phorge's bin/worker delay, priority, free, retry).
DELAY = "UPDATE worker_activetask SET leaseExpires = %s, dateModified = %s WHERE id = %s"
SET_PRIORITY = "UPDATE worker_activetask SET priority = %s, dateModified = %s WHERE id = %s"
FREE = (
    "UPDATE worker_activetask SET leaseOwner = NULL, leaseExpires = %s, dateModified = %s"
    " WHERE id = %s"
)
# unarchiveTask(): the archived id and payload row come back as an active task.
UNARCHIVE = (
    "INSERT INTO worker_activetask (id, taskClass, leaseOwner, leaseExpires, failureCount,"
    " dataID, failureTime, priority, objectPHID, containerPHID, dateCreated, dateModified)"
    " VALUES (%s, %s, NULL, 0, 0, %s, NULL, %s, %s, %s, %s, %s)"
)
DELETE_ARCHIVED = "DELETE FROM worker_archivetask WHERE id = %s"

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
STATS = (
    # activeCount and archivedCount are kept by gorge/taskqueue/counts.py: a
    # COUNT(*) would read a whole table. failureTime is set with every failure
    # (ours and Phorge's), so key_failuretime serves the failed count.
    "SELECT (SELECT COUNT(*) FROM worker_activetask"
    "   WHERE leaseOwner IS NOT NULL AND leaseOwner <> '' AND leaseExpires >= %s),"
    " (SELECT COUNT(*) FROM worker_activetask"
    "   WHERE failureTime IS NOT NULL AND failureCount > 0)"
)
# Phorge has no (priority, id) key: each half is read in key_owner's order
# (leaseOwner, priority, id), never the whole table; a page needs at most
# offset + limit rows of each.
LIST = (
    f"SELECT {_COLS} FROM (SELECT {_COLS} FROM worker_activetask WHERE leaseOwner IS NULL"
    " ORDER BY priority, id LIMIT %s) AS unleased"
    f" UNION ALL SELECT {_COLS} FROM (SELECT {_COLS} FROM worker_activetask"
    " WHERE leaseOwner IS NOT NULL ORDER BY priority, id LIMIT %s) AS leased"
    " ORDER BY priority, id LIMIT %s OFFSET %s"
)
# What held lease calls watch: the primary key's last entry (Phorge's own
# inserts included) and one probe of the leaseExpires index for tasks that
# came due since the last check.  Both are index lookups.
WAKE_CHECK = (
    "SELECT (SELECT MAX(id) FROM worker_activetask),"
    " EXISTS(SELECT 1 FROM worker_activetask WHERE leaseExpires >= %s AND leaseExpires < %s)"
)
GET = (
    f"SELECT {_T_COLS}, COALESCE(d.data, '') FROM worker_activetask t"
    " LEFT JOIN worker_taskdata d ON d.id = t.dataID WHERE t.id = %s"
)

# Moving tasks between backends.  The ledger is a row of lisk_counter named
# after the migration: Phorge reads only the counters it names itself.
ACTIVE_IDS = "SELECT id FROM worker_activetask ORDER BY id"
EXPORT = (
    f"SELECT {_T_COLS}, COALESCE(d.data, '') FROM worker_activetask t"
    " LEFT JOIN worker_taskdata d ON d.id = t.dataID WHERE t.id IN ({ids}) ORDER BY t.id"
)
IMPORT_TASK = (
    f"INSERT INTO worker_activetask ({_COLS})"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
LEDGER = "SELECT counterValue FROM lisk_counter WHERE counterName = %s"
CLEAR_LEDGER = "DELETE FROM lisk_counter WHERE counterName = %s"
DELETE_TASKS = "DELETE FROM worker_activetask WHERE id IN ({ids})"
DELETE_DATA = "DELETE FROM worker_taskdata WHERE id IN ({ids})"

# A concurrent claimer can take candidates between our SELECT and UPDATE;
# re-select a few times before answering with fewer tasks than asked for.
_CLAIM_ROUNDS = 4
_INT64_MAX = 2**63 - 1  # the largest LIMIT both databases take
_AWAKEN_CHUNK = 500
# How long closing waits for leases being given back.
GIVE_BACK_BUDGET = 2.0
# Tasks archived per statement of a batched report: 14 values a row stay
# under SQLite's oldest limit of 999 bound parameters.
_REPORT_CHUNK = 64
_ARCHIVE_ROW = "(" + ", ".join(["%s"] * len(ARCHIVE_COLUMNS)) + ")"


def _marks(n: int) -> str:
    return ", ".join(["%s"] * n)


@dataclass(frozen=True)
class _Claimant:
    """Who leases, until when, and which task classes it takes (none: all)."""

    owner: str
    expires: int
    classes: tuple[str, ...]


@dataclass(frozen=True)
class _LeasePhase:
    """One source of leasable rows: the query that finds candidates and the
    two claims that take them, with the parameters both bind after the ids."""

    candidates: str
    claim_one: str
    claim_all: str
    bound: tuple[int, ...]


def _lease_phases(classes: tuple[str, ...], now: int) -> tuple[_LeasePhase, ...]:
    """Never-leased rows first, then rows whose lease has expired."""
    class_sql = f" AND taskClass IN ({_marks(len(classes))})" if classes else ""
    return (
        _LeasePhase(
            PHASE1_CANDIDATES.format(classes=class_sql), PHASE1_CLAIM, PHASE1_CLAIM_ALL, ()
        ),
        _LeasePhase(
            PHASE2_CANDIDATES.format(classes=class_sql), PHASE2_CLAIM, PHASE2_CLAIM_ALL, (now,)
        ),
    )


_Take = Callable[[Any, _LeasePhase, _Claimant, list[int]], list[int]]


class _Contended(Exception):
    """A one-statement claim lost some candidates to a concurrent claimer."""


class SqlTaskStore:
    """TaskStore over ``worker_activetask`` / ``worker_archivetask`` /
    ``worker_taskdata`` / ``lisk_counter``; see :mod:`gorge.taskqueue.store`.

    ``clock`` gives "now"; ``reactor`` (default: ``clock``) bounds each
    transaction. A subclass names its engine.
    """

    @staticmethod
    def new_engine() -> Engine:
        raise NotImplementedError

    def __init__(
        self,
        pool: adbapi.ConnectionPool,
        clock: IReactorTime,
        *,
        reactor: IReactorTime | None = None,
    ) -> None:
        self.db = Database(
            self.new_engine(), pool, reactor if reactor is not None else clock, name=DATABASE_NAME
        )
        self._engine = self.db.engine
        self._clock = clock
        self._counts = TaskCounts()
        self._stats_lock = DeferredLock()
        self._giving_back = InFlight()

    def _now(self) -> int:
        return int(self._clock.seconds())

    def _exec(self, txn, statement: str, args: Sequence[Any] = ()) -> None:
        self._engine.execute(txn, statement, args)

    # -- enqueue -------------------------------------------------------------

    async def enqueue(self, request: EnqueueRequest) -> Task:
        now = self._now()
        return await self.db.run("enqueue", self._enqueue_txn, request, now)

    def _enqueue_txn(self, txn, request: EnqueueRequest, now: int) -> Task:
        self._engine.begin_write(txn)
        return self._insert_txn(txn, request, now)

    def _insert_txn(
        self, txn, request: EnqueueRequest, now: int, task_id: int | None = None
    ) -> Task:
        """The payload row and the active task; ``task_id`` is one the caller
        reserved from ``lisk_counter``, else the counter's next value."""
        self._exec(txn, INSERT_DATA, (request.data,))
        data_id = int(txn.lastrowid)
        if task_id is None:
            task_id = self._engine.next_counter(txn, COUNTER_NAME)
        self._exec(
            txn,
            INSERT_TASK,
            (
                task_id,
                request.task_class,
                request.delay_until,
                data_id,
                request.priority,
                request.object_phid or None,
                request.container_phid or None,
                now,
                now,
            ),
        )
        return request.new_task(task_id, data_id, now)

    # -- lease ---------------------------------------------------------------

    async def lease(
        self, owner: str, limit: int, lease_duration: int, task_classes: Sequence[str] | None = None
    ) -> list[Task]:
        now = self._now()
        exp = check_u32("leaseExpires", now + lease_duration)
        classes = tuple(dict.fromkeys(task_classes or ()))
        claim = Deferred.fromCoroutine(
            self.db.run("lease", self._lease_txn, owner, limit, exp, now, classes)
        )
        return await outliving_caller(claim, lambda won: self._give_back(owner, exp, won))

    def _give_back(self, owner: str, exp: int, tasks: list[Task]) -> None:
        if not tasks:
            return
        ids = [task.id for task in tasks]
        log_handed_back(owner, ids)

        def give_back(txn) -> None:
            self._engine.begin_write(txn)
            self._exec(txn, GIVE_BACK.format(ids=_marks(len(ids))), (self._now(), *ids, owner, exp))

        d = self._giving_back.track(Deferred.fromCoroutine(self.db.run("give_back", give_back)))
        d.addErrback(
            lambda f: log.failure(
                "LEASE_HAND_BACK_FAILED task_ids={task_ids}", f, level=LogLevel.error, task_ids=ids
            )
        )

    def _lease_txn(
        self, txn, owner: str, limit: int, exp: int, now: int, classes: tuple[str, ...]
    ) -> list[Task]:
        claimant = _Claimant(owner, exp, classes)
        phases = _lease_phases(classes, now)
        self._engine.begin_write(txn, read_committed=True)
        try:
            won = self._claim_phases(txn, phases, claimant, limit, self._take_all)
        except _Contended:
            # Which rows the statement took is unknowable: undo it and claim
            # row by row, which tells each row's winner.
            txn.execute("ROLLBACK")
            self._engine.begin_write(txn, read_committed=True)
            won = self._claim_phases(txn, phases, claimant, limit, self._take_each)
        if not won:
            return []
        self._exec(txn, FETCH_WON.format(ids=_marks(len(won))), (*won, owner))
        return [self._task_row(row, with_data=True) for row in txn.fetchall()]

    def _claim_phases(
        self,
        txn,
        phases: tuple[_LeasePhase, ...],
        claimant: _Claimant,
        limit: int,
        take: _Take,
    ) -> list[int]:
        """Fill the lease from each phase in turn until ``limit`` rows are won."""
        won: list[int] = []
        for phase in phases:
            if len(won) >= limit:
                break
            won += self._claim_rounds(txn, phase, claimant, limit - len(won), take)
        return won

    def _claim_rounds(
        self, txn, phase: _LeasePhase, claimant: _Claimant, want: int, take: _Take
    ) -> list[int]:
        """Read candidates and take them, again while others took some of
        them first, for at most a few rounds."""
        won: list[int] = []
        for _ in range(_CLAIM_ROUNDS):
            need = want - len(won)
            self._exec(txn, phase.candidates, (*phase.bound, *claimant.classes, need))
            ids = [int(r[0]) for r in txn.fetchall()]
            won += take(txn, phase, claimant, ids)
            if len(won) >= want or len(ids) < need:
                break
        return won

    def _take_all(self, txn, phase: _LeasePhase, claimant: _Claimant, ids: list[int]) -> list[int]:
        """One statement for every candidate; a row that another claimer got
        first makes the count fall short and fails the whole attempt."""
        if not ids:
            return []
        self._exec(
            txn,
            phase.claim_all.format(ids=_marks(len(ids))),
            (claimant.owner, claimant.expires, *ids, *phase.bound),
        )
        if txn.rowcount != len(ids):
            raise _Contended()
        return ids

    def _take_each(self, txn, phase: _LeasePhase, claimant: _Claimant, ids: list[int]) -> list[int]:
        """One compare-and-set per candidate: each row's count says who won it."""
        won: list[int] = []
        for task_id in ids:
            self._exec(
                txn, phase.claim_one, (claimant.owner, claimant.expires, task_id, *phase.bound)
            )
            if txn.rowcount == 1:
                won.append(task_id)
        return won

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
            "complete", self._complete_txn, task_id, duration, self._now(), owner, tuple(followups)
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
        task = self._held_txn(txn, task_id, owner, replay=True)
        if isinstance(task, ArchivedTask):
            # A replay: the report that archived it inserted the children.
            return Completion(task)
        archived = self._write_archive(txn, task, RESULT_SUCCESS, duration, now)
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
            "cancel", self._archive_txn, task_id, RESULT_CANCELLED, self._now()
        )

    async def fail(
        self, task_id: int, permanent: bool, retry_wait: int, owner: str | None = None
    ) -> ArchivedTask | Task | None:
        now = self._now()
        if permanent:
            return await self.db.run("fail", self._archive_txn, task_id, RESULT_FAILURE, now, owner)
        return await self.db.run(
            "fail_temporarily", self._temporary_fail_txn, task_id, now, now + retry_wait, owner
        )

    @overload
    def _held_txn(
        self, txn, task_id: int, owner: str | None, replay: Literal[False] = False
    ) -> Task: ...

    @overload
    def _held_txn(
        self, txn, task_id: int, owner: str | None, replay: Literal[True]
    ) -> Task | ArchivedTask: ...

    def _held_txn(
        self, txn, task_id: int, owner: str | None, replay: bool = False
    ) -> Task | ArchivedTask:
        """The active row a (possibly fenced) call may change, read with a row
        lock; TaskNotFound / LeaseConflict as the TaskStore fencing note says.
        With ``replay``, a success archived (with this owner, when fenced) is
        returned instead of an active row."""
        self._exec(txn, SELECT_ACTIVE.format(lock=self._engine.for_update), (task_id,))
        row = txn.fetchone()
        if row is None:
            previous = None
            if replay or owner is not None:
                previous = self._archived_txn(txn, task_id)
            if (
                replay
                and previous is not None
                and previous.result == RESULT_SUCCESS
                and (owner is None or previous.lease_owner == owner)
            ):
                return previous
            if owner is not None and previous is not None:
                raise LeaseConflict(task_id)
            raise TaskNotFound(task_id)
        task = self._task_row(row)
        if owner is not None and task.lease_owner != owner:
            raise LeaseConflict(task_id)
        return task

    def _archive_txn(
        self, txn, task_id: int, result: int, now: int, owner: str | None = None
    ) -> ArchivedTask:
        """A cancel or a permanent failure (duration 0, no replay)."""
        self._engine.begin_write(txn)
        return self._archive_in(txn, task_id, result, now, owner)

    def _archive_in(
        self, txn, task_id: int, result: int, now: int, owner: str | None
    ) -> ArchivedTask:
        return self._write_archive(txn, self._held_txn(txn, task_id, owner), result, 0, now)

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

    def _check_expiry(self, txn, task_id: int, field: str, expires: int, owner: str | None) -> int:
        """An unknown id is not-found, and a fenced call on a task held by
        another owner a conflict, before any range check of a computed expiry,
        as in the model and Redis stores."""
        try:
            return check_u32(field, expires)
        except InvalidArgument:
            self._held_txn(txn, task_id, owner)
            raise

    def _temporary_fail_txn(
        self, txn, task_id: int, now: int, expires: int, owner: str | None
    ) -> Task:
        self._engine.begin_write(txn)
        return self._temporary_fail_in(txn, task_id, now, expires, owner)

    def _temporary_fail_in(
        self, txn, task_id: int, now: int, expires: int, owner: str | None
    ) -> Task:
        if owner is not None:
            self._held_txn(txn, task_id, owner)
        expires = self._check_expiry(txn, task_id, "retryWait", expires, owner)
        self._exec(txn, TEMPORARY_FAIL, (now, expires, now, task_id))
        if txn.rowcount != 1:
            raise TaskNotFound(task_id)
        self._exec(txn, SELECT_ACTIVE.format(lock=""), (task_id,))
        return self._task_row(txn.fetchone())

    async def yield_(self, task_id: int, duration: int, owner: str | None = None) -> None:
        now = self._now()
        await self.db.run(
            "yield", self._yield_txn, task_id, now, now + max(duration, MIN_YIELD), owner
        )

    def _yield_txn(self, txn, task_id: int, now: int, expires: int, owner: str | None) -> None:
        self._engine.begin_write(txn)
        self._yield_in(txn, task_id, now, expires, owner)

    def _yield_in(self, txn, task_id: int, now: int, expires: int, owner: str | None) -> None:
        # Existence by a locking read: an identical yield in the same second
        # changes no row, and the pool reports changed rows, not matched ones.
        self._held_txn(txn, task_id, owner)
        expires = check_u32("duration", expires)
        self._exec(txn, YIELD, (YIELD_OWNER, expires, now, task_id))

    # -- batched reports ---------------------------------------------------------

    async def report(
        self, reports: Sequence[Report], owner: str | None = None
    ) -> list[ReportResult]:
        reports = list(reports)
        if not reports:
            return []
        return await self.db.run("report", self._report_txn, reports, owner, self._now())

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
                row = self._archive_in(txn, task_id, RESULT_FAILURE, now, owner)
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
        permanent failure) with the same checks as :meth:`_held_txn`."""
        ids = sorted(reports[i].task_id for i in indexes)
        self._exec(
            txn, SELECT_ACTIVE_MANY.format(ids=_marks(len(ids)), lock=self._engine.for_update), ids
        )
        active = {task.id: task for task in map(self._task_row, txn.fetchall())}
        missing = [task_id for task_id in ids if task_id not in active]
        previous: dict[int, ArchivedTask] = {}
        if missing:
            self._exec(txn, SELECT_ARCHIVED_MANY.format(ids=_marks(len(missing))), missing)
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
            task_id, complete = report.task_id, report.outcome == REPORT_COMPLETE
            task = active.get(task_id)
            if task is None:
                was = previous.get(task_id)
                if (
                    complete
                    and was is not None
                    and was.result == RESULT_SUCCESS
                    and (owner is None or was.lease_owner == owner)
                ):
                    results[i] = ReportResult(task_id, was.task_class)
                elif owner is not None and was is not None:
                    results[i] = ReportResult(task_id, error=LeaseConflict(task_id))
                else:
                    results[i] = ReportResult(task_id, error=TaskNotFound(task_id))
            elif owner is not None and task.lease_owner != owner:
                results[i] = ReportResult(task_id, error=LeaseConflict(task_id))
            else:
                rows.append(
                    archive_of(
                        task,
                        result=RESULT_SUCCESS if complete else RESULT_FAILURE,
                        duration=report.duration if complete else 0,
                        now=now,
                    )
                )
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
        self._exec(txn, DELETE_ACTIVE_MANY.format(ids=_marks(len(rows))), [a.id for a in rows])

    async def renew(
        self, owner: str, task_ids: Sequence[int], duration: int
    ) -> dict[int, int | None]:
        ids = tuple(dict.fromkeys(int(i) for i in task_ids))
        exp = check_u32("duration", self._now() + duration)
        if not ids:
            return {}
        return await self.db.run("renew", self._renew_txn, owner, ids, exp)

    def _renew_txn(self, txn, owner: str, ids: tuple[int, ...], exp: int) -> dict[int, int | None]:
        self._engine.begin_write(txn)
        held: dict[int, int | None] = {}
        for start in range(0, len(ids), _AWAKEN_CHUNK):
            chunk = ids[start : start + _AWAKEN_CHUNK]
            marks = _marks(len(chunk))
            self._exec(txn, RENEW.format(ids=marks), (exp, *chunk, owner, exp))
            self._exec(
                txn, RENEWED.format(ids=marks, lock=self._engine.for_update), (*chunk, owner)
            )
            held.update((int(row[0]), int(row[1])) for row in txn.fetchall())
        return {task_id: held.get(task_id) for task_id in ids}

    async def awaken(self, task_ids: Sequence[int]) -> int:
        ids = tuple(dict.fromkeys(int(i) for i in task_ids))
        if not ids:
            return 0
        ago = self._now() - AWAKEN_WINDOW
        return await self.db.run("awaken", self._awaken_txn, ids, ago)

    def _awaken_txn(self, txn, ids: tuple[int, ...], ago: int) -> int:
        self._engine.begin_write(txn)
        changed = 0
        # Chunked: SQLite caps the number of bound parameters per statement.
        for start in range(0, len(ids), _AWAKEN_CHUNK):
            chunk = ids[start : start + _AWAKEN_CHUNK]
            self._exec(txn, AWAKEN.format(ids=_marks(len(chunk))), (ago, *chunk, YIELD_OWNER, ago))
            changed += int(txn.rowcount)
        return changed

    # -- dead tasks ------------------------------------------------------------

    async def list_archived(
        self, result: int | None, task_class: str | None, limit: int, offset: int
    ) -> list[ArchivedTask]:
        where: list[str] = []
        args: list[int | str] = []
        if result is not None:
            where.append("result = %s")
            args.append(result)
        if task_class is not None:
            where.append("taskClass = %s")
            args.append(task_class)
        statement = LIST_ARCHIVED.format(where=" WHERE " + " AND ".join(where) if where else "")

        def read(txn) -> list[ArchivedTask]:
            self._exec(txn, statement, (*args, limit, offset))
            return [
                archived_from_columns(dict(zip(ARCHIVE_COLUMNS, row, strict=True)))
                for row in txn.fetchall()
            ]

        return await self.db.run("list_archived", read)

    async def requeue(self, task_id: int) -> Task:
        return await self.db.run("requeue", self._requeue_txn, task_id, self._now())

    def _requeue_txn(self, txn, task_id: int, now: int) -> Task:
        self._engine.begin_write(txn)
        archived = self._archived_txn(txn, task_id, self._engine.for_update)
        if archived is None:
            self._exec(txn, SELECT_ACTIVE.format(lock=""), (task_id,))
            if txn.fetchone() is not None:
                raise TaskStateError(task_id, ACTIVE_NOT_ARCHIVED)
            raise TaskNotFound(task_id)
        if archived.result == RESULT_SUCCESS:
            raise TaskStateError(task_id, SUCCEEDED)
        # The payload row outlives the archive row's move.
        self._exec(txn, SELECT_DATA, (archived.data_id,))
        row = txn.fetchone()
        data = "" if row is None or row[0] is None else row[0]
        if isinstance(data, (bytes, bytearray)):
            data = bytes(data).decode("utf-8")
        return self._insert_txn(txn, requeue_request(archived, data), now)

    # -- operator verbs ----------------------------------------------------------

    def _active_txn(self, txn, task_id: int) -> Task:
        """The active row, locked; archived -> TaskStateError, else not found."""
        self._exec(txn, SELECT_ACTIVE.format(lock=self._engine.for_update), (task_id,))
        row = txn.fetchone()
        if row is None:
            if self._archived_txn(txn, task_id) is not None:
                raise TaskStateError(task_id, ARCHIVED_NOT_ACTIVE)
            raise TaskNotFound(task_id)
        return self._task_row(row)

    async def _operate(self, description: str, change, task_id: int, *args) -> Task:
        now = self._now()

        def txn_fn(txn) -> Task:
            self._engine.begin_write(txn)
            task = change(txn, self._active_txn(txn, task_id), now, *args)
            self._exec(txn, SELECT_ACTIVE.format(lock=""), (task_id,))
            return self._task_row(txn.fetchone()) if task is None else task

        return await self.db.run(description, txn_fn)

    async def delay(self, task_id: int, until: int) -> Task:
        def change(txn, task: Task, now: int) -> None:
            if task.lease_owner is not None:
                raise TaskStateError(task_id, LEASED)
            self._exec(txn, DELAY, (until, now, task_id))

        return await self._operate("delay", change, task_id)

    async def set_priority(self, task_id: int, priority: int) -> Task:
        def change(txn, task: Task, now: int) -> None:
            self._exec(txn, SET_PRIORITY, (priority, now, task_id))

        return await self._operate("set_priority", change, task_id)

    async def free(self, task_id: int) -> Task:
        def change(txn, task: Task, now: int) -> None:
            if task.lease_owner is None:
                raise TaskStateError(task_id, NOT_LEASED)
            self._exec(txn, FREE, (now, now, task_id))

        return await self._operate("free", change, task_id)

    async def retry(self, task_id: int, repeat: bool) -> Task:
        return await self.db.run("retry", self._retry_txn, task_id, repeat, self._now())

    def _retry_txn(self, txn, task_id: int, repeat: bool, now: int) -> Task:
        self._engine.begin_write(txn)
        archived = self._archived_txn(txn, task_id, self._engine.for_update)
        if archived is None:
            self._exec(txn, SELECT_ACTIVE.format(lock=""), (task_id,))
            if txn.fetchone() is not None:
                raise TaskStateError(task_id, ACTIVE_NOT_ARCHIVED)
            raise TaskNotFound(task_id)
        if archived.result == RESULT_SUCCESS and not repeat:
            raise TaskStateError(task_id, SUCCEEDED)
        task = unarchived(archived, now)
        self._exec(
            txn,
            UNARCHIVE,
            (
                task.id,
                task.task_class,
                task.data_id,
                task.priority,
                task.object_phid,
                task.container_phid,
                task.date_created,
                task.date_modified,
            ),
        )
        self._exec(txn, DELETE_ARCHIVED, (task_id,))
        return task

    # -- moving tasks between backends --------------------------------------------

    async def active_ids(self) -> list[int]:
        def read(txn) -> list[int]:
            self._exec(txn, ACTIVE_IDS)
            return [int(row[0]) for row in txn.fetchall()]

        return await self.db.run("active_ids", read)

    async def export_tasks(self, task_ids: Sequence[int]) -> list[Task]:
        ids = sorted(set(int(i) for i in task_ids))

        def read(txn) -> list[Task]:
            out: list[Task] = []
            for start in range(0, len(ids), _AWAKEN_CHUNK):
                chunk = ids[start : start + _AWAKEN_CHUNK]
                self._exec(txn, EXPORT.format(ids=_marks(len(chunk))), chunk)
                out += [self._task_row(row, with_data=True) for row in txn.fetchall()]
            return out

        return await self.db.run("export_tasks", read) if ids else []

    async def import_tasks(self, tasks: Sequence[Task], ledger: str, mark: int) -> list[int]:
        return await self.db.run("import_tasks", self._import_txn, list(tasks), ledger, mark)

    def _import_txn(self, txn, tasks: list[Task], ledger: str, mark: int) -> list[int]:
        self._engine.begin_write(txn)
        first = self._engine.reserve_counter(txn, COUNTER_NAME, len(tasks)) if tasks else 0
        ids = []
        for offset, task in enumerate(tasks):
            self._exec(txn, INSERT_DATA, (task.data or "",))
            data_id = int(txn.lastrowid)
            ids.append(first + offset)
            self._exec(
                txn,
                IMPORT_TASK,
                (
                    first + offset,
                    task.task_class,
                    task.lease_owner,
                    task.lease_expires,
                    task.failure_count,
                    data_id,
                    task.failure_time,
                    task.priority,
                    task.object_phid,
                    task.container_phid,
                    task.date_created,
                    task.date_modified,
                ),
            )
        self._engine.set_counter(txn, ledger, mark)
        return ids

    async def migration_mark(self, ledger: str) -> int | None:
        def read(txn) -> int | None:
            self._exec(txn, LEDGER, (ledger,))
            row = txn.fetchone()
            return None if row is None else int(row[0])

        return await self.db.run("migration_mark", read)

    async def clear_migration_mark(self, ledger: str) -> None:
        def clear(txn) -> None:
            self._engine.begin_write(txn)
            self._exec(txn, CLEAR_LEDGER, (ledger,))

        await self.db.run("clear_migration_mark", clear)

    async def delete_tasks(self, tasks: Sequence[Task]) -> int:
        tasks = list(tasks)

        def delete(txn) -> int:
            self._engine.begin_write(txn)
            gone = 0
            for start in range(0, len(tasks), _AWAKEN_CHUNK):
                chunk = tasks[start : start + _AWAKEN_CHUNK]
                marks = _marks(len(chunk))
                self._exec(txn, DELETE_TASKS.format(ids=marks), [t.id for t in chunk])
                gone += int(txn.rowcount)
                self._exec(txn, DELETE_DATA.format(ids=marks), [t.data_id for t in chunk])
            return gone

        return await self.db.run("delete_tasks", delete) if tasks else 0

    # -- reads ---------------------------------------------------------------

    async def stats(self) -> Stats:
        # One read at a time: each brings the kept counts up to date from the last.
        return await self._stats_lock.run(lambda: Deferred.fromCoroutine(self._stats()))

    async def _stats(self) -> Stats:
        now = self._now()

        def read(txn):
            self._exec(txn, STATS, (now,))
            leased, failed = txn.fetchone()
            return int(leased), int(failed), self._counts.read(txn, self._exec, now)

        # The first read counts whole tables: its length grows with them, and
        # each of its statements is bounded by the driver.
        leased, failed, found = await self.db.run("stats", read, bounded=self._counts.loaded)
        active, archived = self._counts.apply(found)
        return Stats(active=active, leased=leased, archived=archived, failed=failed)

    async def list_tasks(self, limit: int, offset: int) -> list[Task]:
        each = min(limit + offset, _INT64_MAX)  # rows a page can need from each half

        def read(txn) -> list[Task]:
            self._exec(txn, LIST, (each, each, limit, offset))
            return [self._task_row(row) for row in txn.fetchall()]

        return await self.db.run("list_tasks", read)

    async def get_task(self, task_id: int) -> Task:
        def read(txn) -> Task:
            self._exec(txn, GET, (task_id,))
            row = txn.fetchone()
            if row is None:
                raise TaskNotFound(task_id)
            return self._task_row(row, with_data=True)

        return await self.db.run("get_task", read)

    async def get_archived(self, task_id: int) -> ArchivedTask | None:
        return await self.db.run("get_archived", self._archived_txn, task_id)

    def _archived_txn(self, txn, task_id: int, lock: str = "") -> ArchivedTask | None:
        self._exec(txn, SELECT_ARCHIVED.format(lock=lock), (task_id,))
        row = txn.fetchone()
        return (
            None
            if row is None
            else archived_from_columns(dict(zip(ARCHIVE_COLUMNS, row, strict=True)))
        )

    @staticmethod
    def _task_row(row: Sequence[Any], with_data: bool = False) -> Task:
        cols = dict(zip(TASK_COLUMNS, row[: len(TASK_COLUMNS)], strict=True))
        data = row[len(TASK_COLUMNS)] if with_data else None
        if with_data and data is None:
            data = ""
        return task_from_columns(cols, data)

    async def wake_check(self, since: int, now: int) -> tuple[int, bool]:
        def read(txn) -> tuple[int, bool]:
            self._exec(txn, WAKE_CHECK, (since, now))
            highest, due = txn.fetchone()
            return int(highest or 0), bool(due)

        return await self.db.run("wake_check", read)

    async def ping(self) -> str | None:
        return await self.db.ping()

    async def close(self) -> None:
        await self._giving_back.drain(GIVE_BACK_BUDGET, self._clock)
        self.db.close()
