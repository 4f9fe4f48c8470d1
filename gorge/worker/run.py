"""One leased task between being accepted and its slot freeing: what the
runner, the reporter and the shutdown drain know about it."""

from __future__ import annotations

from twisted.internet.defer import Deferred


class Run:
    def __init__(self, task: dict) -> None:
        self.task = task
        self.id: int = task["id"]
        self.task_class: str = task["taskClass"]
        self.deadline = 0.0
        self.current: Deferred | None = None  # handler, report or back-off wait
        self.abandoned = False
        # False for shutdown hand-backs and class skips: they move no counter,
        # not even when the drain budget cuts them.
        self.counted = True
        self.intended = "none"  # the outcome an uncounted run was reporting
        # Holds one of MAX_WORKERS slots until its handler has ended; the
        # report that follows does not (docs/worker.md, How work flows).
        self.slot = True
        # What a successful handler asked the queue to enqueue with its
        # archive (outcome.Completed).
        self.followups: tuple = ()
