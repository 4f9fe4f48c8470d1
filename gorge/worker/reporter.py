"""Report a task's outcome to the queue with bounded retries: up to five
attempts with a growing pause, never past the task's lease deadline
(docs/worker.md, Long tasks). What could not be reported is counted and
logged here too, so every end of a run is accounted for in one place.

(Batching reports that finish close together into one call is the queue
client's business: :mod:`gorge.worker.reports`.)
"""

from __future__ import annotations

from dataclasses import dataclass

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

from gorge.log.logger import Logger
from gorge.worker.metrics import WorkerMetrics
from gorge.worker.outcome import Outcome
from gorge.worker.queueclient import QueueClient, QueueError
from gorge.worker.run import Run

log = Logger()

REPORT_ATTEMPTS = 5
REPORT_BACKOFF = 0.2
LEASE_CONFLICT = "ERR_LEASE_CONFLICT"


@dataclass
class Counters:
    processed: int = 0
    failed: int = 0
    yielded: int = 0
    unreported: int = 0


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


class Reporter:
    def __init__(self, *, queue: QueueClient, clock: IReactorTime, metrics: WorkerMetrics) -> None:
        self._queue = queue
        self._clock = clock
        self._metrics = metrics
        self.counters = Counters()

    async def report(
        self, run: Run, outcome: Outcome, *, counted: bool, duration_us: int = 0
    ) -> bool:
        """Report the outcome; True once the queue recorded it. ``counted``
        moves the counters (a hand-back or a skip moves none)."""
        try:
            await self._send_with_retries(run, outcome, duration_us)
        except _RunAbandoned:
            return False  # shutdown gave up on the run and logged it
        except _ReportGaveUp as gave_up:
            if counted:
                self.unreported(run, gave_up.reason, outcome.kind, error=gave_up.error)
            else:
                self.handback_unreported(run, outcome.kind, gave_up.reason, gave_up.error)
            return False
        if counted:
            self._confirmed(run, outcome)
        return True

    def unreported(
        self,
        run: Run,
        reason: str,
        intended: str,
        *,
        logged: bool = False,
        error: str = "",
        metric: str = "unreported",
    ) -> None:
        """A counted run whose outcome the queue will not hear of."""
        self.counters.unreported += 1
        self._metrics.tasks.labels(task_class=run.task_class, outcome=metric).inc()
        if not logged:
            log.error(
                "WORKER_TASK_UNREPORTED task_id={task_id} task_class={task_class} "
                "outcome={outcome} reason={reason} error={error}",
                task_id=run.id,
                task_class=run.task_class,
                outcome=intended,
                reason=reason,
                error=error,
            )

    def handback_unreported(self, run: Run, outcome: str, reason: str, error: str) -> None:
        """An uncounted run (hand-back, skip) whose report did not get through:
        its lease runs out at the queue instead."""
        log.warn(
            "WORKER_TASK_HANDBACK_UNREPORTED task_id={task_id} task_class={task_class} "
            "outcome={outcome} reason={reason} error={error}",
            task_id=run.id,
            task_class=run.task_class,
            outcome=outcome,
            reason=reason,
            error=error,
        )

    def _send(self, run: Run, outcome: Outcome, duration_us: int, timeout: float) -> Deferred:
        q = self._queue
        owner = run.owner
        if outcome.kind == "complete" and outcome.followups:
            coro = q.complete(
                run.id, duration_us, followups=outcome.followups, timeout=timeout, owner=owner
            )
        elif outcome.kind == "complete":
            coro = q.complete(run.id, duration_us, timeout=timeout, owner=owner)
        elif outcome.kind == "yield":
            coro = q.yield_task(run.id, outcome.yield_seconds, timeout=timeout, owner=owner)
        else:
            coro = q.fail(
                run.id,
                outcome.kind == "permanent",
                retry_wait=outcome.retry_wait,
                message=outcome.message,
                timeout=timeout,
                owner=owner,
            )
        return Deferred.fromCoroutine(coro)

    def _confirmed(self, run: Run, outcome: Outcome) -> None:
        self._metrics.tasks.labels(task_class=run.task_class, outcome=outcome.metric_label).inc()
        if outcome.kind == "complete":
            self.counters.processed += 1
        elif outcome.kind == "yield":
            self.counters.yielded += 1
        else:
            self.counters.failed += 1

    async def _send_with_retries(self, run: Run, outcome: Outcome, duration_us: int) -> None:
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

    async def _as_current(self, run: Run, step: Deferred) -> None:
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
