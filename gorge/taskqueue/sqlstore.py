"""TaskStore over Phorge's worker tables, shared by the MySQL and SQLite backends.

The statements are written once, with ``%s`` placeholders; everything that
differs between the two databases (placeholder style, the lisk_counter
upsert, row locks, transaction start, which errors are worth a retry) lives
in a :class:`Dialect` object, so the methods below have no per-backend branches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.enterprise import adbapi
from twisted.internet.defer import Deferred, DeferredLock
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from gorge.taskqueue.counts import TaskCounts
from gorge.taskqueue.model import (
    AWAKEN_WINDOW,
    MIN_YIELD,
    RESULT_CANCELLED,
    RESULT_FAILURE,
    RESULT_SUCCESS,
    TASK_COLUMNS,
    ARCHIVE_COLUMNS,
    YIELD_OWNER,
    ArchivedTask,
    EnqueueRequest,
    InvalidArgument,
    Stats,
    Task,
    archive_of,
    archived_from_columns,
    check_u32,
    task_from_columns,
)
from gorge.taskqueue.store import TaskNotFound

log = Logger()

_COLS = ", ".join(TASK_COLUMNS)
_T_COLS = ", ".join(f"t.{c}" for c in TASK_COLUMNS)
_A_COLS = ", ".join(ARCHIVE_COLUMNS)

INSERT_DATA = "INSERT INTO worker_taskdata (data) VALUES (%s)"

INSERT_TASK = (
    "INSERT INTO worker_activetask (id, taskClass, leaseOwner, leaseExpires, failureCount,"
    " dataID, failureTime, priority, objectPHID, containerPHID, dateCreated, dateModified)"
    " VALUES (%s, %s, NULL, %s, 0, %s, NULL, %s, %s, %s, %s, %s)"
)

# Phase 1: never leased and not delayed (r4 predicate, spec §6.2).
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
SELECT_ARCHIVED = f"SELECT {_A_COLS} FROM worker_archivetask WHERE id = %s"

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
GET = (
    f"SELECT {_T_COLS}, COALESCE(d.data, '') FROM worker_activetask t"
    " LEFT JOIN worker_taskdata d ON d.id = t.dataID WHERE t.id = %s"
)

# A concurrent claimer can take candidates between our SELECT and UPDATE;
# re-select a few times before answering with fewer tasks than asked for.
_CLAIM_ROUNDS = 4
_TXN_ATTEMPTS = 3
_INT64_MAX = 2**63 - 1  # the largest LIMIT both databases take
_AWAKEN_CHUNK = 500


def _marks(n: int) -> str:
    return ", ".join(["%s"] * n)


class _Contended(Exception):
    """A one-statement claim lost some candidates to a concurrent claimer."""


class Dialect:
    """What differs between SQL databases.  Subclasses override; methods take a txn."""

    name = "sql"

    def sql(self, statement: str) -> str:
        return statement

    def begin_write(self, txn) -> None:
        """Start a transaction that will write."""

    def begin_lease(self, txn) -> None:
        """Start the lease transaction (MySQL lowers isolation so re-selects see commits)."""
        self.begin_write(txn)

    lock = ""

    def next_task_id(self, txn) -> int:
        raise NotImplementedError

    def is_retryable(self, exc: BaseException) -> bool:
        return False

    async def ping(self, pool: adbapi.ConnectionPool, clock: IReactorTime) -> str | None:
        raise NotImplementedError


class SqlTaskStore:
    """TaskStore over ``worker_activetask`` / ``worker_archivetask`` /
    ``worker_taskdata`` / ``lisk_counter``; see :mod:`gorge.taskqueue.store`."""

    def __init__(self, pool: adbapi.ConnectionPool, clock: IReactorTime, dialect: Dialect) -> None:
        self._pool = pool
        self._clock = clock
        self._dialect = dialect
        self._counts = TaskCounts()
        self._stats_lock = DeferredLock()

    @property
    def pool(self) -> adbapi.ConnectionPool:
        return self._pool

    def _now(self) -> int:
        return int(self._clock.seconds())

    def _exec(self, txn, statement: str, args: Sequence[Any] = ()) -> None:
        txn.execute(self._dialect.sql(statement), tuple(args))

    async def _run(self, fn, *args) -> Any:
        for attempt in range(1, _TXN_ATTEMPTS + 1):
            try:
                return await self._pool.runInteraction(fn, *args)
            except Exception as e:
                if attempt == _TXN_ATTEMPTS or not self._dialect.is_retryable(e):
                    raise
                log.info("TASKQUEUE_TXN_RETRY attempt={attempt} error={error}",
                         attempt=attempt, error=type(e).__name__)
        raise AssertionError("unreachable")

    # -- enqueue -------------------------------------------------------------

    async def enqueue(self, request: EnqueueRequest) -> Task:
        now = self._now()
        return await self._run(self._enqueue_txn, request, now)

    def _enqueue_txn(self, txn, request: EnqueueRequest, now: int) -> Task:
        self._dialect.begin_write(txn)
        self._exec(txn, INSERT_DATA, (request.data,))
        data_id = int(txn.lastrowid)
        task_id = self._dialect.next_task_id(txn)
        self._exec(
            txn,
            INSERT_TASK,
            (task_id, request.task_class, request.delay_until, data_id, request.priority,
             request.object_phid or None, request.container_phid or None, now, now),
        )
        return Task(
            id=task_id, task_class=request.task_class, lease_owner=None,
            lease_expires=request.delay_until, failure_count=0, data_id=data_id,
            failure_time=None, priority=request.priority,
            object_phid=request.object_phid or None,
            container_phid=request.container_phid or None,
            date_created=now, date_modified=now,
        )

    # -- lease ---------------------------------------------------------------

    async def lease(self, owner: str, limit: int, lease_duration: int,
                    task_classes: Sequence[str] | None = None) -> list[Task]:
        now = self._now()
        exp = check_u32("leaseExpires", now + lease_duration)
        classes = tuple(dict.fromkeys(task_classes or ()))
        return await self._run(self._lease_txn, owner, limit, exp, now, classes)

    def _lease_txn(self, txn, owner: str, limit: int, exp: int, now: int,
                   classes: tuple[str, ...]) -> list[Task]:
        self._dialect.begin_lease(txn)
        try:
            won = self._claim_phases(txn, owner, limit, exp, now, classes, at_once=True)
        except _Contended:
            # Which rows the statement took is unknowable: undo it and claim
            # row by row, which tells each row's winner.
            txn.execute("ROLLBACK")
            self._dialect.begin_lease(txn)
            won = self._claim_phases(txn, owner, limit, exp, now, classes, at_once=False)
        if not won:
            return []
        self._exec(txn, FETCH_WON.format(ids=_marks(len(won))), (*won, owner))
        return [self._task_row(row, with_data=True) for row in txn.fetchall()]

    def _claim_phases(self, txn, owner: str, limit: int, exp: int, now: int,
                      classes: tuple[str, ...], *, at_once: bool) -> list[int]:
        class_sql = f" AND taskClass IN ({_marks(len(classes))})" if classes else ""
        won = self._claim(txn, PHASE1_CANDIDATES.format(classes=class_sql), (), classes,
                          PHASE1_CLAIM_ALL if at_once else PHASE1_CLAIM, (), owner, exp, limit,
                          at_once)
        if len(won) < limit:
            won += self._claim(txn, PHASE2_CANDIDATES.format(classes=class_sql), (now,), classes,
                               PHASE2_CLAIM_ALL if at_once else PHASE2_CLAIM, (now,), owner, exp,
                               limit - len(won), at_once)
        return won

    def _claim(self, txn, candidates_sql: str, pre: tuple, classes: tuple, claim_sql: str,
               claim_extra: tuple, owner: str, exp: int, want: int, at_once: bool) -> list[int]:
        won: list[int] = []
        for _ in range(_CLAIM_ROUNDS):
            need = want - len(won)
            self._exec(txn, candidates_sql, (*pre, *classes, need))
            ids = [int(r[0]) for r in txn.fetchall()]
            if at_once:
                if ids:
                    self._exec(txn, claim_sql.format(ids=_marks(len(ids))),
                               (owner, exp, *ids, *claim_extra))
                    if txn.rowcount != len(ids):
                        raise _Contended()
                    won += ids
            else:
                for task_id in ids:
                    self._exec(txn, claim_sql, (owner, exp, task_id, *claim_extra))
                    if txn.rowcount == 1:
                        won.append(task_id)
            if len(won) >= want or len(ids) < need:
                break
        return won

    # -- archive -------------------------------------------------------------

    async def complete(self, task_id: int, duration: int) -> ArchivedTask:
        return await self._run(self._archive_txn, task_id, RESULT_SUCCESS, duration,
                               self._now(), True)

    async def cancel(self, task_id: int) -> ArchivedTask:
        return await self._run(self._archive_txn, task_id, RESULT_CANCELLED, 0, self._now(), False)

    async def fail(
        self, task_id: int, permanent: bool, retry_wait: int
    ) -> ArchivedTask | Task | None:
        now = self._now()
        if permanent:
            return await self._run(self._archive_txn, task_id, RESULT_FAILURE, 0, now, False)
        return await self._run(self._temporary_fail_txn, task_id, now, now + retry_wait)

    def _archive_txn(self, txn, task_id: int, result: int, duration: int, now: int,
                     replay: bool) -> ArchivedTask:
        self._dialect.begin_write(txn)
        self._exec(txn, SELECT_ACTIVE.format(lock=self._dialect.lock), (task_id,))
        row = txn.fetchone()
        if row is None:
            if replay:
                previous = self._archived_txn(txn, task_id)
                if previous is not None and previous.result == RESULT_SUCCESS:
                    return previous
            raise TaskNotFound(task_id)
        archived = archive_of(self._task_row(row), result=result, duration=duration, now=now)
        self._exec(
            txn,
            INSERT_ARCHIVE,
            (archived.id, archived.task_class, archived.lease_owner, archived.lease_expires,
             archived.failure_count, archived.data_id, archived.priority, archived.object_phid,
             archived.container_phid, archived.date_created, archived.date_modified,
             archived.result, archived.duration, archived.archived_epoch),
        )
        self._exec(txn, DELETE_ACTIVE, (task_id,))
        return archived

    def _check_expiry(self, txn, task_id: int, field: str, expires: int) -> int:
        """An unknown id is not-found before any range check of a computed
        expiry (§6.4, §6.5), as in the model and Redis stores."""
        try:
            return check_u32(field, expires)
        except InvalidArgument:
            self._exec(txn, SELECT_ACTIVE.format(lock=""), (task_id,))
            if txn.fetchone() is None:
                raise TaskNotFound(task_id) from None
            raise

    def _temporary_fail_txn(self, txn, task_id: int, now: int, expires: int) -> Task:
        self._dialect.begin_write(txn)
        expires = self._check_expiry(txn, task_id, "retryWait", expires)
        self._exec(txn, TEMPORARY_FAIL, (now, expires, now, task_id))
        if txn.rowcount != 1:
            raise TaskNotFound(task_id)
        self._exec(txn, SELECT_ACTIVE.format(lock=""), (task_id,))
        return self._task_row(txn.fetchone())

    async def yield_(self, task_id: int, duration: int) -> None:
        now = self._now()
        await self._run(self._yield_txn, task_id, now, now + max(duration, MIN_YIELD))

    def _yield_txn(self, txn, task_id: int, now: int, expires: int) -> None:
        self._dialect.begin_write(txn)
        # Existence by a locking read: an identical yield in the same second
        # changes no row, and the pool reports changed rows, not matched ones.
        self._exec(txn, SELECT_ACTIVE.format(lock=self._dialect.lock), (task_id,))
        if txn.fetchone() is None:
            raise TaskNotFound(task_id)
        expires = check_u32("duration", expires)
        self._exec(txn, YIELD, (YIELD_OWNER, expires, now, task_id))

    async def awaken(self, task_ids: Sequence[int]) -> int:
        ids = tuple(dict.fromkeys(int(i) for i in task_ids))
        if not ids:
            return 0
        ago = self._now() - AWAKEN_WINDOW
        return await self._run(self._awaken_txn, ids, ago)

    def _awaken_txn(self, txn, ids: tuple[int, ...], ago: int) -> int:
        self._dialect.begin_write(txn)
        changed = 0
        # Chunked: SQLite caps the number of bound parameters per statement.
        for start in range(0, len(ids), _AWAKEN_CHUNK):
            chunk = ids[start:start + _AWAKEN_CHUNK]
            self._exec(txn, AWAKEN.format(ids=_marks(len(chunk))), (ago, *chunk, YIELD_OWNER, ago))
            changed += int(txn.rowcount)
        return changed

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

        leased, failed, found = await self._run(read)
        active, archived = self._counts.apply(found)
        return Stats(active=active, leased=leased, archived=archived, failed=failed)

    async def list_tasks(self, limit: int, offset: int) -> list[Task]:
        each = min(limit + offset, _INT64_MAX)  # rows a page can need from each half

        def read(txn) -> list[Task]:
            self._exec(txn, LIST, (each, each, limit, offset))
            return [self._task_row(row) for row in txn.fetchall()]

        return await self._run(read)

    async def get_task(self, task_id: int) -> Task:
        def read(txn) -> Task:
            self._exec(txn, GET, (task_id,))
            row = txn.fetchone()
            if row is None:
                raise TaskNotFound(task_id)
            return self._task_row(row, with_data=True)

        return await self._run(read)

    async def get_archived(self, task_id: int) -> ArchivedTask | None:
        return await self._run(self._archived_txn, task_id)

    def _archived_txn(self, txn, task_id: int) -> ArchivedTask | None:
        self._exec(txn, SELECT_ARCHIVED, (task_id,))
        row = txn.fetchone()
        return None if row is None else archived_from_columns(dict(zip(ARCHIVE_COLUMNS, row)))

    @staticmethod
    def _task_row(row: Sequence[Any], with_data: bool = False) -> Task:
        cols = dict(zip(TASK_COLUMNS, row))
        data = row[len(TASK_COLUMNS)] if with_data else None
        if with_data and data is None:
            data = ""
        return task_from_columns(cols, data)

    async def ping(self) -> str | None:
        return await self._dialect.ping(self._pool, self._clock)

    async def close(self) -> None:
        self._pool.close()
