"""A handler that acknowledges a class without doing anything (worker.md §11.5)."""

from __future__ import annotations

from twisted.logger import Logger

log = Logger()


def noop(task_class: str, *, quiet: bool = False):
    async def handle(task: dict, data: str | None) -> None:
        if not quiet:
            log.info("NOOP_TASK class={task_class} task_id={task_id}",
                     task_class=task_class, task_id=task["id"])

    return handle
