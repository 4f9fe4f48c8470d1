"""The Redis store's read side: counts, pages of tasks and of the archive."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gorge.taskqueue.model import (
    ARCHIVE_COLUMNS,
    ArchivedTask,
    Stats,
    Task,
    archived_from_columns,
)
from gorge.taskqueue.redis_calls import RedisCalls
from gorge.taskqueue.redis_layout import task_of
from gorge.taskqueue.store import TaskNotFound
from gorge.taskqueue.waiting import HEAD_ROWS, MAX_PRIORITIES, Waiting, oldest_waiting

# Archive records read per script call when listing dead tasks.
ARCHIVE_PAGE = 500
_INT64_MAX = 2**63 - 1


class RedisReads(RedisCalls):
    """Reads of :class:`gorge.taskqueue.store.TaskStore` on Redis."""

    async def stats(self) -> Stats:
        k = self.keys
        active, held, archived, failed = await self._run(
            self.scripts.stats,
            [k.active, k.leased, k.archived_idx, k.counter_failed],
            [await self._now()],
        )
        return Stats(
            active=int(active), leased=int(held), archived=int(archived), failed=int(failed)
        )

    async def oldest_waiting(self) -> Waiting:
        now = await self._now()
        heads = await self._run(
            self.scripts.oldest_waiting,
            [self.keys.unleased, self.keys.leased],
            [now, HEAD_ROWS, MAX_PRIORITIES],
        )
        return oldest_waiting(now, json.loads(heads))

    async def list_tasks(self, limit: int, offset: int) -> list[Task]:
        # Ranks are Redis 64-bit integers: the last one is clamped so the
        # largest offset is an empty page, not an overflow.
        last = min(offset + limit - 1, _INT64_MAX)
        rows = await self._run(self.scripts.list_tasks, [self.keys.active], [offset, last])
        return [task_of(doc) for doc in json.loads(rows)]

    async def get_task(self, task_id: int) -> Task:
        reply = await self._run(self.scripts.get_task, [self.keys.task(task_id)], [])
        if not reply:
            raise TaskNotFound(task_id)
        return task_of(json.loads(reply))

    async def get_archived(self, task_id: int) -> ArchivedTask | None:
        # Named fields only: the record also holds the payload copy.
        key = self.keys.archived(task_id)
        values = await self._bounded(self._conn.hmget(key, list(ARCHIVE_COLUMNS)))
        cols: Mapping[str, Any] = dict(zip(ARCHIVE_COLUMNS, values, strict=True))
        if cols.get("id") in (None, ""):
            return None
        return archived_from_columns(cols)

    async def list_archived(
        self, result: int | None, task_class: str | None, limit: int, offset: int
    ) -> list[ArchivedTask]:
        # Filtered pages are matched inside Redis, a bounded page per call,
        # so a large archive never blocks the server for long.
        rows: list[ArchivedTask] = []
        skip, rank = offset, 0
        while rank >= 0 and len(rows) < limit:
            wanted = skip + limit - len(rows)
            reply = json.loads(
                await self._run(
                    self.scripts.list_archived,
                    [self.keys.archived_idx],
                    [
                        rank,
                        ARCHIVE_PAGE,
                        "" if result is None else result,
                        task_class or "",
                        wanted,
                    ],
                )
            )
            for doc in reply["rows"]:
                if skip:
                    skip -= 1
                    continue
                rows.append(archived_from_columns(doc))
            rank = reply["next"]
        return rows[:limit]

    async def wake_check(self, since: int, now: int) -> tuple[int, bool]:
        k = self.keys
        highest, due = await self._bounded(
            self.scripts.wake_check.run(
                self._conn, keys=[k.next_task_id, k.leased], args=[since, now]
            )
        )
        return int(highest), int(due) > 0
