"""The pieces every part of the SQL store shares: the database and its
engine, the task and archive rows, the statements that read them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.enterprise import adbapi
from twisted.internet.defer import DeferredLock
from twisted.internet.interfaces import IReactorTime

from gorge.app.inflight import InFlight
from gorge.db import Database, Engine
from gorge.db.clock import StoreTime
from gorge.taskqueue.counts import TaskCounts
from gorge.taskqueue.model import (
    ARCHIVE_COLUMNS,
    COUNTER_NAME,
    TASK_COLUMNS,
    ArchivedTask,
    EnqueueRequest,
    Task,
    archived_from_columns,
    task_from_columns,
)

DATABASE_NAME = "taskqueue"  # prefixes the transactions' log events: TASKQUEUE_TXN_RETRY

COLS = ", ".join(TASK_COLUMNS)
T_COLS = ", ".join(f"t.{c}" for c in TASK_COLUMNS)
A_COLS = ", ".join(ARCHIVE_COLUMNS)

INSERT_DATA = "INSERT INTO worker_taskdata (data) VALUES (%s)"

INSERT_TASK = (
    "INSERT INTO worker_activetask (id, taskClass, leaseOwner, leaseExpires, failureCount,"
    " dataID, failureTime, priority, objectPHID, containerPHID, dateCreated, dateModified)"
    " VALUES (%s, %s, NULL, %s, 0, %s, NULL, %s, %s, %s, %s, %s)"
)


SELECT_ACTIVE = f"SELECT {COLS} FROM worker_activetask WHERE id = %s{{lock}}"
SELECT_ARCHIVED = f"SELECT {A_COLS} FROM worker_archivetask WHERE id = %s{{lock}}"

# Rows per statement where a list of ids is bound: SQLite caps the number
# of bound parameters per statement.
CHUNK = 500


def marks(n: int) -> str:
    return ", ".join(["%s"] * n)


class SqlCalls:
    """The database, clock and row decoding the parts of
    :class:`gorge.taskqueue.sqlstore.SqlTaskStore` share.

    ``clock`` is the host's (timers); ``reactor`` (default: ``clock``)
    bounds each transaction. "Now", for every time the store writes or
    compares, is the subclass's :meth:`default_time`: the database server's
    clock on MySQL, where hosts share the tables, the host's on SQLite.
    ``db_clock`` (tests, the demo) is a clock the database's own follows
    (``UNIX_TIMESTAMP()`` pinned to it); ``time`` replaces "now" altogether
    (a test whose pool is scripted). A subclass names its engine.
    """

    @staticmethod
    def new_engine(clock: IReactorTime | None = None) -> Engine:
        raise NotImplementedError

    def __init__(
        self,
        pool: adbapi.ConnectionPool,
        clock: IReactorTime,
        *,
        reactor: IReactorTime | None = None,
        db_clock: IReactorTime | None = None,
        time: StoreTime | None = None,
    ) -> None:
        self.db = Database(
            self.new_engine(db_clock),
            pool,
            reactor if reactor is not None else clock,
            name=DATABASE_NAME,
        )
        self._engine = self.db.engine
        self._clock = clock
        self.time = time if time is not None else self.default_time(clock, db_clock)
        self._counts = TaskCounts()
        self._stats_lock = DeferredLock()
        self._giving_back = InFlight()

    def default_time(self, clock: IReactorTime, db_clock: IReactorTime | None) -> StoreTime:
        """Where "now" comes from; see the class doc."""
        raise NotImplementedError

    async def _now(self) -> int:
        # Whole seconds, as UNIX_TIMESTAMP() answers them.
        return int(await self.time.now())

    def _exec(self, txn, statement: str, args: Sequence[Any] = ()) -> None:
        self._engine.execute(txn, statement, args)

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
