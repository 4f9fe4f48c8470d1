"""Batched result reports on the worker side (docs/worker.md, Batched reports):
reports that finish close together go out as one call, each keeps its own
answer, and an older queue gets single calls."""

from __future__ import annotations

import json

from treq.testing import RequestTraversalAgent
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.web.resource import Resource

from gorge.worker.queueclient import QueueClient, QueueEndpoint, QueueError

from .fakes import CapturedEvents

OWNER = "host:1:2:gorge-worker"


class ReportingQueue(Resource):
    """Answers ``/api/queue/report`` per entry (refusing the ids in
    ``refuse``) or, when ``batch_route`` is off, 404 as an older queue does;
    single report routes answer ``{"status":"ok"}``."""

    isLeaf = True

    def __init__(self, *, batch_route=True, refuse=None, status=200, answer=None):
        super().__init__()
        self.batch_route = batch_route
        self.refuse = refuse or {}
        self.status = status
        self.answer = answer
        self.requests: list[tuple[bytes, dict, bytes]] = []

    def render(self, request):
        body = json.loads(request.content.read())
        owner = request.getHeader(b"x-lease-owner")
        self.requests.append((request.path, body, owner))
        request.setHeader(b"content-type", b"application/json")
        if request.path == b"/api/queue/report":
            if not self.batch_route:
                request.setResponseCode(404)
                return b'{"error":{"code":"ERR_NOT_FOUND","message":"Not Found"}}'
            request.setResponseCode(self.status)
            if self.status != 200:
                return b'{"error":{"code":"ERR_INTERNAL","message":"internal server error"}}'
            if self.answer is not None:
                return json.dumps({"data": self.answer}).encode()
            data = []
            for entry in body["reports"]:
                refusal = self.refuse.get(entry["taskID"])
                if refusal is None:
                    data.append({"taskID": entry["taskID"], "status": "reported"})
                else:
                    data.append(
                        {
                            "taskID": entry["taskID"],
                            "status": "refused",
                            "code": refusal,
                            "message": "no",
                        }
                    )
            return json.dumps({"data": data}).encode()
        return b'{"data":{"status":"ok"}}'

    def paths(self) -> list[bytes]:
        return [path for path, _, _ in self.requests]


def _client(resource, clock, *, batch=100, delay=0.002):
    stub = RequestTraversalAgent(resource)
    client = QueueClient(
        stub,
        clock,
        QueueEndpoint("http://queue:8090", "t"),
        OWNER,
        report_batch=batch,
        report_delay=delay,
    )
    return client, stub


def _outcomes(ds: list[Deferred]) -> list:
    out = []
    for d in ds:
        results: list = []
        d.addBoth(results.append)
        out.append(results[0] if results else "pending")
    return out


def test_reports_within_the_delay_go_out_as_one_call():
    clock, queue = Clock(), ReportingQueue()
    client, stub = _client(queue, clock)
    ds = [
        Deferred.fromCoroutine(client.complete(1, 1500, timeout=30)),
        Deferred.fromCoroutine(client.fail(2, False, retry_wait=60, message="m", timeout=30)),
        Deferred.fromCoroutine(client.yield_task(3, 2, timeout=30)),
        Deferred.fromCoroutine(client.fail(4, True, timeout=30)),
    ]
    stub.flush()
    assert queue.requests == []
    clock.advance(0.002)
    stub.flush()
    assert queue.requests == [
        (
            b"/api/queue/report",
            {
                "reports": [
                    {"taskID": 1, "duration": 1500, "outcome": "complete"},
                    {
                        "taskID": 2,
                        "permanent": False,
                        "retryWait": 60,
                        "message": "m",
                        "outcome": "fail",
                    },
                    {"taskID": 3, "duration": 5, "outcome": "yield"},
                    {"taskID": 4, "permanent": True, "outcome": "fail"},
                ]
            },
            OWNER.encode(),
        )
    ]
    assert _outcomes(ds) == [None] * 4
    assert client.batching_reports


def test_a_full_batch_goes_at_once_and_the_rest_after_the_delay():
    clock, queue = Clock(), ReportingQueue()
    client, stub = _client(queue, clock, batch=2)
    ds = [Deferred.fromCoroutine(client.complete(i, 1, timeout=30)) for i in range(1, 6)]
    stub.flush()
    assert [len(body["reports"]) for _, body, _ in queue.requests] == [2, 2]
    clock.advance(0.002)
    stub.flush()
    assert [len(body["reports"]) for _, body, _ in queue.requests] == [2, 2, 1]
    assert _outcomes(ds) == [None] * 5


