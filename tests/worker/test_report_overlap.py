"""A finished task's report does not hold its slot (docs/worker.md, How work
flows): the next lease and run overlap it, with a bound on reports waiting."""

from __future__ import annotations

from twisted.internet.task import Clock

from gorge.worker.registry import Registry
from tests.worker.fakes import FakeQueue, make_consumer, make_task


def test_reports_in_flight_do_not_hold_slots_but_are_bounded():
    clock, queue = Clock(), FakeQueue()
    queue.waiting = [make_task(i) for i in range(1, 11)]
    queue.report_errors = ["hang"] * 10  # the queue never answers a report
    ran: list[int] = []
    registry = Registry()
    registry.register("NoopWorker", lambda task, data: ran.append(task["id"]))
    consumer, _ = make_consumer(
        queue, registry, clock, lease_limit=2, max_workers=2, poll_interval=1.0
    )
    consumer.start()
    clock.advance(1.0)
    clock.pump([0.0] * 5)
    # Two slots: the first batch ran, its reports hang, a second batch ran too;
    # then four reports wait and nothing more is leased.
    assert ran == [1, 2, 3, 4]
    assert [r.task_id for r in queue.attempts] == [1, 2, 3, 4]
    assert [limit for limit, _ in queue.leases] == [2, 2]
    assert consumer.active == 0
    clock.pump([1.0] * 5)
    assert ran == [1, 2, 3, 4] and len(queue.leases) == 2
