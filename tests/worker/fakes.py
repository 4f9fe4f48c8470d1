"""In-process stand-ins for what lies outside the worker: the queue's HTTP API
seen through the client interface, and an event capture for log assertions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from twisted.internet.defer import Deferred
from twisted.logger import globalLogPublisher

from gorge.worker.consumer import Consumer, LoopSettings
from gorge.worker.metrics import WorkerMetrics
from gorge.worker.queueclient import QueueError
from gorge.worker.registry import LeasePlan, Registry


def make_task(
    task_id: int,
    task_class: str = "NoopWorker",
    *,
    expires: int | None = 7200,
    data: str | None = "{}",
    failure_count: int = 0,
    lease_seconds: int | None = None,
) -> dict:
    task = {
        "id": task_id,
        "taskClass": task_class,
        "failureCount": failure_count,
        "dataID": task_id,
        "priority": 2000,
    }
    if expires is not None:
        task["leaseExpires"] = expires
    if lease_seconds is not None:
        # The lease as a duration: what the worker counts its deadline from.
        task["leaseSeconds"] = lease_seconds
    if data is not None:
        task["data"] = data
    return task


@dataclass
class Report:
    kind: str
    task_id: int
    args: dict = field(default_factory=dict)


class FakeQueue:
    """Records every call; tasks are handed out from ``waiting`` in order.

    ``lease_errors`` / ``report_errors`` are consumed one per call (an entry
    of ``"hang"`` answers with a Deferred that never fires unless cancelled).
    """

    owner = "test-host:1:0:gorge-worker"

    def __init__(self) -> None:
        self.waiting: list[dict] = []
        self.leases: list[tuple[int, list[str] | None]] = []
        self.reports: list[Report] = []
        self.attempts: list[Report] = []
        self.lease_errors: list[Any] = []
        self.report_errors: list[Any] = []
        self.lease_hold: Deferred | None = None
        self.report_waiters: list[tuple[int, Deferred]] = []
        # Renewals: every call, and the answers to give in order (an int is the
        # new leaseExpires, "lost", an exception, or "hang"); once they run
        # out, a renewal answers the expiry the task already has.
        self.renewals: list[tuple[list[int], float]] = []
        self.renew_answers: list[Any] = []
        # Each renewal call's (task id, lease owner) pairs and extension.
        self.renew_calls: list[tuple[list[tuple[int, str]], int]] = []
        self.expiry: dict[int, int | None] = {}
        # Long-poll: the wait of every lease call; with a clock in
        # ``holds_on``, an empty call that asks to wait is held on it until
        # its wait ends or ``arrive`` brings tasks, as a queue that holds does.
        self.lease_waits: list[float] = []
        self.holds_on: Any = None
        self.held: Deferred | None = None
        self.hung_up = 0

    def arrive(self, *tasks: dict) -> None:
        self.waiting += list(tasks)
        if self.held is not None and not self.held.called:
            self.held.callback(None)

    async def _hold(self, wait: float) -> None:
        def hang_up(_):
            self.hung_up += 1

        self.held = Deferred(hang_up)
        timer = self.holds_on.callLater(wait, lambda: self.held.called or self.held.callback(None))
        try:
            await self.held
        finally:
            if timer.active():
                timer.cancel()

    async def lease(self, limit: int, task_classes, wait: float = 0):
        self.leases.append((limit, task_classes))
        self.lease_waits.append(wait)
        if wait > 0 and self.holds_on is not None and not self.waiting and not self.lease_errors:
            await self._hold(wait)
        if self.lease_hold is not None:
            hold, self.lease_hold = self.lease_hold, None
            await hold
        if self.lease_errors:
            error = self.lease_errors.pop(0)
            if error == "hang":
                await Deferred()
            raise error
        batch, self.waiting = self.waiting[:limit], self.waiting[limit:]
        for task in batch:
            self.expiry[task["id"]] = task.get("leaseExpires")
        return batch

    async def renew(self, leases, duration, *, timeout):
        task_ids = [task_id for task_id, _owner in leases]
        self.renewals.append((list(task_ids), timeout))
        self.renew_calls.append((list(leases), duration))
        out = {}
        for task_id in task_ids:
            answer = self.renew_answers.pop(0) if self.renew_answers else self.expiry.get(task_id)
            if answer == "hang":
                await Deferred()
            if isinstance(answer, Exception):
                raise answer
            if answer is None:
                continue  # a task leased without an expiry: nothing to answer
            if answer == "lost":
                answer = None
            else:
                self.expiry[task_id] = answer
                answer = duration  # the heartbeat's extension, in seconds
            out[task_id] = answer
        return out

    async def _report(self, report: Report) -> None:
        self.attempts.append(report)
        if self.report_errors:
            error = self.report_errors.pop(0)
            if error == "hang":
                await Deferred()
            if error is not None:
                raise error
        self.reports.append(report)
        for count, waiter in list(self.report_waiters):
            if len(self.reports) >= count and not waiter.called:
                waiter.callback(None)

    def reported(self, count: int) -> Deferred:
        d: Deferred = Deferred()
        self.report_waiters.append((count, d))
        if len(self.reports) >= count:
            d.callback(None)
        return d

    async def complete(self, task_id, duration_us, *, followups=(), timeout, owner=None):
        args = {"duration": duration_us, "timeout": timeout}
        if followups:
            args["followups"] = list(followups)
        await self._report(Report("complete", task_id, args))

    async def fail(self, task_id, permanent, *, retry_wait=None, message="", timeout, owner=None):
        await self._report(
            Report(
                "fail",
                task_id,
                {
                    "permanent": permanent,
                    "retryWait": retry_wait,
                    "message": message,
                    "timeout": timeout,
                },
            )
        )

    async def yield_task(self, task_id, seconds, *, timeout, owner=None):
        await self._report(Report("yield", task_id, {"duration": seconds, "timeout": timeout}))


class Gate:
    """A handler whose runs finish when the test says so."""

    def __init__(self) -> None:
        self.running: dict[int, Deferred] = {}
        self.started: list[int] = []
        self.max_concurrent = 0
        self.cancelled: list[int] = []

    def __call__(self, task, data):
        d = Deferred(lambda _: self.cancelled.append(task["id"]))
        self.running[task["id"]] = d
        self.started.append(task["id"])
        self.max_concurrent = max(self.max_concurrent, len(self.running))
        d.addBoth(self._done, task["id"])
        return d

    def _done(self, result, task_id):
        self.running.pop(task_id, None)
        return result

    def finish(self, task_id, result=None):
        self.running[task_id].callback(result)


def registry_with(handler, task_class="NoopWorker") -> Registry:
    registry = Registry()
    registry.register(task_class, handler)
    return registry


def succeed_handler(task, data):
    return None


def server_error() -> QueueError:
    return QueueError(
        "api error [ERR_INTERNAL]: internal server error", status=500, code="ERR_INTERNAL"
    )


def make_consumer(
    queue: FakeQueue, registry: Registry, clock, *, class_filter=(), **loop
) -> tuple[Consumer, CollectorRegistry]:
    metrics_registry = CollectorRegistry()
    consumer = Consumer(
        queue=queue,
        registry=registry,
        plan=LeasePlan(registry, class_filter),
        clock=clock,
        settings=LoopSettings(**loop),
        metrics=WorkerMetrics(metrics_registry),
    )
    return consumer, metrics_registry


class CapturedEvents:
    """Log events emitted while the context is open (names and fields)."""

    def __enter__(self) -> CapturedEvents:
        self.events: list[dict] = []
        globalLogPublisher.addObserver(self.events.append)
        return self

    def __exit__(self, *exc) -> None:
        globalLogPublisher.removeObserver(self.events.append)

    def named(self, name: str) -> list[dict]:
        return [e for e in self.events if (e.get("log_format") or "").startswith(name)]

    def failures(self) -> list[dict]:
        return [
            e
            for e in self.events
            if "log_failure" in e or (e.get("log_format") or "").startswith("PANIC")
        ]


async def run_through_consumer(
    reactor, registry: Registry, task: dict, *, class_filter=()
) -> tuple[Report, Consumer]:
    """Lease ``task`` from a fake queue on the real reactor and return the
    report the worker sent for it."""
    queue = FakeQueue()
    task.setdefault("leaseExpires", int(reactor.seconds()) + 3600)
    queue.waiting = [task]
    consumer, _ = make_consumer(
        queue, registry, reactor, poll_interval=0.01, class_filter=class_filter
    )
    consumer.start()
    try:
        await queue.reported(1).addTimeout(10, reactor)
    finally:
        await Deferred.fromCoroutine(consumer.stop())
    return queue.reports[0], consumer
