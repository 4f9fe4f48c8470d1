"""Renewing the leases of running tasks (docs/worker.md, Heartbeat leases):
all in one call every heartbeat, past the first deadline, and cancelling the
handler without any report once the queue says the lease is lost."""

from __future__ import annotations

import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock

from gorge.worker.conduit import ConduitClient
from gorge.worker.handlers.conduit import ConduitDelegate
from gorge.worker.queueclient import QueueError
from gorge.worker.registry import Registry
from tests.worker.fakes import CapturedEvents, FakeQueue, make_consumer, make_task, server_error
from tests.worker.test_consumer import Gate, registry_with, succeed_handler


def started(queue, gate, *, expires, **loop):
    clock = Clock()
    queue.waiting = [make_task(4, expires=expires, lease_seconds=expires - 1)]
    consumer, metrics = make_consumer(queue, registry_with(gate), clock, **loop)
    consumer.start()
    clock.advance(1.0)  # leased and started at t=1
    assert gate.started == [4]
    return clock, consumer, metrics


def test_every_heartbeat_renews_all_held_leases_in_one_call_past_the_first_deadline():
    queue, gate = FakeQueue(), Gate()
    clock = Clock()
    queue.waiting = [
        make_task(4, expires=61, lease_seconds=60),
        make_task(5, expires=61, lease_seconds=60),
    ]
    queue.waiting[0]["leaseOwner"], queue.waiting[1]["leaseOwner"] = "w:1", "w:2"
    consumer, metrics = make_consumer(
        queue, registry_with(gate), clock, heartbeat=15.0, heartbeat_lease=60
    )
    consumer.start()
    clock.advance(1.0)  # leased and started at t=1, 60 s of lease each
    assert gate.started == [4, 5]
    clock.advance(14.9)
    assert queue.renew_calls == []
    clock.advance(0.1)  # t=16: one call for both, each under its own owner
    assert queue.renew_calls == [([(4, "w:1"), (5, "w:2")], 60)]
    for _ in range(10):  # far past the first lease's 61 s: still running
        clock.advance(15)
    assert len(queue.renew_calls) == 11
    assert gate.cancelled == [] and consumer.active == 2
    gate.finish(4)
    gate.finish(5)
    clock.advance(0)
    assert [r.kind for r in queue.reports] == ["complete", "complete"]
    # Cut at the last renewal (t=166) plus its 60 s.
    assert queue.reports[0].args["timeout"] == 166 + 60 - clock.seconds()
    renewed = metrics.get_sample_value("gorge_worker_lease_renewals_total", {"result": "renewed"})
    assert renewed == 22
    clock.advance(600)
    assert len(queue.renew_calls) == 11  # none once nothing runs
    assert all(timeout <= 30.0 for _, timeout in queue.renewals)


def test_a_lost_lease_cancels_the_handler_at_the_next_heartbeat_and_reports_nothing():
    queue, gate = FakeQueue(), Gate()
    clock, consumer, metrics = started(queue, gate, expires=61, heartbeat=15.0)
    queue.renew_answers = ["lost"]
    with CapturedEvents() as captured:
        clock.advance(14.9)
        assert gate.cancelled == []
        clock.advance(0.1)  # t=16: the heartbeat answers "lost"
        assert gate.cancelled == [4]
        clock.advance(1000)
        assert len(captured.named("WORKER_TASK_LEASE_LOST")) == 1
        assert captured.named("WORKER_TASK_UNREPORTED") == []
        assert captured.named("WORKER_TASK_ABANDONED") == []
    assert queue.attempts == []
    assert consumer.active == 0
    assert consumer.counters.unreported == 1 and consumer.counters.failed == 0
    assert (
        metrics.get_sample_value(
            "gorge_worker_tasks_total", {"task_class": "NoopWorker", "outcome": "lease_lost"}
        )
        == 1
    )
    assert metrics.get_sample_value("gorge_worker_lease_renewals_total", {"result": "lost"}) == 1


def test_a_failed_heartbeat_is_tried_again_at_the_next_one():
    queue, gate = FakeQueue(), Gate()
    clock, consumer, _ = started(queue, gate, expires=61, heartbeat=15.0)
    queue.renew_answers = [server_error()]
    with CapturedEvents() as captured:
        clock.advance(15)  # t=16: fails
        assert len(queue.renewals) == 1
        clock.advance(15)  # t=31: renewed
        assert len(queue.renewals) == 2
        assert len(captured.named("WORKER_LEASE_RENEW_FAILED")) == 1
        assert len(captured.named("WORKER_LEASE_RENEW_RECOVERED")) == 1
    clock.advance(100)
    assert gate.cancelled == []
    gate.finish(4)
    clock.advance(0)
    assert [r.kind for r in queue.reports] == ["complete"]


