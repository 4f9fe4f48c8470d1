"""The SQL store's operator verbs (``gorge queue``: delay, priority, free,
retry, requeue), each one transaction that refuses a task in the wrong state."""

from __future__ import annotations

from gorge.taskqueue.model import (
    ACTIVE_NOT_ARCHIVED,
    ARCHIVED_NOT_ACTIVE,
    NOT_LEASED,
    RESULT_SUCCESS,
    SUCCEEDED,
    Task,
    requeue_request,
    unarchived,
)
from gorge.taskqueue.sql_calls import SELECT_ACTIVE, SqlCalls
from gorge.taskqueue.store import (
    TaskNotFound,
    TaskStateError,
)

SELECT_DATA = "SELECT data FROM worker_taskdata WHERE id = %s"

# Operator verbs (Phorge's bin/worker delay, priority, free, retry).
# A delay takes the lease away too (Phorge's bin/worker refuses a leased task):
# the holder's next heartbeat answers lost, so its handler stops, and the
# task is not leased again before ``until``.
DELAY = (
    "UPDATE worker_activetask SET leaseOwner = NULL, leaseExpires = %s, dateModified = %s"
    " WHERE id = %s"
)
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


class SqlOperatorVerbs(SqlCalls):
    """Operator verbs of :class:`gorge.taskqueue.store.TaskStore` over the worker tables."""

    async def requeue(self, task_id: int) -> Task:
        return await self.db.run("requeue", self._requeue_txn, task_id, await self._now())

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
        now = await self._now()

        def txn_fn(txn) -> Task:
            self._engine.begin_write(txn)
            task = change(txn, self._active_txn(txn, task_id), now, *args)
            self._exec(txn, SELECT_ACTIVE.format(lock=""), (task_id,))
            return self._task_row(txn.fetchone()) if task is None else task

        return await self.db.run(description, txn_fn)

    async def delay(self, task_id: int, until: int) -> Task:
        def change(txn, task: Task, now: int) -> None:
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
        return await self.db.run("retry", self._retry_txn, task_id, repeat, await self._now())

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
