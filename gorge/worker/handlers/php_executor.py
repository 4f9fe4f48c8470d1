"""The local-executor delegate: run a PHP task in one of gorge-worker's own
PHP executors (which loaded Phorge once) and turn the answer into an outcome.

The answer has the shape ``worker.execute`` answers with, plus the task's
follow-ups: the tasks it staged with ``queueTask()``, which the worker hands
to the taskqueue with its success report instead of PHP writing them.
"""

from __future__ import annotations

from typing import Any

from gorge.worker.executor.pool import ExecutorPool
from gorge.worker.executor.process import ExecutorFailed
from gorge.worker.handlers.conduit import interpret_result, parse_followups
from gorge.worker.outcome import Completed, PermanentFailure, RetryLater
from gorge.worker.registry import is_php_class_name

#: The leased row's fields the executor needs so that it does not read the
#: row again (failure count for retry caps and waits, priority for the
#: follow-ups, and what a worker may look at).
TASK_FIELDS = (
    "failureCount",
    "failureTime",
    "priority",
    "dataID",
    "objectPHID",
    "containerPHID",
    "dateCreated",
)


class PhpExecutorDelegate:
    def __init__(self, pool: ExecutorPool, metrics=None) -> None:
        self._pool = pool
        self._metrics = metrics

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.executor_runs.labels(result=result).inc()

    async def __call__(self, task: dict, data: str | None) -> Completed:
        task_id, task_class = task["id"], task["taskClass"]
        if not is_php_class_name(task_class):
            raise PermanentFailure("invalid task class")
        fields: dict[str, Any] = {name: task[name] for name in TASK_FIELDS if name in task}
        request = {"taskID": task_id, "taskClass": task_class, "data": data or "", "task": fields}
        try:
            answer = await self._pool.run(request)
        except ExecutorFailed as exc:
            self._count("died")
            raise RetryLater(f"{task_class} (id={task_id}): {exc}") from exc
        self._count("answered")
        interpret_result(task_id, task_class, answer)
        return Completed(followups=parse_followups(task_class, task_id, answer))
