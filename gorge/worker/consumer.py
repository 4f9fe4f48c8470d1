"""The consume loop: lease within free capacity, run each task in its own
slot before its lease deadline (renewing the lease while it runs), report
with bounded retries (docs/worker.md, Long tasks).

The loop schedules itself on the injected clock instead of using the
platform Poller because its cadence depends on the outcome of each lease:
lease again at once while the queue has more work and slots are free, wait a
poll interval when it is empty, sleep for the hibernation window if asked to.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from twisted.internet.defer import CancelledError, Deferred, TimeoutError, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import LoopingCall, deferLater
from twisted.logger import LogLevel

from gorge.app.inflight import InFlight
from gorge.log.logger import Logger
from gorge.worker.lease import LeaseGuard, LeaseKeeper, LeaseLost
from gorge.worker.metrics import WorkerMetrics
from gorge.worker.outcome import Completed, Outcome, classify
from gorge.worker.queueclient import QueueClient, QueueError
from gorge.worker.registry import LeasePlan, Registry

log = Logger()

REPORT_ATTEMPTS = 5
REPORT_BACKOFF = 0.2
SKIP_RETRY_WAIT = 60
HANDBACK_YIELD = 5
DEFAULT_LEASE_SECONDS = 7200
FAILING_SUMMARY_INTERVAL = 60.0
LEASE_CONFLICT = "ERR_LEASE_CONFLICT"


class DelegationGate(Protocol):
    """Whether delegated classes wait (conduit.DelegationPause)."""

    @property
    def paused(self) -> bool: ...

    def delegated(self, task_class: str) -> bool: ...

    def not_reached(self, reason: str) -> None: ...


class _NotOurs(enum.Enum):
    """A handler's end whose outcome this worker must not report."""

    NOT_OURS = "not ours"


_NOT_OURS = _NotOurs.NOT_OURS


