"""The Redis store's operator verbs (``gorge queue``: delay, priority, free,
retry, requeue), each one script that refuses a task in the wrong state."""

from __future__ import annotations

import json
from typing import Any

from gorge.taskqueue.model import Task
from gorge.taskqueue.redis_calls import RedisCalls
from gorge.taskqueue.redis_layout import member, task_of
from gorge.taskqueue.redis_scripts import raise_state_refusal


def _operated(task_id: int, reply: Any) -> Task:
    raise_state_refusal(task_id, reply)
    return task_of(json.loads(reply))


class RedisOperatorVerbs(RedisCalls):
    """Operator verbs of :class:`gorge.taskqueue.store.TaskStore` on Redis."""

    async def requeue(self, task_id: int) -> Task:
        reply = await self._run_packed(
            self.scripts.requeue, self.keys.archived(task_id), [member(task_id), await self._now()]
        )
        return _operated(task_id, reply)

    async def delay(self, task_id: int, until: int) -> Task:
        k = self.keys
        reply = await self._run(
            self.scripts.delay,
            [k.task(task_id), k.unleased, k.leased],
            [member(task_id), until, await self._now()],
        )
        return _operated(task_id, reply)

    async def set_priority(self, task_id: int, priority: int) -> Task:
        k = self.keys
        reply = await self._run(
            self.scripts.set_priority,
            [k.task(task_id), k.active, k.unleased],
            [member(task_id), priority, await self._now()],
        )
        return _operated(task_id, reply)

    async def free(self, task_id: int) -> Task:
        k = self.keys
        reply = await self._run(
            self.scripts.free,
            [k.task(task_id), k.unleased, k.leased],
            [member(task_id), await self._now()],
        )
        return _operated(task_id, reply)

    async def retry(self, task_id: int, repeat: bool) -> Task:
        reply = await self._run_packed(
            self.scripts.retry,
            self.keys.archived(task_id),
            [member(task_id), await self._now(), "1" if repeat else "0"],
        )
        return _operated(task_id, reply)
