"""Prometheus series of the worker, on the service's own registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gorge.log.metric import Counter, Gauge, Histogram


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.tasks = Counter(
            "gorge_worker_tasks",
            "Tasks by class and final outcome",
            ["task_class", "outcome"],
            registry=registry,
        )
        self.handler_seconds = Histogram(
            "gorge_worker_handler_duration_seconds",
            "Handler run time by class",
            ["task_class"],
            registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120, 600, 3600, 7200),
        )
        self.active = Gauge(
            "gorge_worker_active_tasks", "Tasks being run or reported", registry=registry
        )
        self.lease_requests = Counter(
            "gorge_worker_lease_requests",
            "Lease calls by result",
            ["result"],
            registry=registry,
        )
        self.report_attempts = Counter(
            "gorge_worker_report_attempts",
            "Report calls to the queue by result",
            ["result"],
            registry=registry,
        )
        self.report_retries = Counter(
            "gorge_worker_report_retries",
            "Report attempts after the first one",
            registry=registry,
        )
        self.lease_renewals = Counter(
            "gorge_worker_lease_renewals",
            "Lease renewals of running tasks by answer",
            ["result"],
            registry=registry,
        )
        self.conduit_calls = Counter(
            "gorge_worker_conduit_calls",
            "worker.execute calls by result",
            ["result"],
            registry=registry,
        )
        self.executor_runs = Counter(
            "gorge_worker_php_executor_runs",
            "Tasks run in local PHP executors, by result (answered, died)",
            ["result"],
            registry=registry,
        )
        self.executors = Gauge(
            "gorge_worker_php_executors",
            "Local PHP executors by state (idle, busy, starting)",
            ["state"],
            registry=registry,
        )
        self.webhook_tasks_left = Counter(
            "gorge_worker_webhook_tasks_left_to_gorge_webhook",
            "HeraldWebhookWorker tasks completed without delivery, because "
            "gorge-webhook delivers their request",
            registry=registry,
        )
        self.idle = Gauge(
            "gorge_worker_idle", "1 while the worker declares itself idle", registry=registry
        )
