"""Prometheus metrics of one mailer service.

Registered on the service's own registry; labels never carry addresses,
subjects or message ids.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class MailerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.attempts = Counter(
            "gorge_mailer_attempts_total",
            "Backend attempts by mailer key and classified outcome.",
            ["mailer", "outcome"],
            registry=registry,
        )
        self.sends = Counter(
            "gorge_mailer_sends_total",
            "Finished sends by deciding mailer key (or none) and final result.",
            ["mailer", "result"],
            registry=registry,
        )
        self.failovers = Counter(
            "gorge_mailer_failovers_total",
            "Moves from one backend to the next candidate within a send.",
            registry=registry,
        )
        self.truncations = Counter(
            "gorge_mailer_body_truncations_total",
            "Message bodies shortened to the body limit.",
            registry=registry,
        )
        self.duration = Histogram(
            "gorge_mailer_send_duration_seconds",
            "Duration of one backend attempt.",
            ["mailer"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60),
            registry=registry,
        )
        self.requests = Counter(
            "gorge_mailer_requests_total",
            "Answers of POST /api/mailer/send by error code (OK on success).",
            ["code"],
            registry=registry,
        )
        self.idempotent_sends = Counter(
            "gorge_mailer_idempotent_sends_total",
            "Sends with an Idempotency-Key by what became of the key: sent, replayed,"
            " shared, in_progress, abandoned, store_unavailable.",
            ["result"],
            registry=registry,
        )
        self.idempotency_pruned = Counter(
            "gorge_mailer_idempotency_pruned_total",
            "Idempotency records removed for age or for the size bound.",
            registry=registry,
        )
