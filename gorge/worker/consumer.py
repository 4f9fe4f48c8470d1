"""The consume loop: lease within free capacity, hand each task to the
runner in its own slot, and keep the loop's cadence (docs/worker.md, How
work flows).

The loop schedules itself on the injected clock instead of using the
platform Poller because its cadence depends on the outcome of each lease:
lease again at once while the queue has more work and slots are free, wait a
poll interval when it is empty, sleep for the hibernation window if asked to.
What each turn does is decided by :mod:`gorge.worker.leasestep`; this module
carries the decisions out, logs each change of state once, and drains at
shutdown. Running a task is :mod:`gorge.worker.runner`'s, reporting its
outcome :mod:`gorge.worker.reporter`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import LogLevel

from gorge.app.inflight import InFlight
from gorge.log.logger import Logger
from gorge.worker.leasestep import (
    LeaseFacts,
    LeaseStep,
    LoopSettings,
    LoopState,
    Turn,
    delay_after_lease,
    idle_after,
    next_step,
    queue_holds_after,
    wants_wake,
)
from gorge.worker.metrics import WorkerMetrics
from gorge.worker.queueclient import QueueClient, QueueError
from gorge.worker.registry import LeasePlan, Registry
from gorge.worker.reporter import Counters, Reporter
from gorge.worker.run import Run
from gorge.worker.runner import DelegationGate, TaskRunner

__all__ = ["Consumer", "Counters", "DelegationGate", "LoopSettings"]

log = Logger()

FAILING_SUMMARY_INTERVAL = 60.0


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
        self._plan = plan
        self._clock = clock
        self._settings = settings
        self._metrics = metrics
        self._on_progress = on_progress
        self._delegation = delegation
        self._reporter = Reporter(queue=queue, clock=clock, metrics=metrics)
        self.counters = self._reporter.counters
        self._runner = TaskRunner(
            queue=queue,
            registry=registry,
            plan=plan,
            clock=clock,
            metrics=metrics,
            reporter=self._reporter,
            handler_ended=self._release_slot,
            delegation=delegation,
            log_debug=settings.log_debug,
            heartbeat=settings.heartbeat,
            heartbeat_lease=settings.heartbeat_lease,
        )
        self._runs: dict[int, Run] = {}
        # Tasks leased again while their old lease still runs here: each
        # starts when the old run is over.
        self._leased_again: dict[int, tuple[dict, bool, float]] = {}
        self._running = 0
        # Read when scraped: setting it twice per task cost more than the task.
        metrics.active.set_function(lambda: self._running)
        self._inflight = InFlight()
        self._timer: IDelayedCall | None = None
        self._lease_d: Deferred | None = None
        self._stopping = False
        self._state = LoopState(queue_holds=settings.lease_wait > 0)
        self._lease_aborted = False
        self._lease_may_hold = False
        # Lease health, for /readyz and state-change logging.
        self.lease_attempted = False
        self.lease_error: str | None = None
        self._failing_since_count = 0
        self._failing_summary_at = 0.0
        self.first_lease_done: Deferred = Deferred()

    # -- state read by the API -------------------------------------------
    @property
    def active(self) -> int:
        """Tasks whose handler is running (reports in flight not counted)."""
        return self._running

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def idle(self) -> bool:
        return self._state.idle

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

    def _free(self) -> int:
        # A finished task's report overlaps the next lease and run; at most
        # MAX_WORKERS reports wait like that, so a queue slow to record them
        # slows the worker down instead of piling tasks up.
        cap = self._settings.max_workers
        return min(cap - self._running, 2 * cap - len(self._runs))

    def _wake_for_capacity(self) -> None:
        """A slot freed: lease now if the queue had more and a batch fits."""
        if (
            not self._stopping
            and self._lease_d is None
            and wants_wake(self._state, free=self._free(), settings=self._settings)
        ):
            self._schedule(0)

    # -- one turn ----------------------------------------------------------
    def _facts(self) -> LeaseFacts:
        gate = self._delegation
        paused = gate is not None and gate.paused
        # Phorge's web server is not taking calls: ask only for what runs
        # here (docs/worker.md, When Phorge's web server is down).
        classes = (
            self._plan.classes_except(gate.delegated)
            if gate is not None and paused
            else self._plan.task_classes
        )
        return LeaseFacts(
            now=self._clock.seconds(),
            free=self._free(),
            hibernate_until=self._state.hibernate_until,
            paused=paused,
            classes=classes,
            attempted=self.lease_attempted,
            failing=self.lease_error is not None,
        )

    async def _lease_cycle(self) -> None:
        step = next_step(self._facts(), self._settings)
        if step.woke:
            self._state.hibernate_until = None
            self._state.idle_since = None
            log.info("WORKER_HIBERNATION_ENDED")
        if step.turn is not Turn.LEASE:
            if step.turn is Turn.ALL_DELEGATED:
                self._first_lease()  # READY is not Phorge's to hold back
            # Hibernating and waiting for a slot are a healthy loop, not a
            # wedged one: feed the watchdog.
            self._loop_alive()
            self._schedule(step.delay)
            return
        asked = self._clock.seconds()
        tasks = await self._lease(step)
        if tasks is None:
            return
        self._lease_succeeded(len(tasks))
        if self._stopping:
            for task in tasks:
                self._start(task, hand_back=True)
            return
        for task in tasks:
            self._start(task)
        state = self._state
        state.more_waiting = len(tasks) >= step.limit
        state.queue_holds = queue_holds_after(
            step, len(tasks), self._clock.seconds() - asked, state.queue_holds
        )
        if self._track_idle(len(tasks)):
            return
        delay = delay_after_lease(
            more_waiting=state.more_waiting,
            held=step.wait > 0 and state.queue_holds,
            free=self._free(),
            settings=self._settings,
        )
        if delay is not None:
            self._schedule(delay)

    async def _lease(self, step: LeaseStep) -> list[dict] | None:
        """The lease call the step asks for; None when it failed (logged,
        and the next turn scheduled) or stop() hung up on it."""
        wait = step.wait
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
                return await self._queue.lease(step.limit, step.classes, wait=wait)
            return await self._queue.lease(step.limit, step.classes)
        except QueueError as exc:
            if not self._lease_aborted:
                self._lease_failed(str(exc), task_ids=exc.task_ids)
                self._schedule(self._settings.poll_interval)
            return None  # or stop() hung up on a held call: not a queue failure
        except Exception as exc:
            if not self._lease_aborted:
                self._lease_failed(f"lease: {type(exc).__name__}: {exc}")
                self._schedule(self._settings.poll_interval)
            return None
        finally:
            if keepalive is not None:
                keepalive.stop()

    def _lease_failed(self, error: str, *, task_ids: list | None = None) -> None:
        now = self._clock.seconds()
        self._metrics.lease_requests.labels(result="error").inc()
        self.lease_attempted = True
        self._state.more_waiting = False
        if self.lease_error is None:
            log.warn("WORKER_LEASE_FAILED error={error}", error=error, task_ids=task_ids)
            self._failing_since_count = 1
            self._failing_summary_at = now
        else:
            self._failing_since_count += 1
            if error != self.lease_error:
                # A different failure is a new state; it also names the rows
                # of a rejected answer, which stay leased to us.
                log.warn(
                    "WORKER_LEASE_ERROR_CHANGED failures={failures} error={error}",
                    failures=self._failing_since_count,
                    error=error,
                    task_ids=task_ids,
                )
            elif now - self._failing_summary_at >= FAILING_SUMMARY_INTERVAL:
                log.warn(
                    "WORKER_LEASE_STILL_FAILING failures={failures} error={error}",
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
            log.info(
                "WORKER_LEASE_RECOVERED failures={failures}", failures=self._failing_since_count
            )
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
        state, settings = self._state, self._settings
        was_idle = state.idle
        now = self._clock.seconds()
        after = idle_after(count, bool(self._runs), was_idle, state.idle_since, now, settings)
        state.idle, state.idle_since = after.idle, after.since
        if was_idle and not after.idle:
            self._metrics.idle.set(0)
            log.info("WORKER_ACTIVE")
        elif after.idle and not was_idle:
            self._metrics.idle.set(1)
            log.info("WORKER_IDLE idle_seconds={idle_seconds}", idle_seconds=settings.idle_timeout)
        if after.hibernate_until is None:
            return False
        state.hibernate_until = after.hibernate_until
        log.info("WORKER_HIBERNATING seconds={seconds}", seconds=settings.hibernate)
        # Turn every poll interval anyway (no lease call) so the watchdog
        # keeps hearing from a hibernating loop.
        self._schedule(min(settings.hibernate, settings.poll_interval))
        return True

    # -- one task's slot ---------------------------------------------------
    def _start(self, task: dict, *, hand_back: bool = False) -> None:
        task_id = task["id"]
        old = self._runs.get(task_id)
        if old is not None and old.owner is not None and task.get("leaseOwner") != old.owner:
            # A new lease of a task still running here: the old lease was
            # freed (or expired) at the queue, so it is not ours any more.
            # Its handler stops now, without a report; the new lease runs
            # once it is out of the way (docs/worker.md, Heartbeat leases).
            log.info(
                "WORKER_TASK_LEASED_AGAIN task_id={task_id} task_class={task_class}",
                task_id=task_id,
                task_class=task["taskClass"],
            )
            self._leased_again[task_id] = (task, hand_back, self._clock.seconds())
            old.lose()
            return
        if task_id in self._runs:
            log.warn(
                "WORKER_TASK_DUPLICATE_LEASE task_id={task_id} task_class={task_class}",
                task_id=task_id,
                task_class=task["taskClass"],
            )
            return
        run = Run(task)
        run.counted = not hand_back
        if hand_back:
            run.intended = "yield"
        self._runs[task_id] = run
        self._running += 1
        d = Deferred.fromCoroutine(self._runner.process(run, hand_back))
        self._inflight.track(d)
        d.addErrback(
            lambda f: log.failure(
                "WORKER_TASK_PROCESSING_FAILED task_id={task_id}",
                f,
                level=LogLevel.error,
                task_id=task_id,
            )
        )
        d.addBoth(lambda _: self._finished(run))

    def _finished(self, run: Run) -> None:
        self._runs.pop(run.id, None)
        waiting = self._leased_again.pop(run.id, None)
        if waiting is not None:
            task, hand_back, received = waiting
            seconds = task.get("leaseSeconds")
            if isinstance(seconds, int) and not isinstance(seconds, bool):
                # Its lease has been running since the answer came.
                elapsed = self._clock.seconds() - received
                task = {**task, "leaseSeconds": max(0, int(seconds - elapsed))}
            self._start(task, hand_back=hand_back or self._stopping)
        if not self._release_slot(run):
            self._wake_for_capacity()

    def _release_slot(self, run: Run) -> bool:
        """The run's handler is over: its slot may take the next task."""
        if not run.slot:
            return False
        run.slot = False
        self._running -= 1
        self._wake_for_capacity()
        return True

    # -- shutdown ------------------------------------------------------------
    async def stop(self) -> None:
        """Stop leasing, let running tasks finish and report within the drain
        budget, then abandon what is left to its lease."""
        self._stopping = True
        self._state.hibernate_until = None
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
                    "WORKER_TASK_ABANDONED "
                    "task_id={task_id} task_class={task_class} reason={reason}",
                    task_id=run.id,
                    task_class=run.task_class,
                    reason="drain budget expired at shutdown",
                )
                self._reporter.unreported(run, "drain budget expired", "none", logged=True)
            else:
                self._reporter.handback_unreported(
                    run, run.intended, "drain budget expired at shutdown", ""
                )
            if run.current is not None and not run.current.called:
                run.current.cancel()
        await self._inflight.drain(1.0, self._clock)
