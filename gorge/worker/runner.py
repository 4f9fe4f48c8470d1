"""Run one leased task under its lease: hand it back at shutdown, skip a
class this worker does not run, hand back a delegated class while Phorge's
web server is away, or run its handler before the lease deadline (renewing
the lease while it runs) and hand the outcome to the reporter
(docs/worker.md, Long tasks).
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from twisted.internet.defer import Deferred, TimeoutError, fail, succeed
from twisted.internet.interfaces import IReactorTime

from gorge.log.logger import Logger
from gorge.worker.lease import Heartbeat, HeldLease, LeaseGuard, LeaseLost
from gorge.worker.metrics import WorkerMetrics
from gorge.worker.outcome import Completed, Outcome, classify
from gorge.worker.queueclient import QueueClient, QueueError
from gorge.worker.registry import LeasePlan, Registry
from gorge.worker.reporter import Reporter
from gorge.worker.run import Run

log = Logger()

SKIP_RETRY_WAIT = 60
HANDBACK_YIELD = 5
DEFAULT_LEASE_SECONDS = 7200
#: docs/worker.md, Heartbeat leases: a dead worker's tasks are leasable again
#: within the lease (60 s) after its last heartbeat (every 15 s).
DEFAULT_HEARTBEAT_SEC = 15.0
DEFAULT_HEARTBEAT_LEASE_SEC = 60


class DelegationGate(Protocol):
    """Whether delegated classes wait (conduit.DelegationPause)."""

    @property
    def paused(self) -> bool: ...

    def delegated(self, task_class: str) -> bool: ...

    def not_reached(self, reason: str) -> None: ...


def held_back(gate: DelegationGate | None, task_class: str) -> bool:
    """Whether ``task_class`` waits for Phorge's web server."""
    return gate is not None and gate.paused and gate.delegated(task_class)


class _NotOurs(enum.Enum):
    """A handler's end whose outcome this worker must not report."""

    NOT_OURS = "not ours"


_NOT_OURS = _NotOurs.NOT_OURS


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


