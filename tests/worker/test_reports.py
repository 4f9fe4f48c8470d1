"""Batched result reports on the worker side (docs/worker.md, Batched reports):
reports that finish close together go out as one call, each keeps its own
answer, and an older queue gets single calls."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from treq.testing import RequestTraversalAgent
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.web.resource import Resource

from gorge.worker.queueclient import QueueClient, QueueEndpoint, QueueError
from gorge.worker.reports import FOLLOWUP_BATCH_BYTES, ReportBatcher
from tests.worker.fakes import CapturedEvents

OWNER = "host:1:2:gorge-worker"


class ReportingQueue(Resource):
    """Answers ``/api/queue/report`` per entry (refusing the ids in
    ``refuse``) or, when ``batch_route`` is off, 404 as an older queue does;
    single report routes answer ``{"status":"ok"}``."""

    isLeaf = True

    def __init__(self, *, batch_route=True, refuse=None, status=200, answer=None, body_limit=None):
        super().__init__()
        self.batch_route = batch_route
        self.refuse = refuse or {}
        self.status = status
        self.answer = answer
        self.body_limit = body_limit
        self.requests: list[tuple[bytes, dict, bytes]] = []

    def render(self, request):
        raw = request.content.read()
        body = json.loads(raw)
        # The owner each call is fenced by, wherever it says it (header, body
        # or the entries, which must then agree), recorded apart.
        owners = {body.pop("leaseOwner", None)} | {
            entry.pop("leaseOwner", None) for entry in body.get("reports", [])
        }
        owners.discard(None)
        assert len(owners) <= 1
        owner = request.getHeader(b"x-lease-owner") or (owners.pop().encode() if owners else None)
        self.requests.append((request.path, body, owner))
        request.setHeader(b"content-type", b"application/json")
        if self.body_limit is not None and len(raw) > self.body_limit:
            request.setResponseCode(413)
            return b'{"error":{"code":"ERR_TOO_LARGE","message":"Request Entity Too Large"}}'

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


def _client(resource, clock, *, batch=100, delay=0.002, report_bytes=FOLLOWUP_BATCH_BYTES):
    stub = RequestTraversalAgent(resource)
    client = QueueClient(
        stub,
        clock,
        QueueEndpoint("http://queue:8090", "t"),
        OWNER,
        report_batch=batch,
        report_delay=delay,
        report_bytes=report_bytes,
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
    assert len(events.named("WORKER_REPORT_BATCHING_DISABLED")) == 1


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


# -- follow-ups ----------------------------------------------------------------


def _followups(n: int, data_bytes: int = 10) -> list[dict]:
    return [{"taskClass": f"Child{i}", "data": "x" * data_bytes} for i in range(n)]


def _size(followups) -> int:
    return len(json.dumps(followups, separators=(",", ":")))


def test_a_batched_complete_carries_its_followups():
    clock, queue = Clock(), ReportingQueue()
    client, stub = _client(queue, clock)
    children = _followups(2)
    ds = [
        Deferred.fromCoroutine(client.complete(1, 10, followups=children, timeout=30)),
        Deferred.fromCoroutine(client.complete(2, 20, timeout=30)),
    ]
    clock.advance(0.002)
    stub.flush()
    assert queue.requests == [
        (
            b"/api/queue/report",
            {
                "reports": [
                    {"taskID": 1, "duration": 10, "followups": children, "outcome": "complete"},
                    {"taskID": 2, "duration": 20, "outcome": "complete"},
                ]
            },
            OWNER.encode(),
        )
    ]
    assert _outcomes(ds) == [None, None]


def test_followups_beyond_the_byte_budget_go_in_a_batch_of_their_own():
    clock, queue = Clock(), ReportingQueue()
    small, large = _followups(1), _followups(3, data_bytes=100)
    budget = _size(small) * 2 + 1
    assert _size(large) > budget
    client, stub = _client(queue, clock, report_bytes=budget)
    ds = [
        Deferred.fromCoroutine(client.complete(1, 1, followups=small, timeout=30)),
        Deferred.fromCoroutine(client.complete(2, 1, timeout=30)),
        Deferred.fromCoroutine(client.complete(3, 1, followups=small, timeout=30)),
    ]
    stub.flush()
    assert queue.requests == []  # two small lists stay below the budget: they wait
    # Over the budget: what is pending goes at once, without the delay, the
    # large list alone.
    ds.append(Deferred.fromCoroutine(client.complete(4, 1, followups=large, timeout=30)))
    stub.flush()
    assert [[e["taskID"] for e in body["reports"]] for _, body, _ in queue.requests] == [
        [1, 2, 3],
        [4],
    ]
    assert _outcomes(ds) == [None] * 4


def test_a_batch_the_queue_finds_too_large_is_sent_again_report_by_report():
    clock = Clock()
    one = _followups(2, data_bytes=300)
    # Room for one report with these follow-ups, not for two.
    queue = ReportingQueue(body_limit=_size(one) + 200)
    client, stub = _client(queue, clock)
    ds = [Deferred.fromCoroutine(client.complete(i, 1, followups=one, timeout=30)) for i in (1, 2)]
    clock.advance(0.002)
    stub.flush()
    assert queue.paths() == [
        b"/api/queue/report",
        b"/api/queue/complete",
        b"/api/queue/complete",
    ]
    assert [body["followups"] for _, body, _ in queue.requests[1:]] == [one, one]
    assert _outcomes(ds) == [None, None]
    assert client.batching_reports  # a size problem, not an older queue


def test_a_single_report_too_large_for_the_queue_fails_as_its_call_would():
    clock = Clock()
    queue = ReportingQueue(body_limit=100)
    client, stub = _client(queue, clock)
    d = Deferred.fromCoroutine(
        client.complete(1, 1, followups=_followups(5, data_bytes=100), timeout=30)
    )
    clock.advance(0.002)
    stub.flush()
    (failure,) = _outcomes([d])
    assert (failure.value.status, failure.value.code) == (413, "ERR_TOO_LARGE")
    assert queue.paths() == [b"/api/queue/report"]


@settings(deadline=None)
@given(
    sizes=st.lists(st.sampled_from([0, 0, 1, 5, 40, 120]), min_size=1, max_size=30),
    max_size=st.integers(2, 6),  # 1 turns batching off
    max_bytes=st.integers(1, 100),
)
def test_batches_keep_order_count_and_byte_budget(sizes, max_size, max_bytes):
    """Whatever the reports, each is sent once and in order; a batch holds at
    most max_size of them and at most max_bytes of follow-ups, unless it is a
    single report whose own follow-ups are larger."""
    clock = Clock()
    batches: list[list[dict]] = []

    async def post(entries, timeout):
        batches.append(entries)
        return [{"taskID": e["taskID"], "status": "reported"} for e in entries]

    async def single(timeout):
        raise AssertionError("no single call expected")

    batcher = ReportBatcher(post, clock, max_size=max_size, delay=0.002, max_bytes=max_bytes)
    done = []
    for task_id, size in enumerate(sizes, start=1):
        entry = {"taskID": task_id, "outcome": "complete"}
        if size:
            entry["followups"] = [{"taskClass": "C", "data": "x" * size}]
        batcher.submit(entry, 30, single).addBoth(done.append)
    clock.advance(0.002)

    assert done == [None] * len(sizes)
    assert [e["taskID"] for batch in batches for e in batch] == list(range(1, len(sizes) + 1))
    for batch in batches:
        assert len(batch) <= max_size
        carried = sum(_size(e["followups"]) for e in batch if "followups" in e)
        assert carried <= max_bytes or len(batch) == 1
