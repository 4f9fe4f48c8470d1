"""The consume loop on an injected clock."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import Clock

from gorge.worker.consumer import Consumer, LoopSettings
from gorge.worker.metrics import WorkerMetrics
from gorge.worker.outcome import RetryLater
from gorge.worker.queueclient import QueueError
from gorge.worker.registry import LeasePlan, Registry
from tests.worker.fakes import (
    CapturedEvents,
    FakeQueue,
    Gate,
    make_consumer,
    make_task,
    registry_with,
    server_error,
    succeed_handler,
)


def test_first_lease_after_one_poll_interval_and_batches_within_free_capacity():
    clock, queue, gate = Clock(), FakeQueue(), Gate()
    queue.waiting = [make_task(i) for i in range(1, 11)]
    consumer, _ = make_consumer(
        queue, registry_with(gate), clock, lease_limit=10, max_workers=3, poll_interval=1.0
    )
    consumer.start()
    clock.advance(0.5)
    assert queue.leases == []
    clock.advance(0.5)
    assert queue.leases == [(3, ["NoopWorker"])]
    assert gate.started == [1, 2, 3]
    clock.pump([1.0] * 5)
    assert len(queue.leases) == 1  # no free slot: no lease call at all
    gate.finish(2)
    clock.advance(0)
    assert queue.leases[-1] == (1, ["NoopWorker"])
    assert gate.started == [1, 2, 3, 4]
    assert gate.max_concurrent == 3
    assert [r.kind for r in queue.reports] == ["complete"]
    assert consumer.counters.processed == 1


@settings(max_examples=60, deadline=None)
@given(
    max_workers=st.integers(1, 6),
    lease_limit=st.integers(1, 8),
    tasks=st.integers(0, 25),
    steps=st.lists(st.one_of(st.just("tick"), st.integers(0, 30)), max_size=60),
)
def test_lease_never_exceeds_free_capacity_and_cap_holds(max_workers, lease_limit, tasks, steps):
    clock, queue, gate = Clock(), FakeQueue(), Gate()
    queue.waiting = [make_task(i) for i in range(1, tasks + 1)]
    consumer, _ = make_consumer(
        queue,
        registry_with(gate),
        clock,
        lease_limit=lease_limit,
        max_workers=max_workers,
        poll_interval=1.0,
    )
    original = queue.lease

    async def checked_lease(limit, classes):
        assert 1 <= limit <= min(lease_limit, max_workers - len(gate.running))
        return await original(limit, classes)

    queue.lease = checked_lease
    consumer.start()
    for step in steps:
        if step == "tick":
            clock.advance(1.0)
        elif gate.running:
            gate.finish(sorted(gate.running)[step % len(gate.running)])
            clock.advance(0)
        assert len(gate.running) <= max_workers
        assert consumer.active <= max_workers
    assert gate.max_concurrent <= max_workers
    assert len(set(gate.started)) == len(gate.started)


def test_class_filter_is_sent_sorted_and_only_runnable_classes_leased():
    clock, queue = Clock(), FakeQueue()
    registry = Registry()
    registry.register("B", succeed_handler)
    registry.register("A", succeed_handler)
    registry.register("C", succeed_handler)
    consumer, _ = make_consumer(queue, registry, clock, class_filter=("C", "A", "Z"))
    consumer.start()
    clock.advance(1.0)
    assert queue.leases == [(4, ["A", "C"])]


def test_fallback_without_filter_omits_task_classes():
    clock, queue = Clock(), FakeQueue()
    registry = Registry()
    registry.register("B", succeed_handler)
    registry.set_fallback(succeed_handler)
    consumer, _ = make_consumer(queue, registry, clock)
    consumer.start()
    clock.advance(1.0)
    assert queue.leases == [(4, None)]


def test_idle_worker_keeps_polling_and_picks_up_new_work_within_one_interval():
    clock, queue = Clock(), FakeQueue()
    consumer, _ = make_consumer(
        queue, registry_with(succeed_handler), clock, idle_timeout=180, poll_interval=1.0
    )
    with CapturedEvents() as captured:
        consumer.start()
        clock.pump([1.0] * 400)
        assert consumer.idle is True
        assert len(captured.named("WORKER_IDLE")) == 1
        leases_before = len(queue.leases)
        queue.waiting = [make_task(1, expires=10_000)]
        clock.advance(1.0)
        assert len(queue.leases) == leases_before + 1
        assert [r.task_id for r in queue.reports] == [1]
        assert consumer.idle is False
        assert len(captured.named("WORKER_ACTIVE")) == 1


def test_hibernation_when_configured_makes_no_lease_calls_for_its_window():
    clock, queue = Clock(), FakeQueue()
    consumer, _ = make_consumer(
        queue,
        registry_with(succeed_handler),
        clock,
        idle_timeout=10,
        hibernate=100,
        poll_interval=1.0,
    )
    consumer.start()
    clock.pump([1.0] * 12)  # idle clock starts at t=1, passes 10 s at t=12
    assert consumer.idle is True
    count = len(queue.leases)
    clock.pump([1.0] * 99)
    assert len(queue.leases) == count
    clock.pump([1.0])  # hibernation ends at t=112
    assert len(queue.leases) == count + 1


def test_lease_errors_set_readiness_and_log_by_state_change():
    clock, queue = Clock(), FakeQueue()
    consumer, _ = make_consumer(queue, registry_with(succeed_handler), clock)
    assert consumer.readiness_reason() == "no lease attempt has completed yet"
    queue.lease_errors = [
        QueueError("lease: http: POST /api/queue/lease: ConnectionRefusedError") for _ in range(150)
    ]
    with CapturedEvents() as captured:
        consumer.start()
        clock.pump([1.0] * 150)
        assert consumer.readiness_reason().startswith("taskqueue: lease: http:")
        assert len(captured.named("WORKER_LEASE_FAILED")) == 1
        assert 1 <= len(captured.named("WORKER_LEASE_STILL_FAILING")) <= 3
        clock.advance(1.0)
        assert consumer.readiness_reason() is None
        assert len(captured.named("WORKER_LEASE_RECOVERED")) == 1
    assert len(queue.leases) == 151


def test_a_task_already_running_is_neither_run_nor_reported_again():
    clock, queue, gate = Clock(), FakeQueue(), Gate()
    queue.waiting = [make_task(4)]
    consumer, _ = make_consumer(queue, registry_with(gate), clock)
    with CapturedEvents() as captured:
        consumer.start()
        clock.advance(1.0)
        queue.waiting = [make_task(4)]
        clock.advance(1.0)
        assert gate.started == [4]
        assert len(captured.named("WORKER_TASK_DUPLICATE_LEASE")) == 1
    gate.finish(4)
    assert [r.kind for r in queue.reports] == ["complete"]


def test_shutdown_stops_leasing_lets_running_tasks_finish_and_report():
    clock, queue, gate = Clock(), FakeQueue(), Gate()
    queue.waiting = [make_task(1), make_task(2)]
    consumer, _ = make_consumer(queue, registry_with(gate), clock, drain_timeout=30)
    consumer.start()
    clock.advance(1.0)
    stopped = Deferred.fromCoroutine(consumer.stop())
    assert consumer.readiness_reason() == "shutting down"
    leases = len(queue.leases)
    clock.advance(10)
    assert len(queue.leases) == leases
    assert not stopped.called
    gate.finish(1)
    gate.finish(2, None)
    assert stopped.called
    assert sorted(r.task_id for r in queue.reports) == [1, 2]
    assert consumer.counters.processed == 2


def test_shutdown_hands_back_tasks_of_a_lease_in_flight():
    clock, queue, gate = Clock(), FakeQueue(), Gate()
    queue.waiting = [make_task(1), make_task(2)]
    hold = queue.lease_hold = Deferred()
    consumer, _ = make_consumer(queue, registry_with(gate), clock)
    consumer.start()
    clock.advance(1.0)
    stopped = Deferred.fromCoroutine(consumer.stop())
    assert not stopped.called
    hold.callback(None)
    assert stopped.called
    assert gate.started == []
    assert [(r.kind, r.task_id, r.args["duration"]) for r in queue.reports] == [
        ("yield", 1, 5),
        ("yield", 2, 5),
    ]
    assert consumer.counters.yielded == 0


def test_drain_budget_expiry_abandons_running_tasks_unreported():
    clock, queue, gate = Clock(), FakeQueue(), Gate()
    queue.waiting = [make_task(1)]
    consumer, _ = make_consumer(queue, registry_with(gate), clock, drain_timeout=5)
    with CapturedEvents() as captured:
        consumer.start()
        clock.advance(1.0)
        stopped = Deferred.fromCoroutine(consumer.stop())
        clock.advance(5)
        assert stopped.called
        assert [e["task_id"] for e in captured.named("WORKER_TASK_ABANDONED")] == [1]
    assert gate.cancelled == [1]
    assert queue.attempts == []
    assert consumer.counters.unreported == 1


def test_abandoned_handler_that_turns_cancellation_into_a_failure_is_still_not_reported():
    clock, queue = Clock(), FakeQueue()
    queue.waiting = [make_task(3, expires=11, lease_seconds=10)]
    queue.renew_answers = ["hang"]  # the deadline decides

    def handler(task, data):
        async def run():
            try:
                await Deferred()
            except CancelledError:
                raise RetryLater("request aborted") from None  # what an HTTP client may do

        return Deferred.fromCoroutine(run())

    consumer, _ = make_consumer(queue, registry_with(handler), clock)
    consumer.start()
    clock.pump([1.0] * 15)
    assert queue.attempts == []
    assert consumer.counters.unreported == 1


def test_hand_backs_cut_by_the_drain_budget_move_no_counter():
    clock, queue, gate = Clock(), FakeQueue(), Gate()
    queue.waiting = [make_task(1), make_task(2)]
    hold = queue.lease_hold = Deferred()
    queue.report_errors = ["hang", "hang"]
    consumer, metrics = make_consumer(queue, registry_with(gate), clock, drain_timeout=5)
    consumer.start()
    clock.advance(1.0)
    stopped = Deferred.fromCoroutine(consumer.stop())
    hold.callback(None)
    assert [a.kind for a in queue.attempts] == ["yield", "yield"]
    clock.advance(6)
    assert stopped.called
    assert gate.started == []
    assert consumer.counters.unreported == 0
    assert (
        metrics.get_sample_value(
            "gorge_worker_tasks_total", {"task_class": "NoopWorker", "outcome": "unreported"}
        )
        is None
    )


def test_ids_of_a_rejected_lease_answer_are_logged_even_while_leasing_fails():
    clock, queue = Clock(), FakeQueue()
    queue.lease_errors = [
        QueueError("lease: http: POST /api/queue/lease: ConnectionRefusedError"),
        QueueError("lease: malformed task in answer (ids [5, 6])"),
    ]
    consumer, _ = make_consumer(queue, registry_with(succeed_handler), clock)
    with CapturedEvents() as captured:
        consumer.start()
        clock.advance(1.0)
        assert len(captured.named("WORKER_LEASE_FAILED")) == 1
        clock.advance(1.0)
        assert len(queue.leases) == 2
        assert any(
            "[5, 6]" in str(e.get("error", "")) or e.get("task_ids") == [5, 6]
            for e in captured.events
        )


def test_lease_errors_neither_reset_nor_start_the_idle_clock():
    clock, queue = Clock(), FakeQueue()
    consumer, _ = make_consumer(
        queue, registry_with(succeed_handler), clock, idle_timeout=10, poll_interval=1.0
    )
    consumer.start()
    clock.advance(1.0)  # t=1: empty answer starts the idle clock
    queue.lease_errors = [server_error() for _ in range(5)]
    clock.pump([1.0] * 5)  # t=2..6: failures
    assert consumer.idle is False
    clock.pump([1.0] * 6)  # t=7..12: empty again; 11 s > 10 s since t=1
    assert consumer.idle is True
    queue.lease_errors = [server_error() for _ in range(5)]
    clock.pump([1.0] * 5)
    assert consumer.idle is True  # failing does not end idleness either


def test_at_most_one_lease_call_in_flight_even_when_slots_free():
    clock, queue, gate = Clock(), FakeQueue(), Gate()
    queue.waiting = [make_task(i) for i in range(1, 5)]
    consumer, _ = make_consumer(
        queue, registry_with(gate), clock, lease_limit=4, max_workers=4, poll_interval=1.0
    )
    consumer.start()
    clock.advance(1.0)
    assert len(queue.leases) == 1 and len(gate.started) == 4
    hold = queue.lease_hold = Deferred()  # the next lease call hangs
    for task_id in (1, 2, 3, 4):
        gate.finish(task_id)
        clock.advance(0)
    assert len(queue.leases) == 2
    clock.pump([1.0] * 5)
    assert len(queue.leases) == 2
    hold.callback(None)
    assert consumer.readiness_reason() is None


def test_shutdown_ends_hibernation_at_once():
    clock, queue = Clock(), FakeQueue()
    consumer, _ = make_consumer(
        queue,
        registry_with(succeed_handler),
        clock,
        idle_timeout=2,
        hibernate=1000,
        poll_interval=1.0,
    )
    consumer.start()
    clock.pump([1.0] * 5)
    assert consumer.idle is True and clock.getDelayedCalls()
    leases = len(queue.leases)
    stopped = Deferred.fromCoroutine(consumer.stop())
    assert stopped.called
    assert clock.getDelayedCalls() == []
    clock.advance(2000)
    assert len(queue.leases) == leases


def test_hibernating_worker_still_reports_progress_every_poll_interval():
    clock, queue = Clock(), FakeQueue()
    progress = []
    registry = registry_with(succeed_handler)
    consumer = Consumer(
        queue=queue,
        registry=registry,
        plan=LeasePlan(registry, ()),
        clock=clock,
        metrics=WorkerMetrics(CollectorRegistry()),
        settings=LoopSettings(idle_timeout=2, hibernate=100, poll_interval=1.0),
        on_progress=lambda: progress.append(clock.seconds()),
    )
    consumer.start()
    clock.pump([1.0] * 5)
    assert consumer.idle is True
    leases = len(queue.leases)
    before = len(progress)
    clock.pump([1.0] * 50)
    assert len(queue.leases) == leases  # still hibernating: no lease call
    assert len(progress) - before >= 45
