"""Work under way, tracked so that shutdown can wait for it within a
budget."""

from __future__ import annotations

from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.internet.interfaces import IReactorTime


class InFlight:
    """Work that shutdown has to wait for."""

    def __init__(self) -> None:
        self._pending: set[Deferred] = set()

    def __len__(self) -> int:
        return len(self._pending)

    def track(self, d: Deferred) -> Deferred:
        self._pending.add(d)

        def forget(result: object) -> object:
            self._pending.discard(d)
            return result

        d.addBoth(forget)
        return d

    def begin(self) -> Deferred:
        """Track work that has no Deferred of its own (a coroutine awaited
        in place): fire the Deferred returned when the work ends."""
        return self.track(Deferred())

    def drain(self, timeout: float, clock: IReactorTime) -> Deferred:
        """Fires True when everything tracked has finished, False on timeout.

        The tracked Deferreds are not cancelled: abandoning work is the
        caller's decision, and its result writes must not be cut off.
        """
        if not self._pending:
            return succeed(True)
        waiter = DeferredList([_observe(d) for d in list(self._pending)], consumeErrors=True)
        result: Deferred = Deferred()

        def expire() -> None:
            if not result.called:
                result.callback(False)

        timer = clock.callLater(timeout, expire)

        def finished(_: object) -> None:
            if timer.active():
                timer.cancel()
            if not result.called:
                result.callback(True)

        waiter.addBoth(finished)
        return result


def _observe(d: Deferred) -> Deferred:
    """A Deferred that fires when ``d`` does, without touching ``d``'s chain."""
    observer: Deferred = Deferred()

    def passthrough(result: object) -> object:
        observer.callback(None)
        return result

    d.addBoth(passthrough)
    return observer


class StopBudget:
    """One drain budget for every step of a stop, counted from its start."""

    def __init__(self, seconds: float, clock: IReactorTime) -> None:
        self.seconds = seconds
        self._clock = clock
        self._started: float | None = None

    def start(self) -> None:
        self._started = self._clock.seconds()

    def remaining(self) -> float:
        if self._started is None:
            return self.seconds
        return max(self.seconds - (self._clock.seconds() - self._started), 0.0)
