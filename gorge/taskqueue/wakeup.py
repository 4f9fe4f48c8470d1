"""Lease calls held until a task may be runnable (docs/taskqueue.md, Long-poll).

A lease call that found nothing and asked to wait parks here. It is woken
when something suggests that a task it may take is runnable:

* an enqueue, or another change that makes a task runnable, made through
  this process (:meth:`LeaseWaiters.notify`, at once);
* a change the shared check sees: while anyone waits, one cheap query per
  check period for the whole process (not one per waiting call) notices
  tasks added by anyone else (Phorge writing its own rows, another replica)
  and tasks whose ``leaseExpires`` has just passed (a delay, a back-off, a
  yield or an expired lease coming due).

A woken call leases again; finding nothing, it waits for the rest of its
time. Wake-ups may be spurious, never lost: :attr:`LeaseWaiters.generation`
counts them, and a call that saw the count change while it was leasing does
not go to sleep.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import LogLevel

from gorge.db.clock import HostTime, StoreTime
from gorge.log.logger import Logger

log = Logger()

MAX_WAIT = 30
DEFAULT_CHECK_INTERVAL = 0.015

# (since, now) -> (highest active task id, whether a task's leaseExpires lies
# in [since, now)); see TaskStore.wake_check.
WakeCheck = Callable[[int, int], Awaitable[tuple[int, bool]]]


class _Waiter:
    def __init__(self, classes: frozenset[str] | None, forget: Callable[[_Waiter], None]) -> None:
        self.classes = classes
        self.done: Deferred = Deferred(lambda _: forget(self))
        self.timer: IDelayedCall | None = None

    def wants(self, task_class: str | None) -> bool:
        return task_class is None or self.classes is None or task_class in self.classes


class LeaseWaiters:
    """The lease calls of one taskqueue process that are waiting for work."""

    def __init__(
        self,
        check: WakeCheck | None,
        clock: IReactorTime,
        interval: float = DEFAULT_CHECK_INTERVAL,
        *,
        now: StoreTime | None = None,
    ) -> None:
        self._check = check
        self._clock = clock
        # The check's window is in the store's time (the database's or Redis'
        # clock, docs/taskqueue.md, Clocks): the host's would see a lease
        # come due minutes early or late on a host whose clock is off.
        self._now = now if now is not None else HostTime(clock)
        self._interval = interval
        self._waiters: list[_Waiter] = []
        self.generation = 0
        self._mark: int | None = None
        self._since: int | None = None
        self._timer: IDelayedCall | None = None
        self._checking = False
        self._check_started: float | None = None
        self._failing = False
        self._closed = False

    def __len__(self) -> int:
        return len(self._waiters)

    @property
    def closed(self) -> bool:
        return self._closed

    def wait(self, classes: Iterable[str] | None, timeout: float, seen: int) -> Deferred:
        """Fires True once a task of ``classes`` (None: any) may have become
        runnable since :attr:`generation` was ``seen`` (at once when it
        already changed), False after ``timeout`` seconds or on :meth:`close`.
        Cancelling it forgets the call."""
        if self._closed:
            return succeed(False)
        if self.generation != seen:
            return succeed(True)
        waiter = _Waiter(frozenset(classes) if classes else None, self._forget)
        waiter.timer = self._clock.callLater(max(0.0, timeout), self._release, waiter, False)
        self._waiters.append(waiter)
        self._schedule_check()
        return waiter.done

    def notify(self, task_class: str | None = None) -> None:
        """A task of ``task_class`` (None: of any class) may be runnable now."""
        self.generation += 1
        for waiter in [w for w in self._waiters if w.wants(task_class)]:
            self._release(waiter, True)

    def close(self) -> None:
        """Answer every waiting call now (empty), and every later one at once:
        a stopping service must not hold requests for their whole wait."""
        self._closed = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        for waiter in list(self._waiters):
            self._release(waiter, False)

    def _forget(self, waiter: _Waiter) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        if waiter.timer is not None and waiter.timer.active():
            waiter.timer.cancel()

    def _release(self, waiter: _Waiter, woken: bool) -> None:
        self._forget(waiter)
        if not waiter.done.called:
            waiter.done.callback(woken)

    # -- the shared check ------------------------------------------------------

    def _schedule_check(self) -> None:
        if (
            self._check is None
            or self._closed
            or self._checking
            or not self._waiters
            or (self._timer is not None and self._timer.active())
        ):
            return
        delay = self._interval
        if self._check_started is not None:
            # Checks start one period apart, not a period after the last one
            # ended: the time a check takes would otherwise add to every
            # pickup. A check slower than a period is followed by a full one.
            elapsed = self._clock.seconds() - self._check_started
            if 0 <= elapsed < delay:
                delay -= elapsed
        self._timer = self._clock.callLater(delay, self._run_check)

    def _run_check(self) -> None:
        self._timer = None
        self._checking = True
        self._check_started = self._clock.seconds()
        d = Deferred.fromCoroutine(self._check_once())
        d.addErrback(lambda f: log.failure("TASKQUEUE_WAKE_CHECK_CRASHED", f, level=LogLevel.error))
        d.addBoth(self._checked)

    def _checked(self, _) -> None:
        self._checking = False
        self._schedule_check()

    async def _check_once(self) -> None:
        check = self._check
        assert check is not None, "only scheduled with a check"
        try:
            now = int(await self._now.now())
            since = self._since if self._since is not None else now
            mark, due = await check(since, now)
        except Exception as e:
            # One line per failing streak: the backend's trouble shows on
            # every request already; held calls simply end at their wait.
            if not self._failing:
                log.warn("TASKQUEUE_WAKE_CHECK_FAILED error={error}", error=type(e).__name__)
                self._failing = True
            return
        if self._failing:
            log.info("TASKQUEUE_WAKE_CHECK_RECOVERED")
            self._failing = False
        # The first check has nothing to compare with: wake, in case a task
        # came in between a waiting call's lease and this check.
        changed = due or mark != self._mark
        self._mark, self._since = mark, now
        if changed and not self._closed:
            self.notify()
