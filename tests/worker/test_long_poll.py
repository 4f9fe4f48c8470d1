"""The consume loop with long-poll leases (docs/worker.md, Long-poll): one
call held by the queue instead of one call per poll interval."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from gorge.worker.consumer import Consumer, LoopSettings
from gorge.worker.metrics import WorkerMetrics
from gorge.worker.registry import LeasePlan, Registry
from tests.worker.fakes import CapturedEvents, FakeQueue, make_consumer, make_task, server_error

WAIT = 20.0


def _consumer(queue, clock, **loop):
    registry = Registry()
    ran: list[int] = []
    registry.register("NoopWorker", lambda task, data: ran.append(task["id"]))
    settings = {"poll_interval": 1.0, "lease_wait": WAIT, **loop}
    consumer, _ = make_consumer(queue, registry, clock, **settings)
    return consumer, ran


def test_an_idle_worker_sends_one_lease_call_per_wait():
    clock, queue = Clock(), FakeQueue()
    queue.holds_on = clock
    consumer, _ = _consumer(queue, clock)
    consumer.start()
    clock.advance(1.0)
    # The first call answers at once (readiness); one poll interval later
    # the held ones begin.
    assert queue.lease_waits == [0]
    assert consumer.lease_attempted and consumer.readiness_reason() is None
    clock.advance(1.0)
    assert queue.lease_waits == [0, WAIT]
    clock.pump([1.0] * 19)
    assert len(queue.lease_waits) == 2
    clock.pump([1.0] * 100)
    # 120 s after the first call: that call, and one per 20 s since the second.
    assert queue.lease_waits == [0] + [WAIT] * 6


def test_a_task_arriving_during_the_wait_runs_at_once():
    clock, queue = Clock(), FakeQueue()
    queue.holds_on = clock
    consumer, ran = _consumer(queue, clock)
    consumer.start()
    clock.pump([1.0, 1.0])
    clock.advance(3.0)
    assert ran == []
    queue.arrive(make_task(7, expires=int(clock.seconds()) + 3600))
    assert ran == [7]
    assert [r.task_id for r in queue.reports] == [7]
    # And the worker is back on a held call, not on the poll timer.
    clock.advance(0)
    assert queue.lease_waits == [0, WAIT, WAIT]


def test_a_queue_that_does_not_hold_is_asked_once_per_poll_interval():
    clock, queue = Clock(), FakeQueue()  # answers at once, whatever the wait
    consumer, _ = _consumer(queue, clock)
    consumer.start()
    clock.pump([1.0] * 10)
    assert 9 <= len(queue.lease_waits) <= 11
    assert queue.lease_waits[:2] == [0, WAIT]


def test_after_a_failure_the_first_call_answers_at_once():
    clock, queue = Clock(), FakeQueue()
    queue.holds_on = clock
    consumer, _ = _consumer(queue, clock)
    consumer.start()
    clock.pump([1.0, 1.0])
    queue.lease_errors = [server_error()]
    clock.advance(WAIT)  # the held call ends in a failure
    assert queue.lease_waits == [0, WAIT]
    assert consumer.lease_error is not None
    clock.pump([1.0, 1.0])
    # A poll interval later a call that answers at once, then held ones.
    assert queue.lease_waits == [0, WAIT, 0, WAIT]
    assert consumer.readiness_reason() is None


def test_the_watchdog_is_fed_while_a_call_is_held():
    clock, queue = Clock(), FakeQueue()
    queue.holds_on = clock
    registry = Registry()
    registry.register("NoopWorker", lambda task, data: None)
    pings: list[float] = []
    consumer = Consumer(
        queue=queue,
        registry=registry,
        plan=LeasePlan(registry, ()),
        clock=clock,
        settings=LoopSettings(poll_interval=1.0, lease_wait=WAIT),
        metrics=WorkerMetrics(CollectorRegistry()),
        on_progress=lambda: pings.append(clock.seconds()),
    )
    consumer.start()
    clock.pump([1.0] * 12)
    assert queue.lease_waits == [0, WAIT]
    # The first call at 1 s, then every poll interval of the held one.
    assert pings == [1.0] + [float(t) for t in range(3, 13)]


def test_stop_hangs_up_a_held_call_at_once():
    clock, queue = Clock(), FakeQueue()
    queue.holds_on = clock
    consumer, _ = _consumer(queue, clock, drain_timeout=5.0)
    consumer.start()
    clock.pump([1.0, 1.0])
    assert queue.lease_waits == [0, WAIT]
    with CapturedEvents() as events:
        stopped = Deferred.fromCoroutine(consumer.stop())
        clock.advance(0)
        assert stopped.called
    assert queue.hung_up == 1
    assert events.named("WORKER_LEASE_FAILED") == []
    assert len(queue.lease_waits) == 2


def test_without_a_wait_the_loop_polls_as_before():
    clock, queue = Clock(), FakeQueue()
    queue.holds_on = clock
    consumer, _ = _consumer(queue, clock, lease_wait=0.0)
    consumer.start()
    clock.pump([1.0] * 5)
    assert queue.lease_waits == [0] * 5
