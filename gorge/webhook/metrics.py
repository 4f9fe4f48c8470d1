"""Prometheus metrics of one gorge-webhook process, on the service's own registry."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

OUTCOMES = ("sent", "retry", "failed", "config_failure", "abandoned")
# held: the next attempt waits for it; not_later: the fixed retry comes as late
# or later; unreadable: neither seconds nor an HTTP date; lost: another writer
# changed the row while it was held.
RETRY_AFTER_RESULTS = ("held", "not_later", "unreadable", "lost")


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.deliveries = Counter(
            "gorge_webhook_deliveries",
            "Delivery outcomes written back, by outcome",
            ["outcome"],
            registry=registry,
        )
        self.claims = Counter(
            "gorge_webhook_claims",
            "Claim attempts by result (lost: another process or task won first)",
            ["result"],
            registry=registry,
        )
        self.breaker_transitions = Counter(
            "gorge_webhook_breaker_transitions",
            "Per-hook breaker state changes",
            ["state"],
            registry=registry,
        )
        self.breaker_skips = Counter(
            "gorge_webhook_breaker_skips",
            "Candidates left queued because their hook is open",
            registry=registry,
        )
        self.open_breaker_rows = Gauge(
            "gorge_webhook_open_breaker_rows",
            "Queued rows of hooks whose breaker is open",
            registry=registry,
        )
        self.in_flight = Gauge(
            "gorge_webhook_in_flight", "Candidates being processed now", registry=registry
        )
        self.delivery_seconds = Histogram(
            "gorge_webhook_delivery_seconds",
            "POST duration, redirects included",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30),
            registry=registry,
        )
        # The cycle of a few hot hooks is POST, write, POST: this is the write
        # part, seen from the delivery (docs/webhook.md, "Hot hooks").
        self.write_seconds = Histogram(
            "gorge_webhook_write_seconds",
            "From an attempt's end to its result written (the write window, a wait"
            " for a free lane, the statements), by whether the hook's next row waits",
            ["next_waits"],
            buckets=(0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5),
            registry=registry,
        )
        self.retry_after = Counter(
            "gorge_webhook_retry_after",
            "Retry-After on 429/503 answers of retry=forever requests, by what it did",
            ["result"],
            registry=registry,
        )
        self.gone = Counter(
            "gorge_webhook_gone",
            "410 Gone answers (the request still follows its retry mode)",
            registry=registry,
        )
        self.replays = Counter(
            "gorge_webhook_replays",
            "Requests put back in the queue through the API, by the status they had",
            ["previous"],
            registry=registry,
        )
        self.poll_failures = Counter(
            "gorge_webhook_poll_failures", "Polls that failed (database errors)", registry=registry
        )
        for outcome in OUTCOMES:
            self.deliveries.labels(outcome=outcome)
        for state in ("open", "closed"):
            self.breaker_transitions.labels(state=state)
        for result in ("won", "lost", "error"):
            self.claims.labels(result=result)
        for previous in ("sent", "failed"):
            self.replays.labels(previous=previous)
        for waits in ("yes", "no"):
            self.write_seconds.labels(next_waits=waits)
        for result in RETRY_AFTER_RESULTS:
            self.retry_after.labels(result=result)


class BacklogAge(Collector):
    """``gorge_webhook_oldest_queued_seconds{hook}``, read from the queue view at
    scrape time (no query: the view already holds every queued row); a hook
    with nothing queued has no series."""

    def __init__(self, oldest_queued: Callable[[], dict[str, int]]) -> None:
        self._oldest_queued = oldest_queued

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "gorge_webhook_oldest_queued_seconds",
            "Age of each hook's oldest queued request, as of the last poll",
            labels=["hook"],
        )
        for hook, age in sorted(self._oldest_queued().items()):
            family.add_metric([hook], age)
        yield family