class _ReportGaveUp(Exception):
    def __init__(self, reason: str, error: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error


class _RunAbandoned(Exception):
    """Shutdown gave up on the run while its report was on the way."""


def _refusal_reason(exc: QueueError) -> str:
    if exc.code == LEASE_CONFLICT:
        return "lease lost: another holder has the task"
    reason = f"queue refused the report (HTTP {exc.status})"
    if exc.status == 404:
        reason += "; outcome may already be recorded"
    return reason


@dataclass(frozen=True)
class LoopSettings:
    lease_limit: int = 4
    max_workers: int = 4
    poll_interval: float = 1.0
    idle_timeout: float = 180.0
    hibernate: float = 0.0
    drain_timeout: float = 30.0
    # Seconds the queue may hold an empty lease call (docs/worker.md,
    # Long-poll); 0 asks once per poll interval.
    lease_wait: float = 0.0
    # Whether the log level lets debug lines through: a filtered line still
    # costs its event (measured: a tenth of the worker's time per task).
    log_debug: bool = True


@dataclass
class Counters:
    processed: int = 0
    failed: int = 0
    yielded: int = 0
    unreported: int = 0


class _Run:
    """One leased task between being accepted and its slot freeing."""

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


def _call_handler(handler: Callable, task: dict, payload: str | None) -> Deferred:
    try:
        result = handler(task, payload)
    except Exception:
        return fail()
    if isinstance(result, Deferred):
        return result
    if inspect.iscoroutine(result):
        return Deferred.fromCoroutine(result)
    return succeed(result)


class Consumer:
    def __init__(
        self,
        *,
        queue: QueueClient,
        registry: Registry,
        plan: LeasePlan,
        clock: IReactorTime,
        settings: LoopSettings,
        metrics: WorkerMetrics,
        on_progress: Callable[[], None] | None = None,
        delegation: DelegationGate | None = None,
    ) -> None:
        self._queue = queue
        self._registry = registry
        self._plan = plan
        self._clock = clock
        self._settings = settings
        self._metrics = metrics
        self._on_progress = on_progress
        self._delegation = delegation
        self.counters = Counters()
        self._runs: dict[int, _Run] = {}
        self._running = 0
        # Read when scraped: setting it twice per task cost more than the task.
        metrics.active.set_function(lambda: self._running)
        self._inflight = InFlight()
        self._timer: IDelayedCall | None = None
        self._lease_d: Deferred | None = None
        self._stopping = False
        self._more_waiting = False
        # The queue held our last empty lease call for the wait asked: keep
        # one call in flight whenever slots are free (an older queue answers
        # at once, and is then asked once per poll interval).
        self._queue_holds = settings.lease_wait > 0
        self._lease_aborted = False
        self._lease_may_hold = False
        # Off once the queue refuses a renewal (an older queue has no route).
        self._renewals = True
        # Lease health, for /readyz and state-change logging.
        self.lease_attempted = False
        self.lease_error: str | None = None
        self._failing_since_count = 0
        self._failing_summary_at = 0.0
        # Idle tracking.
        self.idle = False
        self._idle_since: float | None = None
        self._hibernate_until: float | None = None
        self.first_lease_done: Deferred = Deferred()

    # -- state read by the API -------------------------------------------
    @property
    def active(self) -> int:
        """Tasks whose handler is running (reports in flight not counted)."""
        return self._running

    @property
    def stopping(self) -> bool:
        return self._stopping

    def readiness_reason(self) -> str | None:
        if self._stopping:
            return "shutting down"
        if not self.lease_attempted:
            return "no lease attempt has completed yet"
        if self.lease_error is not None:
            return f"taskqueue: {self.lease_error}"
        return None

    # -- scheduling --------------------------------------------------------
    def start(self) -> None:
        """First lease after one poll interval, like the reference's ticker."""
        self._schedule(self._settings.poll_interval)

    def _schedule(self, delay: float) -> None:
        if self._stopping:
            return
        if self._timer is not None and self._timer.active():
            if self._timer.getTime() <= self._clock.seconds() + delay:
                return
            self._timer.cancel()
        self._timer = self._clock.callLater(max(0.0, delay), self._fire)

    def _fire(self) -> None:
        self._timer = None
        if self._lease_d is not None or self._stopping:
            return
        d = Deferred.fromCoroutine(self._lease_cycle())
        if d.called:
            d.addErrback(self._loop_crashed)
            return
        self._lease_d = d
        d.addErrback(self._loop_crashed)
        d.addBoth(self._lease_finished)

    def _lease_finished(self, _: Any) -> None:
        self._lease_d = None

    def _loop_crashed(self, failure) -> None:
        log.failure("WORKER_LOOP_FAILED", failure, level=LogLevel.error)
        self._schedule(self._settings.poll_interval)

    def _batch_threshold(self) -> int:
        s = self._settings
        return max(1, min(s.lease_limit, s.max_workers) // 2)

    def _free(self) -> int:
        # A finished task's report overlaps the next lease and run; at most
        # MAX_WORKERS reports wait like that, so a queue slow to record them
        # slows the worker down instead of piling tasks up.
        cap = self._settings.max_workers
        return min(cap - self._running, 2 * cap - len(self._runs))

    def _wake_for_capacity(self) -> None:
        """A slot freed: lease now if the queue had more and a batch fits."""
        if (
            (self._more_waiting or self._queue_holds)
            and not self._stopping
            and self._lease_d is None
            and self._hibernate_until is None
            and self._free() >= self._batch_threshold()
        ):
            self._schedule(0)

    # -- one lease ---------------------------------------------------------
    async def _lease_cycle(self) -> None:
        now = self._clock.seconds()
        if self._hibernate_until is not None:
            if now < self._hibernate_until:
                # Wake every poll interval to feed the watchdog: hibernating
                # is a healthy loop, not a wedged one.
                self._loop_alive()
                self._schedule(min(self._hibernate_until - now, self._settings.poll_interval))
                return
            self._hibernate_until = None
            self._idle_since = None
            log.info("WORKER_HIBERNATION_ENDED")
        free = self._free()
        if free <= 0:
            # Not "empty": idle tracking is unchanged; a freed slot wakes us.
            self._loop_alive()
            self._schedule(self._settings.poll_interval)
            return
        limit = min(self._settings.lease_limit, free)
        gate = self._delegation
        paused = gate is not None and gate.paused
        classes = self._plan.task_classes
        if gate is not None and paused:
            # Phorge's web server is not taking calls: ask only for what runs
            # here (docs/worker.md, When Phorge's web server is down).
            classes = self._plan.classes_except(gate.delegated)
            if not classes:
                self._first_lease()  # READY is not Phorge's to hold back
                self._loop_alive()
                self._schedule(self._settings.poll_interval)
                return
        # The first call, and the first after a failure, answer at once:
        # readiness (and systemd's READY) must not wait for a held call.
        # Nor while paused: the call after the resume must not wait behind
        # a held one.
        wait = (
            self._settings.lease_wait
            if self.lease_attempted and self.lease_error is None and not paused
            else 0.0
        )
        asked = self._clock.seconds()
        self._lease_may_hold = wait > 0
        keepalive = None
        if wait > 0:
            # A held call is the loop waiting for work, as hibernating is:
            # keep feeding the watchdog (the call is bounded by its timeout).
            keepalive = LoopingCall(self._loop_alive)
            keepalive.clock = self._clock
            keepalive.start(self._settings.poll_interval, now=False)
        try:
            if wait > 0:
                tasks = await self._queue.lease(limit, classes, wait=wait)
            else:
                tasks = await self._queue.lease(limit, classes)
        except QueueError as exc:
            if self._lease_aborted:
                return  # stop() hung up on a held call; not a queue failure
            self._lease_failed(str(exc), task_ids=exc.task_ids)
            self._schedule(self._settings.poll_interval)
            return
        except Exception as exc:
            if self._lease_aborted:
                return
            self._lease_failed(f"lease: {type(exc).__name__}: {exc}")
            self._schedule(self._settings.poll_interval)
            return
        finally:
            if keepalive is not None:
                keepalive.stop()
        self._lease_succeeded(len(tasks))
        if self._stopping:
            for task in tasks:
                self._start(task, hand_back=True)
            return
        for task in tasks:
            self._start(task)
        self._more_waiting = len(tasks) >= limit
        if wait > 0 and not tasks:
            # An empty answer long before the wait ended: a queue that does
            # not hold calls, or one shutting down.
            self._queue_holds = self._clock.seconds() - asked >= wait / 2
        if self._track_idle(len(tasks)):
            return
        # After a held call, the next one goes out at once: the queue does the
        # waiting. A call that did not ask to wait keeps the poll cadence.
        held = wait > 0 and self._queue_holds
        if (self._more_waiting or held) and self._free() >= self._batch_threshold():
            self._schedule(0)
        elif not held or self._free() <= 0:
            self._schedule(self._settings.poll_interval)

    def _lease_failed(self, error: str, *, task_ids: list | None = None) -> None:
        now = self._clock.seconds()
        self._metrics.lease_requests.labels(result="error").inc()
        self.lease_attempted = True
        self._more_waiting = False
        if self.lease_error is None:
            log.warn("LEASE_FAILED error={error}", error=error, task_ids=task_ids)
            self._failing_since_count = 1
            self._failing_summary_at = now
        else:
            self._failing_since_count += 1
            if error != self.lease_error:
                # A different failure is a new state; it also names the rows
                # of a rejected answer, which stay leased to us.
                log.warn(
                    "LEASE_ERROR_CHANGED failures={failures} error={error}",
                    failures=self._failing_since_count,
                    error=error,
                    task_ids=task_ids,
                )
            elif now - self._failing_summary_at >= FAILING_SUMMARY_INTERVAL:
                log.warn(
                    "LEASE_STILL_FAILING failures={failures} error={error}",
                    failures=self._failing_since_count,
                    error=error,
                )
                self._failing_summary_at = now
        self.lease_error = error
        self._first_lease()
        self._loop_alive()

    def _lease_succeeded(self, count: int) -> None:
        self._metrics.lease_requests.labels(result="tasks" if count else "empty").inc()
        if self.lease_error is not None:
            log.info("LEASE_RECOVERED failures={failures}", failures=self._failing_since_count)
        self.lease_error = None
        self.lease_attempted = True
        self._first_lease()
        self._loop_alive()

    def _loop_alive(self) -> None:
        """The loop turned: feed the watchdog.

        Also after a failed lease call: a queue outage is reported by
        ``/readyz``, and a watchdog restart would abandon the tasks still
        running here. Only a loop that stops turning stops the pings.
        """
        if self._on_progress is not None:
            self._on_progress()

    def _first_lease(self) -> None:
        if not self.first_lease_done.called:
            self.first_lease_done.callback(None)

    def _track_idle(self, count: int) -> bool:
        """Update idle state; True when hibernation took over scheduling."""
        now = self._clock.seconds()
        if count:
            self._idle_since = None
            if self.idle:
                self.idle = False
                self._metrics.idle.set(0)
                log.info("WORKER_ACTIVE")
            return False
        if self._runs:
            return False
        if self._idle_since is None:
            self._idle_since = now
            return False
        timeout = self._settings.idle_timeout
        if timeout <= 0 or now - self._idle_since <= timeout:
            return False
        if not self.idle:
            self.idle = True
            self._metrics.idle.set(1)
            log.info("WORKER_IDLE idle_seconds={idle_seconds}", idle_seconds=timeout)
        if self._settings.hibernate > 0:
            self._hibernate_until = now + self._settings.hibernate
            log.info("WORKER_HIBERNATING seconds={seconds}", seconds=self._settings.hibernate)
            # Turn every poll interval anyway (no lease call) so the watchdog
            # keeps hearing from a hibernating loop.
            self._schedule(min(self._settings.hibernate, self._settings.poll_interval))
            return True
        return False

    # -- one task ----------------------------------------------------------
    def _start(self, task: dict, *, hand_back: bool = False) -> None:
        task_id = task["id"]
        if task_id in self._runs:
            log.warn(
                "TASK_DUPLICATE_LEASE task_id={task_id} task_class={task_class}",
                task_id=task_id,
                task_class=task["taskClass"],
            )
            return
        run = _Run(task)
        run.counted = not hand_back
        if hand_back:
            run.intended = "yield"
        self._runs[task_id] = run
        self._running += 1
        d = Deferred.fromCoroutine(self._process(run, hand_back))
        self._inflight.track(d)
        d.addErrback(
            lambda f: log.failure(
                "TASK_PROCESSING_FAILED task_id={task_id}", f, level=LogLevel.error, task_id=task_id
            )
        )
        d.addBoth(lambda _: self._finished(run))

    def _finished(self, run: _Run) -> None:
        self._runs.pop(run.id, None)
        if not self._release_slot(run):
            self._wake_for_capacity()

    def _release_slot(self, run: _Run) -> bool:
        """The run's handler is over: its slot may take the next task."""
        if not run.slot:
            return False
        run.slot = False
        self._running -= 1
        self._wake_for_capacity()
        return True

    async def _process(self, run: _Run, hand_back: bool) -> None:
        """One leased task, from its lease to its report: hand it back at
        shutdown, skip a class this worker does not run, or run it."""
        self._take_deadline(run)
        if hand_back:
            await self._hand_back(run)
        elif not self._plan.runnable(run.task_class):
            await self._skip(run)
        elif self._held_back(run.task_class):
            # Leased before the pause, or through the fallback's "every class".
            paused = Outcome(
                "yield", "delegation paused", yield_seconds=HANDBACK_YIELD, reached=False
            )
            await self._hand_back_unrun(run, paused)
        else:
            await self._execute(run)

    def _take_deadline(self, run: _Run) -> None:
        expires = run.task.get("leaseExpires")
        if isinstance(expires, int) and not isinstance(expires, bool):
            run.deadline = float(expires)
            return
        run.deadline = self._clock.seconds() + DEFAULT_LEASE_SECONDS
        log.warn(
            "TASK_WITHOUT_LEASE_EXPIRY task_id={task_id} task_class={task_class}",
            task_id=run.id,
            task_class=run.task_class,
        )

    async def _hand_back(self, run: _Run) -> None:
        handback = Outcome("yield", "worker shutting down", yield_seconds=HANDBACK_YIELD)
        await self._report(run, handback, counted=False)

    def _held_back(self, task_class: str) -> bool:
        gate = self._delegation
        return gate is not None and gate.paused and gate.delegated(task_class)

    async def _hand_back_unrun(self, run: _Run, outcome: Outcome) -> None:
        """A task that did not run, through no fault of its own: its lease
        goes back as a yield, with no failure and no counter moved."""
        run.counted = False
        run.intended = "yield"
        if await self._report(run, outcome, counted=False):
            self._metrics.tasks.labels(task_class=run.task_class, outcome="handed_back").inc()

    async def _skip(self, run: _Run) -> None:
        run.counted = False
        run.intended = "temporary"
        log.info(
            "TASK_SKIPPED task_id={task_id} task_class={task_class}",
            task_id=run.id,
            task_class=run.task_class,
        )
        skipped = Outcome(
            "temporary", "task class not runnable by this worker", retry_wait=SKIP_RETRY_WAIT
        )
        if await self._report(run, skipped, counted=False):
            self._metrics.tasks.labels(task_class=run.task_class, outcome="skipped").inc()

    async def _execute(self, run: _Run) -> None:
        """Run the handler within the lease, then report what it came to."""
        started = self._clock.seconds()
        if run.deadline <= started:
            self._unreported(run, "lease expired before the task started", "none")
            return
        ended = await self._run_handler(run)
        if ended is _NOT_OURS:
            return
        elapsed = self._clock.seconds() - started
        self._metrics.handler_seconds.labels(task_class=run.task_class).observe(elapsed)
        outcome = classify(ended)
        if outcome.kind == "complete" and run.followups:
            outcome = replace(outcome, followups=run.followups)
        self._log_outcome(run, outcome)
        self._release_slot(run)
        if not outcome.reached:
            if self._delegation is not None:
                self._delegation.not_reached(outcome.message)
            await self._hand_back_unrun(run, outcome)
            return
        await self._report(run, outcome, counted=True, duration_us=int(elapsed * 1_000_000))

    async def _run_handler(self, run: _Run) -> BaseException | None | _NotOurs:
        """The handler's error (None for success), or ``_NOT_OURS`` when its
        outcome must not be reported: shutdown abandoned the run, the lease
        went to another holder, or the handler outlived the lease."""
        handler = self._registry.get(run.task_class)
        assert handler is not None  # the plan's runnable() asked this registry
        data = run.task.get("data")
        payload = data if isinstance(data, str) and data != "" else None
        handler_d = _call_handler(handler, run.task, payload)
        guard = LeaseGuard(handler_d, run.deadline, self._clock)
        keeper = self._keep_lease(run, guard)
        run.current = handler_d
        error: BaseException | None = None
        try:
            result = await handler_d
            if isinstance(result, Completed):
                run.followups = result.followups
        except LeaseLost:
            pass  # logged by the keeper; guard.lost says the rest
        except TimeoutError as exc:
            if not guard.expired:
                error = exc  # the handler's own timeout, not our deadline
            else:
                log.error(
                    "TASK_ABANDONED task_id={task_id} task_class={task_class} reason={reason}",
                    task_id=run.id,
                    task_class=run.task_class,
                    reason="handler outlived its lease",
                )
                self._unreported(run, "handler outlived its lease", "none", logged=True)
                return _NOT_OURS
        except Exception as exc:
            error = exc
        finally:
            run.current = None
            if keeper is not None:
                keeper.stop()
            run.deadline = guard.deadline
        if run.abandoned:
            return _NOT_OURS
        if guard.lost:
            # Another holder has the task: whatever the handler got to, its
            # outcome is not ours to report.
            self._unreported(
                run,
                "lease lost: another holder has the task",
                "none",
                logged=True,
                metric="lease_lost",
            )
            return _NOT_OURS
        return error

    def _log_outcome(self, run: _Run, outcome: Outcome) -> None:
        if outcome.kind == "complete":
            if self._settings.log_debug:
                log.debug(
                    "TASK_SUCCEEDED task_id={task_id} task_class={task_class}",
                    task_id=run.id,
                    task_class=run.task_class,
                )
            return
        log.info(
            "TASK_OUTCOME task_id={task_id} task_class={task_class} "
            "outcome={outcome} message={message}",
            task_id=run.id,
            task_class=run.task_class,
            outcome=outcome.kind,
            message=outcome.message,
        )

    def _keep_lease(self, run: _Run, guard: LeaseGuard) -> LeaseKeeper | None:
        """Renew the lease of a running task until its handler ends (none for a
        handler already over: its guard is not running)."""
        if not self._renewals or not guard.running:
            return None

        async def renew(task_id: int, timeout: float) -> int | None:
            answers = await self._queue.renew([task_id], timeout=timeout)
            if task_id not in answers:
                raise QueueError(
                    f"renew: the answer does not mention task {task_id}", transient=True
                )
            expires = answers[task_id]
            if expires is not None:
                run.deadline = float(expires)
            return expires

        keeper = LeaseKeeper(
            task_id=run.id,
            task_class=run.task_class,
            guard=guard,
            renew=renew,
            clock=self._clock,
            on_result=lambda result: self._metrics.lease_renewals.labels(result=result).inc(),
            on_refused=self._renewal_refused,
        )
        keeper.start()
        return keeper

    def _renewal_refused(self, exc: QueueError) -> None:
        """A queue without renewal (404) or one refusing ours: stop asking."""
        if self._renewals:
            self._renewals = False
            log.warn("LEASE_RENEWAL_DISABLED error={error}", error=str(exc))

    def _unreported(
        self,
        run: _Run,
        reason: str,
        intended: str,
        *,
        logged: bool = False,
        error: str = "",
        metric: str = "unreported",
    ) -> None:
        self.counters.unreported += 1
        self._metrics.tasks.labels(task_class=run.task_class, outcome=metric).inc()
        if not logged:
            log.error(
                "TASK_UNREPORTED task_id={task_id} task_class={task_class} "
                "outcome={outcome} reason={reason} error={error}",
                task_id=run.id,
                task_class=run.task_class,
                outcome=intended,
                reason=reason,
                error=error,
            )

    def _send(self, run: _Run, outcome: Outcome, duration_us: int, timeout: float) -> Deferred:
        q = self._queue
        if outcome.kind == "complete" and outcome.followups:
            coro = q.complete(run.id, duration_us, followups=outcome.followups, timeout=timeout)
        elif outcome.kind == "complete":
            coro = q.complete(run.id, duration_us, timeout=timeout)
        elif outcome.kind == "yield":
            coro = q.yield_task(run.id, outcome.yield_seconds, timeout=timeout)
        else:
            coro = q.fail(
                run.id,
                outcome.kind == "permanent",
                retry_wait=outcome.retry_wait,
                message=outcome.message,
                timeout=timeout,
            )
        return Deferred.fromCoroutine(coro)

    def _confirmed(self, run: _Run, outcome: Outcome) -> None:
        self._metrics.tasks.labels(task_class=run.task_class, outcome=outcome.metric_label).inc()
        if outcome.kind == "complete":
            self.counters.processed += 1
        elif outcome.kind == "yield":
            self.counters.yielded += 1
        else:
            self.counters.failed += 1

    async def _report(
        self, run: _Run, outcome: Outcome, *, counted: bool, duration_us: int = 0
    ) -> bool:
        """Report the outcome; True once the queue recorded it."""
        try:
            await self._send_with_retries(run, outcome, duration_us)
        except _RunAbandoned:
            return False  # shutdown gave up on the run and logged it
        except _ReportGaveUp as gave_up:
            if counted:
                self._unreported(run, gave_up.reason, outcome.kind, error=gave_up.error)
            else:
                self._handback_unreported(run, outcome.kind, gave_up.reason, gave_up.error)
            return False
        if counted:
            self._confirmed(run, outcome)
        return True

    async def _send_with_retries(self, run: _Run, outcome: Outcome, duration_us: int) -> None:
        """Up to five attempts with a growing pause, never past the lease
        deadline; raises :class:`_ReportGaveUp` with the reason it stopped."""
        last_error = ""
        for attempt in range(1, REPORT_ATTEMPTS + 1):
            remaining = run.deadline - self._clock.seconds()
            if remaining <= 0:
                raise _ReportGaveUp("lease deadline reached", last_error)
            if attempt > 1:
                self._metrics.report_retries.inc()
            try:
                await self._as_current(run, self._send(run, outcome, duration_us, remaining))
            except QueueError as exc:
                self._metrics.report_attempts.labels(result="error").inc()
                last_error = str(exc)
                if not exc.retryable:
                    raise _ReportGaveUp(_refusal_reason(exc), last_error) from None
            else:
                self._metrics.report_attempts.labels(result="ok").inc()
                return
            if attempt == REPORT_ATTEMPTS:
                break
            pause = REPORT_BACKOFF * attempt
            if self._clock.seconds() + pause >= run.deadline:
                raise _ReportGaveUp("lease deadline reached", last_error)
            await self._as_current(run, deferLater(self._clock, pause))
        raise _ReportGaveUp("retries exhausted", last_error)

    async def _as_current(self, run: _Run, step: Deferred) -> None:
        """Await one step of the run where shutdown can cancel it; once
        shutdown has abandoned the run, its failure only means that."""
        run.current = step
        try:
            await step
        except (QueueError, CancelledError):
            if run.abandoned:
                raise _RunAbandoned() from None
            raise
        finally:
            run.current = None

    def _handback_unreported(self, run: _Run, outcome: str, reason: str, error: str) -> None:
        log.warn(
            "TASK_HANDBACK_UNREPORTED task_id={task_id} task_class={task_class} "
            "outcome={outcome} reason={reason} error={error}",
            task_id=run.id,
            task_class=run.task_class,
            outcome=outcome,
            reason=reason,
            error=error,
        )

    # -- shutdown ------------------------------------------------------------
    async def stop(self) -> None:
        """Stop leasing, let running tasks finish and report within the drain
        budget, then abandon what is left to its lease."""
        self._stopping = True
        self._hibernate_until = None
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        lease_d = self._lease_d
        if lease_d is not None:
            if self._lease_may_hold:
                # The queue may hold the call for the whole wait: hang up.
                # Tasks it claimed for us in that instant go back to the
                # queue (it frees what a vanished caller was given).
                self._lease_aborted = True
                lease_d.cancel()
            # Bounded by the queue client's own call timeout.
            await lease_d
        log.info(
            "WORKER_DRAINING active={active} timeout={timeout}",
            active=len(self._runs),
            timeout=self._settings.drain_timeout,
        )
        drained = await self._inflight.drain(self._settings.drain_timeout, self._clock)
        if drained:
            return
        for run in list(self._runs.values()):
            run.abandoned = True
            if run.counted:
                log.error(
                    "TASK_ABANDONED task_id={task_id} task_class={task_class} reason={reason}",
                    task_id=run.id,
                    task_class=run.task_class,
                    reason="drain budget expired at shutdown",
                )
                self._unreported(run, "drain budget expired", "none", logged=True)
            else:
                self._handback_unreported(run, run.intended, "drain budget expired at shutdown", "")
            if run.current is not None and not run.current.called:
                run.current.cancel()
        await self._inflight.drain(1.0, self._clock)
