"""The Redis store's side of moving tasks between backends
(gorge/taskqueue/migrate.py): export, import under a ledger mark, delete."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gorge.taskqueue.model import Task
from gorge.taskqueue.redis_calls import RedisCalls
from gorge.taskqueue.redis_layout import member, pack, task_of
from gorge.taskqueue.redis_reads import ARCHIVE_PAGE


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _import_fields(task: Task) -> list[str]:
    """A task as import_tasks.lua takes it: every column but the ids, NULL as ''."""
    return [
        task.task_class,
        _text(task.lease_owner),
        _text(task.lease_expires),
        str(task.failure_count),
        _text(task.failure_time),
        str(task.priority),
        _text(task.object_phid),
        _text(task.container_phid),
        str(task.date_created),
        str(task.date_modified),
        task.data or "",
    ]


class RedisMigration(RedisCalls):
    """Migration calls of :class:`gorge.taskqueue.store.TaskStore` on Redis."""

    async def active_ids(self) -> list[int]:
        members = await self._bounded(self._conn.zrange(self.keys.active, 0, -1))
        return sorted(int(m) for m in members)

    async def export_tasks(self, task_ids: Sequence[int]) -> list[Task]:
        ids = sorted(set(task_ids))
        out: list[Task] = []
        for start in range(0, len(ids), ARCHIVE_PAGE):
            chunk = ids[start : start + ARCHIVE_PAGE]
            rows = await self._run(
                self.scripts.export_tasks, [self.keys.active], [member(i) for i in chunk]
            )
            out += [task_of(doc) for doc in json.loads(rows)]
        return out

    async def import_tasks(self, tasks: Sequence[Task], ledger: str, mark: int) -> list[int]:
        rows = [_import_fields(t) for t in tasks]
        ids = await self._run(
            self.scripts.import_tasks, [self.keys.next_task_id], [pack(rows), ledger, mark]
        )
        return [int(i) for i in ids or []]

    async def migration_mark(self, ledger: str) -> int | None:
        value = await self._bounded(self._conn.get(self.keys.migrated(ledger)))
        return None if value in (None, "") else int(value)

    async def clear_migration_mark(self, ledger: str) -> None:
        await self._bounded(self._conn.delete(self.keys.migrated(ledger)))

    async def delete_tasks(self, tasks: Sequence[Task]) -> int:
        gone = 0
        tasks = list(tasks)
        for start in range(0, len(tasks), ARCHIVE_PAGE):
            chunk = tasks[start : start + ARCHIVE_PAGE]
            gone += int(
                await self._run(
                    self.scripts.delete_tasks, [self.keys.active], [member(t.id) for t in chunk]
                )
            )
        return gone
