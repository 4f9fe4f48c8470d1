"""A poll loop on an injected clock that never overlaps itself and can be
woken early."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import LogLevel

from gorge.app.private_names import next_iteration
from gorge.log.logger import Logger

log = Logger()


class Poller:
    """Run ``tick`` every ``interval`` seconds; ticks never overlap.

    A failing tick is logged and the loop goes on (a bare LoopingCall dies on
    the first unhandled failure). :meth:`stop` fires once the tick in progress
    has finished; :meth:`wake` runs the next tick now when the loop is idle.
    """

    def __init__(
        self,
        tick: Callable[[], Awaitable[None]],
        interval: float,
        clock: IReactorTime,
        name: str,
        on_progress: Callable[[], None] | None = None,
    ) -> None:
        self._tick = tick
        self._interval = interval
        self._clock = clock
        self._name = name
        self._on_progress = on_progress
        self._loop: LoopingCall | None = None
        self._done: Deferred | None = None
        self._in_tick = False
        self._failing = False

    @property
    def running(self) -> bool:
        return self._loop is not None and self._loop.running

    def start(self, now: bool = True) -> None:
        self._loop = LoopingCall(self._run_once)
        self._loop.clock = self._clock
        self._done = self._loop.start(self._interval, now=now)
        self._done.addErrback(
            lambda f: log.failure(
                "POLL_LOOP_DIED name={name}", f, level=LogLevel.critical, name=self._name
            )
        )

    def _run_once(self) -> Deferred:
        return Deferred.fromCoroutine(self._guarded())

    async def _guarded(self) -> None:
        self._in_tick = True
        try:
            await self._tick()
        except Exception:
            # Log the first failure of a streak only: an unreachable database
            # must not print one traceback per tick.
            if not self._failing:
                log.failure("POLL_FAILED name={name}", level=LogLevel.error, name=self._name)
            self._failing = True
        else:
            if self._failing:
                log.info("POLL_RECOVERED name={name}", name=self._name)
            self._failing = False
            if self._on_progress is not None:
                self._on_progress()
        finally:
            self._in_tick = False

    def wake(self) -> None:
        """Run the next tick now unless one is running (prompt pickup)."""
        loop = self._loop
        if loop is None or not loop.running or self._in_tick:
            return
        call = next_iteration(loop)
        if call is not None and call.active():
            call.reset(0)

    def stop(self) -> Deferred:
        """Stop scheduling ticks; fires once the tick in progress finished."""
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        return self._done if self._done is not None else succeed(None)