def test_each_report_gets_its_own_answer():
    clock = Clock()
    queue = ReportingQueue(refuse={2: "ERR_LEASE_CONFLICT", 3: "ERR_NOT_FOUND"})
    client, stub = _client(queue, clock)
    ds = [Deferred.fromCoroutine(client.complete(i, 1, timeout=30)) for i in (1, 2, 3)]
    clock.advance(0.002)
    stub.flush()
    ok, conflict, missing = _outcomes(ds)
    assert ok is None
    assert (conflict.value.status, conflict.value.code) == (409, "ERR_LEASE_CONFLICT")
    assert not conflict.value.retryable
    assert (missing.value.status, missing.value.code) == (404, "ERR_NOT_FOUND")
    assert str(missing.value) == "api error [ERR_NOT_FOUND]: no"


def test_a_failed_batch_fails_every_report_retryably():
    clock, queue = Clock(), ReportingQueue(status=500)
    client, stub = _client(queue, clock)
    ds = [Deferred.fromCoroutine(client.complete(i, 1, timeout=30)) for i in (1, 2)]
    clock.advance(0.002)
    stub.flush()
    for failure in _outcomes(ds):
        assert failure.check(QueueError) and failure.value.retryable
        assert failure.value.status == 500


def test_an_answer_that_does_not_match_the_reports_fails_them_retryably():
    clock = Clock()
    queue = ReportingQueue(answer=[{"taskID": 1, "status": "reported"}])
    client, stub = _client(queue, clock)
    ds = [Deferred.fromCoroutine(client.complete(i, 1, timeout=30)) for i in (1, 2)]
    clock.advance(0.002)
    stub.flush()
    for failure in _outcomes(ds):
        assert failure.value.transient and failure.value.retryable


def test_an_older_queue_gets_single_calls_from_then_on():
    clock, queue = Clock(), ReportingQueue(batch_route=False)
    client, stub = _client(queue, clock)
    with CapturedEvents() as events:
        ds = [
            Deferred.fromCoroutine(client.complete(1, 7, timeout=30)),
            Deferred.fromCoroutine(client.yield_task(2, 9, timeout=30)),
        ]
        clock.advance(0.002)
        stub.flush()
        assert _outcomes(ds) == [None, None]
        later = Deferred.fromCoroutine(client.fail(3, True, timeout=30))
        stub.flush()
        assert _outcomes([later]) == [None]
    assert queue.requests == [
        (
            b"/api/queue/report",
            {
                "reports": [
                    {"taskID": 1, "duration": 7, "outcome": "complete"},
                    {"taskID": 2, "duration": 9, "outcome": "yield"},
                ]
            },
            OWNER.encode(),
        ),
        (b"/api/queue/complete", {"taskID": 1, "duration": 7}, OWNER.encode()),
        (b"/api/queue/yield", {"taskID": 2, "duration": 9}, OWNER.encode()),
        (b"/api/queue/fail", {"taskID": 3, "permanent": True}, OWNER.encode()),
    ]
    assert not client.batching_reports
    assert len(events.named("REPORT_BATCHING_DISABLED")) == 1


def test_a_report_cancelled_before_it_is_sent_is_not_sent():
    clock, queue = Clock(), ReportingQueue()
    client, stub = _client(queue, clock)
    gone = Deferred.fromCoroutine(client.complete(1, 1, timeout=30))
    kept = Deferred.fromCoroutine(client.complete(2, 1, timeout=30))
    gone.addErrback(lambda _: None)
    gone.cancel()
    clock.advance(0.002)
    stub.flush()
    assert [entry["taskID"] for _, body, _ in queue.requests for entry in body["reports"]] == [2]
    assert _outcomes([kept]) == [None]


def test_batch_of_one_sends_single_calls_at_once():
    clock, queue = Clock(), ReportingQueue()
    client, stub = _client(queue, clock, batch=1)
    d = Deferred.fromCoroutine(client.complete(1, 3, timeout=30))
    stub.flush()
    assert queue.paths() == [b"/api/queue/complete"]
    assert _outcomes([d]) == [None]
    assert not client.batching_reports
