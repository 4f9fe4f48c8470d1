"""Prometheus metrics of gorge-taskqueue, on the service's own registry."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gorge.log.metric import Counter, Gauge, Histogram
from gorge.taskqueue.model import Stats
from gorge.taskqueue.waiting import Waiting


class _OldestWaiting(Collector):
    """The last reading of the queue's heads, one series per class and band
    that has a waiting task: a class whose tasks all ran leaves no stale
    series behind, as a labelled Gauge's child would."""

    def __init__(self) -> None:
        self.reading: Waiting | None = None

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "gorge_taskqueue_oldest_waiting_seconds",
            "Age of the oldest waiting task per class and priority band, as of the"
            " last stats read.",
            labels=["task_class", "priority_band"],
        )
        if self.reading is not None:
            for (task_class, band), age in sorted(self.reading.ages().items()):
                family.add_metric([task_class, band], age)
        yield family


class TaskQueueMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.enqueued = Counter(
            "gorge_taskqueue_tasks_enqueued", "Tasks enqueued.", ["task_class"], registry=registry
        )
        self.leased = Counter(
            "gorge_taskqueue_tasks_leased",
            "Tasks handed out by lease.",
            ["task_class"],
            registry=registry,
        )
        self.completed = Counter(
            "gorge_taskqueue_tasks_completed",
            "Tasks archived as success.",
            ["task_class"],
            registry=registry,
        )
        self.failed = Counter(
            "gorge_taskqueue_tasks_failed",
            "Failure reports.",
            ["task_class", "permanent"],
            registry=registry,
        )
        self.cancelled = Counter(
            "gorge_taskqueue_tasks_cancelled",
            "Tasks archived as cancelled.",
            ["task_class"],
            registry=registry,
        )
        self.requeued = Counter(
            "gorge_taskqueue_tasks_requeued",
            "Archived tasks queued again as new tasks.",
            ["task_class"],
            registry=registry,
        )
        self.renewals = Counter(
            "gorge_taskqueue_lease_renewals",
            "Lease renewals by answer (renewed, lost).",
            ["result"],
            registry=registry,
        )
        self.depth = Gauge(
            "gorge_taskqueue_queue_depth",
            "Tasks by state, as of the last stats read.",
            ["state"],
            registry=registry,
        )
        self.lease_seconds = Histogram(
            "gorge_taskqueue_lease_seconds",
            "Time to run one lease call against the backend.",
            registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self._oldest_waiting = _OldestWaiting()
        registry.register(self._oldest_waiting)

    @property
    def waiting(self) -> Waiting | None:
        """The last reading of the queue's heads, None before the first."""
        return self._oldest_waiting.reading

    def observe_waiting(self, waiting: Waiting) -> None:
        self._oldest_waiting.reading = waiting

    def observe_stats(self, stats: Stats) -> None:
        self.depth.labels("active").set(stats.active)
        self.depth.labels("leased").set(stats.leased)
        self.depth.labels("waiting").set(stats.active - stats.leased)
        self.depth.labels("failed").set(stats.failed)
        self.depth.labels("archived").set(stats.archived)
