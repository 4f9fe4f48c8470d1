"""Task handlers for the demo, registered through the worker's registry.

``FailOnce`` and ``YieldOnce`` show the two non-success paths a task can
take before it completes; :class:`Observed` wraps any handler so the demo
sees each run start and end (the worker itself logs successes at debug).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from twisted.internet.defer import maybeDeferred

from gorge.worker.outcome import RetryLater, Yield
from gorge.worker.registry import Handler

FAIL_ONCE_CLASS = "GorgeDemoFailOnceWorker"
YIELD_ONCE_CLASS = "GorgeDemoYieldOnceWorker"
YIELD_SECONDS = 5  # the queue's minimum yield window
RETRY_WAIT_SECONDS = 1


@dataclass(frozen=True)
class TaskRun:
    task_id: int
    task_class: str
    priority: int
    failure_count: int
    outcome: str = ""  # "" while running, then "ok", "retry", "yield" or "error"


class FailOnce:
    """Fails temporarily on its first run (failureCount 0), succeeds after."""

    async def __call__(self, task: dict, data: str | None) -> None:
        if int(task.get("failureCount") or 0) == 0:
            raise RetryLater("demo: failing once on purpose", retry_wait=RETRY_WAIT_SECONDS)


class YieldOnce:
    """Yields the first time it sees a task, completes the next time."""

    def __init__(self) -> None:
        self._yielded: set[int] = set()

    async def __call__(self, task: dict, data: str | None) -> None:
        task_id = int(task["id"])
        if task_id not in self._yielded:
            self._yielded.add(task_id)
            raise Yield(YIELD_SECONDS, "demo: yielding once on purpose")


class Observed:
    """Reports the start and the outcome of every run of ``handler``."""

    def __init__(self, handler: Handler, on_run: Callable[[TaskRun], None]) -> None:
        self._handler = handler
        self._on_run = on_run

    async def __call__(self, task: dict, data: str | None) -> None:
        run = TaskRun(
            int(task["id"]),
            str(task.get("taskClass", "")),
            int(task.get("priority") or 0),
            int(task.get("failureCount") or 0),
        )
        self._on_run(run)
        try:
            await maybeDeferred(self._handler, task, data)
        except Yield:
            self._on_run(_finished(run, "yield"))
            raise
        except RetryLater:
            self._on_run(_finished(run, "retry"))
            raise
        except Exception:
            self._on_run(_finished(run, "error"))
            raise
        self._on_run(_finished(run, "ok"))


def _finished(run: TaskRun, outcome: str) -> TaskRun:
    return TaskRun(run.task_id, run.task_class, run.priority, run.failure_count, outcome)


def observed_handlers(
    handlers: dict[str, Handler], on_run: Callable[[TaskRun], None]
) -> dict[str, Handler]:
    """The worker's ``extra_handlers``: each handler wrapped in :class:`Observed`."""
    return {task_class: Observed(handler, on_run) for task_class, handler in handlers.items()}
