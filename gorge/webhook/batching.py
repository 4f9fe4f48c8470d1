"""Requests made close together, handed to the database as one batch.

The dispatcher's slots each claim a row before they POST and write a result
after; issued one by one, those statements would alternate with the HTTP
exchanges. A :class:`Coalescer` gathers what the slots ask for within a short
window and runs it as one call (docs/webhook.md, "Claiming and writing back").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.python.failure import Failure

T = TypeVar("T")
R = TypeVar("R")


class Coalescer(Generic[T, R]):
    """Items submitted within ``window`` seconds of the first one go to ``flush``
    together, at most ``cap`` of them (a full batch goes at once).

    One batch runs at a time: what is submitted meanwhile goes as soon as it
    ends, so under load the batches grow by themselves. An urgent item (one
    a caller waits on before it can go on) is the exception: up to
    ``lanes`` batches may run at once when one of them holds an urgent item,
    so a hot hook's write does not wait behind another hook's batch
    already on its way (the items are distinct rows: they never contend).
    ``flush`` answers one result per item, in order; each item's Deferred
    fires with its own result, or with the batch's failure (the caller
    decides what to retry).
    """

    def __init__(
        self,
        flush: Callable[[list[T]], Awaitable[list[R]]],
        clock: IReactorTime,
        *,
        window: float,
        cap: int,
        lanes: int = 1,
    ) -> None:
        if cap < 1:
            raise ValueError("cap must be at least 1")
        if lanes < 1:
            raise ValueError("lanes must be at least 1")
        self._flush = flush
        self._clock = clock
        self._window = window
        self._cap = cap
        self._pending: list[tuple[T, Deferred[R]]] = []
        self._timer: IDelayedCall | None = None
        self._lanes = lanes
        self._running = 0  # batches on their way
        self._urgent_waiting = False  # an urgent item is among the pending

    @property
    def pending(self) -> int:
        """Items waiting for a batch (not counting the one running)."""
        return len(self._pending)

    def submit(self, item: T, *, urgent: bool = False) -> Deferred[R]:
        """``urgent``: someone waits on this item; it goes now, with whatever
        is pending, unless ``lanes`` batches are running (then as soon as
        one of them ends)."""
        result: Deferred[R] = Deferred()
        self._pending.append((item, result))
        if urgent:
            if self._running < self._lanes:
                self._start()
            else:
                self._urgent_waiting = True  # goes when a lane is free
        elif self._running:
            pass  # goes when a running batch ends
        elif len(self._pending) >= self._cap:
            self._start()
        elif self._timer is None:
            self._timer = self._clock.callLater(self._window, self._start)
        return result

    def _start(self) -> None:
        if self._timer is not None:
            if self._timer.active():
                self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending[: self._cap], self._pending[self._cap :]
        # Items left behind by the cap may include the urgent one: keep the flag then.
        self._urgent_waiting = self._urgent_waiting and bool(self._pending)
        self._running += 1
        Deferred.fromCoroutine(self._run(batch))

    async def _run(self, batch: list[tuple[T, Deferred[R]]]) -> None:
        try:
            results = await self._flush([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"{len(results)} results for {len(batch)} items")
        except Exception:
            failure = Failure()
            self._running -= 1
            for _, waiting in batch:
                waiting.errback(failure)
        else:
            self._running -= 1
            for (_, waiting), value in zip(batch, results, strict=True):
                waiting.callback(value)
        if not self._pending:
            return
        if not self._running or (self._urgent_waiting and self._running < self._lanes):
            self._start()
