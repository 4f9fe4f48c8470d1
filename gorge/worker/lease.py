"""Keeping a running task's lease (docs/worker.md, Long tasks).

:class:`LeaseGuard` cancels a handler at its lease deadline, a deadline that
renewals move; :class:`LeaseKeeper` renews the lease at a third of the time
left and tells the guard when the queue says the lease is lost, so the
handler is cancelled (its outbound requests with it) and nothing is reported.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from twisted.internet.defer import CancelledError, Deferred, TimeoutError
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import LogLevel
from twisted.python.failure import Failure

from gorge.log.logger import Logger
from gorge.worker.queueclient import CALL_TIMEOUT, QueueError

log = Logger()

# Closer to the deadline than this, a renewal could not come back in time:
# the deadline decides.
MIN_RENEWAL_LEAD = 0.5

Renew = Callable[[int, float], Awaitable["int | None"]]


class LeaseLost(Exception):
    """The queue answered that another holder has the task (or none has)."""


class LeaseGuard:
    """Cancels ``d`` at ``deadline`` or when :meth:`lose` is called.

    A failure of ``d`` that follows either becomes :class:`TimeoutError`
    (deadline) or :class:`LeaseLost`, whatever the cancelled work raised (a
    handler may turn the cancel into a failure of its own).
    """

    def __init__(self, d: Deferred, deadline: float, clock: IReactorTime) -> None:
        self._d = d
        self._clock = clock
        self.deadline = deadline
        self.expired = False
        self.lost = False
        self._call: IDelayedCall | None = None
        if d.called:
            # Over before it waited on anything (a no-op, a refusal): there is
            # no deadline to guard, and a timer per such task is pure cost.
            return
        self._call = clock.callLater(max(0.0, deadline - clock.seconds()), self._expire)
        d.addBoth(self._settle)

    @property
    def running(self) -> bool:
        return self._call is not None and self._call.active()

    def move_to(self, deadline: float) -> None:
        """A renewal pushed the lease out; never pulls it in."""
        if self._call is not None and self._call.active() and deadline > self.deadline:
            self.deadline = deadline
            self._call.reset(max(0.0, deadline - self._clock.seconds()))

    def lose(self) -> None:
        if self._call is not None and self._call.active():
            self.lost = True
            self._call.cancel()
            self._d.cancel()

    def _expire(self) -> None:
        self.expired = True
        self._d.cancel()

    def _settle(self, result):
        if self._call is not None and self._call.active():
            self._call.cancel()
        if isinstance(result, Failure):
            if self.lost:
                raise LeaseLost()
            if self.expired:
                raise TimeoutError(f"lease deadline {self.deadline:g} passed")
        return result


class LeaseKeeper:
    """Renews one task's lease while its handler runs.

    The first renewal goes out after a third of the time left on the lease,
    each next one after a third of the renewed lease. A renewal that fails
    in transit is tried again a third of the remaining time later; a refusal
    (a queue without renewal answers 404) ends renewing, the deadline stays.
    """

    def __init__(
        self,
        *,
        task_id: int,
        task_class: str,
        guard: LeaseGuard,
        renew: Renew,
        clock: IReactorTime,
        on_result: Callable[[str], None] = lambda result: None,
        on_refused: Callable[[QueueError], None] = lambda exc: None,
    ) -> None:
        self._task_id = task_id
        self._task_class = task_class
        self._guard = guard
        self._renew = renew
        self._clock = clock
        self._on_result = on_result
        self._on_refused = on_refused
        self._timer: IDelayedCall | None = None
        self._call: Deferred | None = None
        self._stopped = False
        self._failing = False

    def start(self) -> None:
        self._schedule()

    def stop(self) -> None:
        self._stopped = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        if self._call is not None and not self._call.called:
            self._call.cancel()

    def _schedule(self) -> None:
        left = self._guard.deadline - self._clock.seconds()
        if self._stopped or not self._guard.running or left <= MIN_RENEWAL_LEAD:
            return
        self._timer = self._clock.callLater(left / 3, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._call = Deferred.fromCoroutine(self._renew_once())
        self._call.addErrback(self._crashed)

    def _crashed(self, failure: Failure) -> None:
        if not failure.check(CancelledError):
            log.failure(
                "WORKER_LEASE_RENEW_CRASHED task_id={task_id}",
                failure,
                level=LogLevel.error,
                task_id=self._task_id,
            )

    async def _renew_once(self) -> None:
        left = self._guard.deadline - self._clock.seconds()
        try:
            expires = await self._renew(self._task_id, min(CALL_TIMEOUT, left))
        except QueueError as exc:
            if self._stopped:
                return
            self._on_result("error")
            if not exc.retryable:
                self._on_refused(exc)
                return
            if not self._failing:
                self._failing = True
                log.warn(
                    "WORKER_LEASE_RENEW_FAILED "
                    "task_id={task_id} task_class={task_class} error={error}",
                    task_id=self._task_id,
                    task_class=self._task_class,
                    error=str(exc),
                )
            self._schedule()
            return
        if self._stopped:
            return
        if expires is None:
            self._on_result("lost")
            log.warn(
                "WORKER_TASK_LEASE_LOST task_id={task_id} task_class={task_class}",
                task_id=self._task_id,
                task_class=self._task_class,
            )
            self._guard.lose()
            return
        self._on_result("renewed")
        if self._failing:
            self._failing = False
            log.info("WORKER_LEASE_RENEW_RECOVERED task_id={task_id}", task_id=self._task_id)
        log.debug(
            "WORKER_LEASE_RENEWED task_id={task_id} lease_expires={lease_expires}",
            task_id=self._task_id,
            lease_expires=expires,
        )
        self._guard.move_to(float(expires))
        self._schedule()
