"""Keeping a running task's lease (docs/worker.md, Long tasks).

:class:`LeaseGuard` cancels a handler at its lease deadline, a deadline that
renewals move; :class:`Heartbeat` renews every held lease in one call at a
short period and tells a task's guard when the queue says its lease is lost,
so the handler is cancelled (its outbound requests with it) and nothing is
reported.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

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


@dataclass
class HeldLease:
    """One running task's lease as the heartbeat renews it."""

    task_id: int
    task_class: str
    owner: str
    guard: LeaseGuard
    #: Seconds the queue last granted: a queue whose own lease is shorter
    #: than the heartbeat's is renewed at a third of it instead.
    granted: float


Renew = Callable[[list[tuple[int, str]], int, float], Awaitable[dict[int, "int | None"]]]


class Heartbeat:
    """Renews every lease this worker holds, all in one call, every
    ``period`` seconds, each by ``duration`` seconds (docs/worker.md,
    Heartbeat leases).

    A short lease renewed often means a worker that dies leaves its tasks
    leasable again within ``duration`` seconds, and a ``free``, ``cancel`` or
    ``delay`` of a running task is seen within ``period`` seconds: the
    answer for it is ``lost`` (each lease is fenced by its own owner string,
    so a re-lease of the task by this very worker does not count as ours)
    and its handler is cancelled.  The new deadline is counted on this
    host's clock from when the call was sent, plus the duration the queue
    granted: no other host's clock is read.
    """

    def __init__(
        self,
        *,
        renew: Renew,
        clock: IReactorTime,
        period: float,
        duration: int,
        on_result: Callable[[str], None] = lambda result: None,
        on_refused: Callable[[QueueError], None] = lambda exc: None,
    ) -> None:
        self._renew = renew
        self._clock = clock
        self.period = period
        self.duration = duration
        self._on_result = on_result
        self._on_refused = on_refused
        self._held: dict[int, HeldLease] = {}
        self._timer: IDelayedCall | None = None
        self._call: Deferred | None = None
        self._failing = False
        self.enabled = True

    def hold(self, lease: HeldLease) -> None:
        if not self.enabled or not lease.guard.running:
            return
        self._held[lease.task_id] = lease
        if self._call is None:
            self._arm()

    def _arm(self) -> None:
        """The next beat: after the period, or sooner when a held lease is
        shorter than three periods."""
        delay = min([self.period] + [lease.granted / 3 for lease in self._held.values()])
        if self._timer is not None and self._timer.active():
            if self._timer.getTime() <= self._clock.seconds() + delay:
                return
            self._timer.cancel()
        self._timer = self._clock.callLater(delay, self._beat)

    def release(self, lease: HeldLease) -> None:
        if self._held.get(lease.task_id) is lease:
            del self._held[lease.task_id]

    def stop(self) -> None:
        self._held.clear()
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self._call is not None and not self._call.called:
            self._call.cancel()

    def _beat(self) -> None:
        self._timer = None
        held = [lease for lease in self._held.values() if lease.guard.running]
        if not held or not self.enabled:
            return
        self._call = Deferred.fromCoroutine(self._renew_all(held))
        self._call.addErrback(self._crashed)
        self._call.addBoth(self._next)

    def _next(self, _result: object) -> None:
        self._call = None
        if self._held and self.enabled:
            self._arm()

    def _crashed(self, failure: Failure) -> None:
        if not failure.check(CancelledError):
            log.failure("WORKER_LEASE_RENEW_CRASHED", failure, level=LogLevel.error)

    async def _renew_all(self, held: list[HeldLease]) -> None:
        sent = self._clock.seconds()
        # The call must come back before the soonest deadline it could move.
        left = min(lease.guard.deadline for lease in held) - sent
        if left <= MIN_RENEWAL_LEAD:
            left = MIN_RENEWAL_LEAD
        try:
            answers = await self._renew(
                [(lease.task_id, lease.owner) for lease in held],
                self.duration,
                min(CALL_TIMEOUT, left),
            )
        except QueueError as exc:
            for _ in held:
                self._on_result("error")
            if not exc.retryable:
                self.enabled = False
                self._on_refused(exc)
                return
            if not self._failing:
                self._failing = True
                log.warn(
                    "WORKER_LEASE_RENEW_FAILED leases={leases} error={error}",
                    leases=len(held),
                    error=str(exc),
                )
            return
        if self._failing:
            self._failing = False
            log.info("WORKER_LEASE_RENEW_RECOVERED leases={leases}", leases=len(held))
        for lease in held:
            if lease.task_id not in answers or self._held.get(lease.task_id) is not lease:
                continue  # not answered (its deadline stays) or over meanwhile
            seconds = answers[lease.task_id]
            if seconds is None:
                self._on_result("lost")
                log.warn(
                    "WORKER_TASK_LEASE_LOST task_id={task_id} task_class={task_class}",
                    task_id=lease.task_id,
                    task_class=lease.task_class,
                )
                self.release(lease)
                lease.guard.lose()
                continue
            self._on_result("renewed")
            lease.granted = float(seconds)
            lease.guard.move_to(sent + seconds)
