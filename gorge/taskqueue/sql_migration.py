"""The SQL store's side of moving tasks between backends
(gorge/taskqueue/migrate.py): export, import under a ledger mark, delete."""

from __future__ import annotations

from collections.abc import Sequence

from gorge.taskqueue.model import (
    COUNTER_NAME,
    Task,
)
from gorge.taskqueue.sql_calls import CHUNK, COLS, INSERT_DATA, T_COLS, SqlCalls, marks

# after the migration: Phorge reads only the counters it names itself.
ACTIVE_IDS = "SELECT id FROM worker_activetask ORDER BY id"
EXPORT = (
    f"SELECT {T_COLS}, COALESCE(d.data, '') FROM worker_activetask t"
    " LEFT JOIN worker_taskdata d ON d.id = t.dataID WHERE t.id IN ({ids}) ORDER BY t.id"
)
IMPORT_TASK = (
    f"INSERT INTO worker_activetask ({COLS})"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
LEDGER = "SELECT counterValue FROM lisk_counter WHERE counterName = %s"
CLEAR_LEDGER = "DELETE FROM lisk_counter WHERE counterName = %s"
DELETE_TASKS = "DELETE FROM worker_activetask WHERE id IN ({ids})"
DELETE_DATA = "DELETE FROM worker_taskdata WHERE id IN ({ids})"


class SqlMigration(SqlCalls):
    """Migration calls of :class:`gorge.taskqueue.store.TaskStore` over the worker tables."""

    async def active_ids(self) -> list[int]:
        def read(txn) -> list[int]:
            self._exec(txn, ACTIVE_IDS)
            return [int(row[0]) for row in txn.fetchall()]

        return await self.db.run("active_ids", read)

    async def export_tasks(self, task_ids: Sequence[int]) -> list[Task]:
        ids = sorted(set(int(i) for i in task_ids))

        def read(txn) -> list[Task]:
            out: list[Task] = []
            for start in range(0, len(ids), CHUNK):
                chunk = ids[start : start + CHUNK]
                self._exec(txn, EXPORT.format(ids=marks(len(chunk))), chunk)
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
            for start in range(0, len(tasks), CHUNK):
                chunk = tasks[start : start + CHUNK]
                placeholders = marks(len(chunk))
                self._exec(txn, DELETE_TASKS.format(ids=placeholders), [t.id for t in chunk])
                gone += int(txn.rowcount)
                self._exec(txn, DELETE_DATA.format(ids=placeholders), [t.data_id for t in chunk])
            return gone

        return await self.db.run("delete_tasks", delete) if tasks else 0
