"""One leased task between being accepted and its slot freeing: what the
runner, the reporter and the shutdown drain know about it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from twisted.internet.defer import Deferred

if TYPE_CHECKING:
    from gorge.worker.lease import LeaseGuard


class Run:
    def __init__(self, task: dict) -> None:
        self.task = task
        self.id: int = task["id"]
        self.task_class: str = task["taskClass"]
        # The owner the lease call leased it as: its renewals and report
        # are fenced by it (None: a task handed in without one).
        owner = task.get("leaseOwner")
        self.owner: str | None = owner if isinstance(owner, str) and owner else None
        self.deadline = 0.0
        self.current: Deferred | None = None  # handler, report or back-off wait
        # The handler's lease guard while it runs (lease.LeaseGuard).
        self.guard: LeaseGuard | None = None
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

    def lose(self) -> None:
        """The queue gave the task to another lease: stop the handler and
        report nothing (a report already under way is refused, 409)."""
        if self.guard is not None:
            self.guard.lose()
