"""Bad input from outside: a queue that answers 500 or hangs, task data that
is not JSON, a class that is not a PHP class name. Each gives a clear log line
with the task id, the right report (or none), and the loop keeps going."""

from __future__ import annotations

import json

from treq.testing import RequestTraversalAgent
from twisted.internet.task import Clock
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from gorge.worker.handlers.conduit import ConduitDelegate
from gorge.worker.handlers.feed_http import FeedHttpHandler
from gorge.worker.handlers.test_worker import TestWorker
from gorge.worker.queueclient import QueueClient, QueueEndpoint
from gorge.worker.registry import Registry
from tests.worker.fakes import CapturedEvents, FakeQueue, make_consumer, make_task


class Queue(Resource):
    """Leases the given tasks once, then nothing; reports hang or fail."""

    isLeaf = True

    def __init__(self, tasks, report_mode):
        super().__init__()
        self.tasks, self.report_mode = tasks, report_mode
        self.paths = []

    def render(self, request):
        self.paths.append(request.path)
        if request.path == b"/api/queue/lease":
            batch, self.tasks = self.tasks, []
            return json.dumps({"data": batch}).encode()
        if self.report_mode == "hang":
            return NOT_DONE_YET
        request.setResponseCode(500)
        return b'{"error":{"code":"ERR_INTERNAL","message":"internal server error"}}'


def run_against(resource, clock, registry, seconds):
    stub = RequestTraversalAgent(resource)
    client = QueueClient(stub, clock, QueueEndpoint("http://queue"), "o")
    consumer, _ = make_consumer(client, registry, clock)
    consumer.start()
    for _ in range(int(seconds * 10)):
        clock.advance(0.1)
        stub.flush()
    return consumer


def test_hanging_queue_on_report_is_bounded_and_the_loop_goes_on():
    clock = Clock()
    registry = Registry()
    registry.register("NoopWorker", lambda task, data: None)
    resource = Queue([make_task(21, expires=600)], "hang")
    with CapturedEvents() as captured:
        consumer = run_against(resource, clock, registry, 200)
        (line,) = captured.named("WORKER_TASK_UNREPORTED")
        assert captured.failures() == []
    assert line["task_id"] == 21 and "timed out after 30s" in line["error"]
    assert resource.paths.count(b"/api/queue/complete") == 5
    assert consumer.active == 0
    assert resource.paths[-1] == b"/api/queue/lease"  # still leasing


def test_queue_answering_500_on_report_leaves_the_lease():
    clock = Clock()
    registry = Registry()
    registry.register("NoopWorker", lambda task, data: None)
    resource = Queue([make_task(22, expires=600)], "500")
    with CapturedEvents() as captured:
        consumer = run_against(resource, clock, registry, 10)
        (line,) = captured.named("WORKER_TASK_UNREPORTED")
    assert line["task_id"] == 22 and "api error [ERR_INTERNAL]" in line["error"]
    assert resource.paths.count(b"/api/queue/complete") == 5
    assert consumer.counters.unreported == 1 and consumer.counters.processed == 0


def test_hanging_lease_times_out_and_polling_resumes():
    clock = Clock()
    registry = Registry()
    registry.register("NoopWorker", lambda task, data: None)
    resource_client = RequestTraversalAgent(_HangOnce())
    client = QueueClient(resource_client, clock, QueueEndpoint("http://queue"), "o")
    consumer, _ = make_consumer(client, registry, clock)
    consumer.start()
    clock.advance(1.0)
    resource_client.flush()
    clock.advance(30)
    assert consumer.readiness_reason().startswith("taskqueue: lease: http: POST /api/queue/lease")
    clock.advance(1.0)
    resource_client.flush()
    assert consumer.readiness_reason() is None


class _HangOnce(Resource):
    isLeaf = True

    def __init__(self):
        super().__init__()
        self.calls = 0

    def render(self, request):
        self.calls += 1
        if self.calls == 1:
            return NOT_DONE_YET
        return b'{"data":[]}'


def test_bad_task_data_and_class_names_fail_permanently_with_the_task_id():
    clock, queue = Clock(), FakeQueue()
    registry = Registry()
    registry.register("FeedPublisherHTTPWorker", FeedHttpHandler(object(), clock))
    registry.register("PhabricatorTestWorker", TestWorker(clock))
    registry.set_fallback(ConduitDelegate(client=object()))
    queue.waiting = [
        make_task(31, "FeedPublisherHTTPWorker", data="{not json"),
        make_task(32, "PhabricatorTestWorker", data="<xml/>"),
        make_task(33, "Bad-Class", data="{}"),
        make_task(34, "PhabricatorTestWorker", data="{}"),
    ]
    consumer, _ = make_consumer(queue, registry, clock)
    with CapturedEvents() as captured:
        consumer.start()
        clock.advance(1.0)
        lines = {e["task_id"]: e["message"] for e in captured.named("WORKER_TASK_OUTCOME")}
        assert captured.failures() == []
    reports = {r.task_id: (r.kind, r.args.get("permanent")) for r in queue.reports}
    assert reports == {
        31: ("fail", True),
        32: ("fail", True),
        33: ("fail", True),
        34: ("complete", None),
    }
    assert "invalid task data" in lines[31] and "invalid task data" in lines[32]
    assert lines[33] == "invalid task class"
