"""Completes a task without doing anything.

Registered for the classes in ``GORGE_WORKER_NOOP_CLASSES``: task classes a
site wants drained without running them (a retired feature's workers), and
the no-op class benchmarks measure the queue and the worker with.
"""

from __future__ import annotations

from gorge.log.logger import Logger

log = Logger()


def noop(task_class: str, *, log_each: bool = True):
    """A handler that logs one line (class, id) and succeeds.

    ``log_each`` False: the level filter would drop that line anyway (below
    info), so it is not even built; on a drain of thousands of tasks a
    second, building it cost a tenth of the worker's time.
    """

    async def handle(task: dict, data: str | None) -> None:
        if not log_each:
            return
        log.info(
            "WORKER_NOOP_TASK task_class={task_class} task_id={task_id}",
            task_class=task_class,
            task_id=task["id"],
        )

    return handle
