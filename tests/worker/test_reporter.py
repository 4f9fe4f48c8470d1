"""Reports with bounded retries, seen through the consume loop on an
injected clock (gorge/worker/reporter.py)."""

from __future__ import annotations

import itertools

import pytest
from twisted.internet.task import Clock

from gorge.worker.queueclient import QueueError
from tests.worker.fakes import (
    CapturedEvents,
    FakeQueue,
    make_consumer,
    make_task,
    registry_with,
    server_error,
    succeed_handler,
)


def test_report_retries_five_times_with_growing_waits_then_keeps_the_lease():
    clock, queue = Clock(), FakeQueue()
    queue.waiting = [make_task(7)]
    queue.report_errors = [server_error() for _ in range(5)]
    consumer, metrics = make_consumer(queue, registry_with(succeed_handler), clock)
    with CapturedEvents() as captured:
        consumer.start()
        clock.advance(1.0)
        clock.pump([0.05] * 60)
        gaps = [
            b.args["timeout"] - a.args["timeout"] for a, b in itertools.pairwise(queue.attempts)
        ]
        # the per-attempt timeout is the time left until the lease deadline
        assert gaps == pytest.approx([-0.2, -0.4, -0.6, -0.8], abs=0.051)
        assert len(queue.attempts) == 5
        clock.advance(60)
        assert len(queue.attempts) == 5
        unreported = captured.named("WORKER_TASK_UNREPORTED")
    assert len(unreported) == 1 and unreported[0]["task_id"] == 7
    assert consumer.counters.unreported == 1 and consumer.counters.processed == 0
    assert metrics.get_sample_value("gorge_worker_report_retries_total") == 4


def test_report_retries_stop_at_the_lease_deadline():
    clock, queue = Clock(), FakeQueue()
    clock.advance(100)
    # Leased at 101, one second left.
    queue.waiting = [make_task(8, expires=102, lease_seconds=1)]
    queue.report_errors = [server_error() for _ in range(5)]
    consumer, _ = make_consumer(queue, registry_with(succeed_handler), clock)
    consumer.start()
    clock.pump([1.0] + [0.1] * 30)
    # attempts at 101.0, 101.2, 101.6; the next wait would end at 102.2
    assert len(queue.attempts) == 3
    assert all(a.args["timeout"] <= 1.0 for a in queue.attempts)
    assert consumer.counters.unreported == 1


def test_a_refused_report_is_not_retried():
    clock, queue = Clock(), FakeQueue()
    queue.waiting = [make_task(9)]
    queue.report_errors = [
        QueueError("api error [ERR_NOT_FOUND]: task not found", status=404, code="ERR_NOT_FOUND")
    ]
    consumer, _ = make_consumer(queue, registry_with(succeed_handler), clock)
    with CapturedEvents() as captured:
        consumer.start()
        clock.pump([1.0] * 3)
        assert len(queue.attempts) == 1
        assert "may already be recorded" in captured.named("WORKER_TASK_UNREPORTED")[0]["reason"]


def test_a_report_refused_for_a_lost_lease_says_so_and_is_not_retried():
    clock, queue = Clock(), FakeQueue()
    queue.waiting = [make_task(9)]
    queue.report_errors = [
        QueueError(
            "api error [ERR_LEASE_CONFLICT]: task lease no longer belongs to this owner",
            status=409,
            code="ERR_LEASE_CONFLICT",
        )
    ]
    consumer, _ = make_consumer(queue, registry_with(succeed_handler), clock)
    with CapturedEvents() as captured:
        consumer.start()
        clock.pump([1.0] * 3)
        assert len(queue.attempts) == 1
        (line,) = captured.named("WORKER_TASK_UNREPORTED")
    assert line["reason"] == "lease lost: another holder has the task"
    assert consumer.counters.unreported == 1 and consumer.counters.processed == 0
