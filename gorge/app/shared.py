"""One run of an asynchronous job at a time, shared by every caller that
arrives while it runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

T = TypeVar("T")


class SharedRun(Generic[T]):
    """Calling it starts ``job`` unless a run is under way, and answers that
    run's outcome on a Deferred of the caller's own: a caller that goes away
    (cancels) leaves the run going for the others, and the run is nobody's
    to cancel. Once a run ended, the next call starts another."""

    def __init__(self, job: Callable[[], Awaitable[T]]) -> None:
        self._job = job
        self._waiters: list[Deferred[T]] | None = None

    @property
    def running(self) -> bool:
        return self._waiters is not None

    def __call__(self) -> Deferred[T]:
        starting = self._waiters is None
        waiters = self._waiters = self._waiters if self._waiters is not None else []
        # Waiting before the run starts: a run that ends at once still answers.
        waiter: Deferred[T] = Deferred(waiters.remove)
        waiters.append(waiter)
        if starting:
            Deferred.fromCoroutine(self._run()).addBoth(self._ended)
        return waiter

    async def _run(self) -> T:
        return await self._job()

    def _ended(self, outcome: T | Failure) -> None:
        waiters, self._waiters = self._waiters or [], None
        for waiter in waiters:
            if isinstance(outcome, Failure):
                waiter.errback(outcome)
            else:
                waiter.callback(outcome)
