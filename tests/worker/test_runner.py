"""One task under its lease, seen through the consume loop on an injected
clock (gorge/worker/runner.py)."""

from __future__ import annotations

import pytest
from twisted.internet.task import Clock

from gorge.worker.outcome import PermanentFailure, RetryLater, Yield
from tests.worker.fakes import (
    CapturedEvents,
    FakeQueue,
    Gate,
    make_consumer,
    make_task,
    registry_with,
    succeed_handler,
)


def test_handler_outliving_its_lease_is_abandoned_not_reported():
    clock, queue, gate = Clock(), FakeQueue(), Gate()
    queue.waiting = [make_task(3, expires=31, lease_seconds=30)]
    queue.renew_answers = ["hang"]  # no renewal comes back: the deadline decides
    consumer, _ = make_consumer(queue, registry_with(gate), clock)
    with CapturedEvents() as captured:
        consumer.start()
        clock.advance(1.0)
        assert gate.started == [3]
        clock.advance(29.9)
        assert gate.cancelled == []
        clock.advance(0.1)
        assert gate.cancelled == [3]
        clock.advance(10)
        assert len(captured.named("WORKER_TASK_ABANDONED")) == 1
    assert queue.attempts == []
    assert consumer.counters.unreported == 1 and consumer.active == 0


@pytest.mark.parametrize(
    "raised, expected",
    [
        (None, ("complete", {})),
        (PermanentFailure("bad data"), ("fail", {"permanent": True, "retryWait": None})),
        (RetryLater("later", retry_wait=42), ("fail", {"permanent": False, "retryWait": 42})),
        (ValueError("boom"), ("fail", {"permanent": False, "retryWait": None})),
        (Yield(2), ("yield", {"duration": 5})),
        (Yield(90), ("yield", {"duration": 90})),
    ],
)
def test_outcomes_map_to_reports_and_counters(raised, expected):
    clock, queue = Clock(), FakeQueue()
    queue.waiting = [make_task(5)]

    def handler(task, data):
        clock.advance(0.25)
        if raised is not None:
            raise RuntimeError("wrapped") from raised

    consumer, _ = make_consumer(queue, registry_with(handler), clock)
    consumer.start()
    clock.advance(1.0)
    (report,) = queue.reports
    kind, args = expected
    assert report.kind == kind and report.task_id == 5
    for key, value in args.items():
        assert report.args[key] == value
    if kind == "complete":
        assert report.args["duration"] == 250_000
        assert consumer.counters.processed == 1
    elif kind == "fail":
        assert consumer.counters.failed == 1
    else:
        assert consumer.counters.yielded == 1


def test_unsupported_class_is_failed_temporarily_without_counting():
    clock, queue = Clock(), FakeQueue()
    queue.waiting = [make_task(11, "SomethingElse")]
    consumer, metrics = make_consumer(queue, registry_with(succeed_handler), clock)
    consumer.start()
    clock.advance(1.0)
    (report,) = queue.reports
    assert (report.kind, report.args["permanent"], report.args["retryWait"]) == ("fail", False, 60)
    assert consumer.counters.failed == 0 and consumer.counters.processed == 0
    assert (
        metrics.get_sample_value(
            "gorge_worker_tasks_total", {"task_class": "SomethingElse", "outcome": "skipped"}
        )
        == 1
    )


def test_task_without_lease_expiry_gets_two_hours():
    clock, queue, gate = Clock(), FakeQueue(), Gate()
    queue.waiting = [make_task(6, expires=None)]
    consumer, _ = make_consumer(queue, registry_with(gate), clock)
    with CapturedEvents() as captured:
        consumer.start()
        clock.advance(1.0)
        assert len(captured.named("WORKER_TASK_WITHOUT_LEASE_EXPIRY")) == 1
    clock.advance(7199)
    assert gate.cancelled == []
    clock.advance(1)
    assert gate.cancelled == [6]


@pytest.mark.parametrize("log_debug", [True, False])
def test_the_success_line_is_built_only_when_debug_lines_are_wanted(log_debug):
    clock, queue = Clock(), FakeQueue()
    queue.waiting = [make_task(1, expires=10_000), make_task(2, expires=10_000)]
    consumer, _ = make_consumer(
        queue, registry_with(succeed_handler), clock, poll_interval=1.0, log_debug=log_debug
    )
    with CapturedEvents() as captured:
        consumer.start()
        clock.advance(1.0)
    assert [r.task_id for r in queue.reports] == [1, 2]
    expected = [1, 2] if log_debug else []
    assert [e["task_id"] for e in captured.named("WORKER_TASK_SUCCEEDED")] == expected


QUEUE_NOW = 1_795_947_000
SKEWS = [-600, 600]


@pytest.mark.parametrize("skew", SKEWS)
@pytest.mark.parametrize("says_seconds", [True, False])
def test_a_worker_minutes_off_the_queue_runs_its_tasks(skew, says_seconds):
    """The queue's absolute leaseExpires is never held against this host's
    clock: 10 minutes ahead or behind, the task runs (nothing is refused as
    "lease expired") and completes, with or without leaseSeconds."""
    clock, queue = Clock(), FakeQueue()
    clock.advance(QUEUE_NOW + skew)
    seconds = 60 if says_seconds else None
    queue.waiting = [make_task(9, expires=QUEUE_NOW + 60, lease_seconds=seconds)]
    consumer, _ = make_consumer(queue, registry_with(succeed_handler), clock)
    with CapturedEvents() as captured:
        consumer.start()
        clock.advance(1.0)
        clock.advance(0)
        assert captured.named("WORKER_TASK_UNREPORTED") == []
    assert [r.kind for r in queue.reports] == ["complete"]
    assert consumer.counters.processed == 1 and consumer.counters.unreported == 0


@pytest.mark.parametrize("skew", SKEWS)
def test_a_worker_minutes_off_the_queue_keeps_the_lease_as_long_as_granted(skew):
    """The deadline is the lease answer's arrival on this host's clock plus
    leaseSeconds: a handler is cut exactly when the granted seconds are
    over, not 10 minutes early or late."""
    clock, queue, gate = Clock(), FakeQueue(), Gate()
    clock.advance(QUEUE_NOW + skew)
    queue.waiting = [make_task(10, expires=QUEUE_NOW + 61, lease_seconds=60)]
    queue.renew_answers = ["hang"]  # no renewal comes back: the deadline decides
    consumer, _ = make_consumer(queue, registry_with(gate), clock)
    consumer.start()
    clock.advance(1.0)  # the answer arrives; the lease runs 60 s from here
    assert gate.started == [10]
    clock.advance(59.9)
    assert gate.cancelled == []
    clock.advance(0.1)
    assert gate.cancelled == [10]