class TaskRunner:
    def __init__(
        self,
        *,
        queue: QueueClient,
        registry: Registry,
        plan: LeasePlan,
        clock: IReactorTime,
        metrics: WorkerMetrics,
        reporter: Reporter,
        handler_ended: Callable[[Run], object],
        delegation: DelegationGate | None = None,
        log_debug: bool = True,
        heartbeat: float = DEFAULT_HEARTBEAT_SEC,
        heartbeat_lease: int = DEFAULT_HEARTBEAT_LEASE_SEC,
    ) -> None:
        self._queue = queue
        self._registry = registry
        self._plan = plan
        self._clock = clock
        self._metrics = metrics
        self._reporter = reporter
        # Frees the run's slot before its report goes out.
        self._handler_ended = handler_ended
        self._delegation = delegation
        self._log_debug = log_debug
        # One renewal call for every running task's lease; off once the
        # queue refuses one (an older queue has no route).
        self.heartbeat = Heartbeat(
            renew=self._renew,
            clock=clock,
            period=heartbeat,
            duration=heartbeat_lease,
            on_result=lambda result: metrics.lease_renewals.labels(result=result).inc(),
            on_refused=self._renewal_refused,
        )

    async def _renew(
        self, leases: list[tuple[int, str]], duration: int, timeout: float
    ) -> dict[int, int | None]:
        return await self._queue.renew(leases, duration, timeout=timeout)

    async def process(self, run: Run, hand_back: bool) -> None:
        """One leased task, from its lease to its report."""
        self._take_deadline(run)
        if hand_back:
            await self._hand_back(run)
        elif not self._plan.runnable(run.task_class):
            await self._skip(run)
        elif held_back(self._delegation, run.task_class):
            # Leased before the pause, or through the fallback's "every class".
            paused = Outcome(
                "yield", "delegation paused", yield_seconds=HANDBACK_YIELD, reached=False
            )
            await self._hand_back_unrun(run, paused)
        else:
            await self._execute(run)

    def _take_deadline(self, run: Run) -> None:
        # The lease as a duration from the queue's now, counted here from the
        # answer's arrival on this host's clock: no other host's clock is
        # compared with ours (docs/worker.md, Clocks).
        seconds = run.task.get("leaseSeconds")
        if isinstance(seconds, int) and not isinstance(seconds, bool):
            run.deadline = self._clock.seconds() + seconds
            return
        # A queue that says no duration (an older gorge-taskqueue, asked for
        # none): its default lease. Its absolute leaseExpires is the queue's
        # clock, and a worker minutes ahead of it would refuse every task.
        run.deadline = self._clock.seconds() + DEFAULT_LEASE_SECONDS
        if "leaseExpires" not in run.task:
            log.warn(
                "WORKER_TASK_WITHOUT_LEASE_EXPIRY task_id={task_id} task_class={task_class}",
                task_id=run.id,
                task_class=run.task_class,
            )

    async def _hand_back(self, run: Run) -> None:
        handback = Outcome("yield", "worker shutting down", yield_seconds=HANDBACK_YIELD)
        await self._reporter.report(run, handback, counted=False)

    async def _hand_back_unrun(self, run: Run, outcome: Outcome) -> None:
        """A task that did not run, through no fault of its own: its lease
        goes back as a yield, with no failure and no counter moved."""
        run.counted = False
        run.intended = "yield"
        if await self._reporter.report(run, outcome, counted=False):
            self._metrics.tasks.labels(task_class=run.task_class, outcome="handed_back").inc()

    async def _skip(self, run: Run) -> None:
        run.counted = False
        run.intended = "temporary"
        log.info(
            "WORKER_TASK_SKIPPED task_id={task_id} task_class={task_class}",
            task_id=run.id,
            task_class=run.task_class,
        )
        skipped = Outcome(
            "temporary", "task class not runnable by this worker", retry_wait=SKIP_RETRY_WAIT
        )
        if await self._reporter.report(run, skipped, counted=False):
            self._metrics.tasks.labels(task_class=run.task_class, outcome="skipped").inc()

    async def _execute(self, run: Run) -> None:
        """Run the handler within the lease, then report what it came to."""
        started = self._clock.seconds()
        if run.deadline <= started:
            self._reporter.unreported(run, "lease expired before the task started", "none")
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
        self._handler_ended(run)
        if not outcome.reached:
            if self._delegation is not None:
                self._delegation.not_reached(outcome.message)
            await self._hand_back_unrun(run, outcome)
            return
        await self._reporter.report(
            run, outcome, counted=True, duration_us=int(elapsed * 1_000_000)
        )

    async def _run_handler(self, run: Run) -> BaseException | None | _NotOurs:
        """The handler's error (None for success), or ``_NOT_OURS`` when its
        outcome must not be reported: shutdown abandoned the run, the lease
        went to another holder, or the handler outlived the lease."""
        handler = self._registry.get(run.task_class)
        assert handler is not None  # the plan's runnable() asked this registry
        data = run.task.get("data")
        payload = data if isinstance(data, str) and data != "" else None
        handler_d = _call_handler(handler, run.task, payload)
        guard = LeaseGuard(handler_d, run.deadline, self._clock)
        held = HeldLease(
            run.id,
            run.task_class,
            run.owner or self._queue.owner,
            guard,
            granted=max(0.0, run.deadline - self._clock.seconds()),
        )
        self.heartbeat.hold(held)
        run.current = handler_d
        run.guard = guard
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
                    "WORKER_TASK_ABANDONED "
                    "task_id={task_id} task_class={task_class} reason={reason}",
                    task_id=run.id,
                    task_class=run.task_class,
                    reason="handler outlived its lease",
                )
                self._reporter.unreported(run, "handler outlived its lease", "none", logged=True)
                return _NOT_OURS
        except Exception as exc:
            error = exc
        finally:
            run.current = None
            run.guard = None
            self.heartbeat.release(held)
            run.deadline = guard.deadline
        if run.abandoned:
            return _NOT_OURS
        if guard.lost:
            # Another holder has the task: whatever the handler got to, its
            # outcome is not ours to report.
            self._reporter.unreported(
                run,
                "lease lost: another holder has the task",
                "none",
                logged=True,
                metric="lease_lost",
            )
            return _NOT_OURS
        return error

    def _log_outcome(self, run: Run, outcome: Outcome) -> None:
        if outcome.kind == "complete":
            if self._log_debug:
                log.debug(
                    "WORKER_TASK_SUCCEEDED task_id={task_id} task_class={task_class}",
                    task_id=run.id,
                    task_class=run.task_class,
                )
            return
        log.info(
            "WORKER_TASK_OUTCOME task_id={task_id} task_class={task_class} "
            "outcome={outcome} message={message}",
            task_id=run.id,
            task_class=run.task_class,
            outcome=outcome.kind,
            message=outcome.message,
        )

    def _renewal_refused(self, exc: QueueError) -> None:
        """A queue without renewal (404) or one refusing ours: stop asking."""
        log.warn("WORKER_LEASE_RENEWAL_DISABLED error={error}", error=str(exc))