def test_a_queue_without_renewal_keeps_the_lease_deadline_and_is_asked_no_more():
    queue, gate = FakeQueue(), Gate()
    clock, consumer, _ = started(queue, gate, expires=301, max_workers=2, heartbeat=15.0)
    queue.renew_answers = [
        QueueError("api error [ERR_NOT_FOUND]: Not Found", status=404, code="ERR_NOT_FOUND")
    ]
    with CapturedEvents() as captured:
        clock.advance(15)
        assert len(captured.named("WORKER_LEASE_RENEWAL_DISABLED")) == 1
    clock.advance(300 - 15)  # the original deadline cuts the handler
    assert gate.cancelled == [4]
    queue.waiting = [make_task(5, expires=int(clock.seconds()) + 300, lease_seconds=300)]
    clock.advance(1.0)
    assert gate.started == [4, 5]
    clock.advance(200)
    assert len(queue.renewals) == 1  # none for the second task


def test_renewal_stops_when_the_handler_ends():
    queue, gate = FakeQueue(), Gate()
    clock, consumer, _ = started(queue, gate, expires=3601, heartbeat=15.0)
    queue.renew_answers = ["hang"]
    clock.advance(15)  # a renewal in flight
    gate.finish(4)
    clock.advance(0)
    assert [r.kind for r in queue.reports] == ["complete"]
    clock.advance(7200)
    assert len(queue.renewals) == 1


def test_a_handler_done_before_it_waits_is_reported_with_no_lease_timers_left():
    # Neither a deadline guard nor a renewal is armed for it: nothing to
    # cancel, and nothing that could fire after its report.
    class RecordingClock(Clock):
        def __init__(self) -> None:
            super().__init__()
            self.delays: list[float] = []

        def callLater(self, delay, *args, **kwargs):
            self.delays.append(delay)
            return super().callLater(delay, *args, **kwargs)

    queue, clock = FakeQueue(), RecordingClock()
    queue.waiting = [make_task(7, expires=3601, lease_seconds=3600)]
    consumer, _ = make_consumer(queue, registry_with(succeed_handler), clock)
    consumer.start()
    clock.advance(1.0)
    clock.advance(0)
    assert [r.kind for r in queue.reports] == ["complete"]
    # The lease's deadline (3600 s away) and a heartbeat were never armed.
    assert [delay for delay in clock.delays if delay >= 10] == []
    assert queue.reports[0].args["timeout"] == 3601 - clock.seconds()
    clock.advance(3600)
    assert queue.renewals == []
    assert consumer.counters.processed == 1


class _HangingServer(Factory):
    """Accepts one request and never answers; ``lost`` fires when the client
    hangs up."""

    def __init__(self) -> None:
        self.received: Deferred = Deferred()
        self.lost: Deferred = Deferred()

    def buildProtocol(self, addr):
        server = self

        class Hang(Protocol):
            def dataReceived(self, data):
                if not server.received.called:
                    server.received.callback(data)

            def connectionLost(self, reason):
                if not server.lost.called:
                    server.lost.callback(None)

        return Hang()


@pytest_twisted.ensureDeferred
async def test_a_lost_lease_aborts_the_delegated_call_in_flight(reactor, http_client):
    server = _HangingServer()
    port = reactor.listenTCP(0, server, interface="127.0.0.1")
    try:
        conduit = ConduitClient(
            http_client, reactor, f"http://127.0.0.1:{port.getHost().port}", "token"
        )
        registry = Registry()
        registry.set_fallback(ConduitDelegate(conduit))
        queue = FakeQueue()
        queue.waiting = [make_task(12, "SomeWorker", expires=int(reactor.seconds()) + 3)]
        queue.renew_answers = ["lost"]
        consumer, _ = make_consumer(queue, registry, reactor, poll_interval=0.01, heartbeat=1.0)
        consumer.start()
        try:
            request = await server.received.addTimeout(10, reactor)
            assert request.startswith(b"POST /api/worker.execute ")
            # The first heartbeat (1 s) answers "lost".
            await server.lost.addTimeout(10, reactor)
        finally:
            await Deferred.fromCoroutine(consumer.stop())
        assert queue.renewals and queue.attempts == []
        assert consumer.counters.unreported == 1
    finally:
        await port.stopListening()
