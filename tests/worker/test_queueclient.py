"""The taskqueue client: request shape, answer validation, failure
descriptions, bounded calls."""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st
from treq.testing import RequestTraversalAgent
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from gorge.worker.queueclient import (
    QueueClient,
    QueueEndpoint,
    QueueError,
    lease_owner,
    truncate_host,
    validate_lease_answer,
)


class ScriptedQueue(Resource):
    isLeaf = True

    def __init__(self, status=200, body=b'{"data":[]}', headers=None, hang=False):
        super().__init__()
        self.status, self.body, self.hang = status, body, hang
        self.extra = headers or {}
        self.requests = []

    def render(self, request):
        self.requests.append(
            {
                "method": request.method,
                "path": request.path,
                "headers": {k.lower(): v[0] for k, v in request.requestHeaders.getAllRawHeaders()},
                "body": request.content.read(),
            }
        )
        if self.hang:
            return NOT_DONE_YET
        request.setResponseCode(self.status)
        for name, value in self.extra.items():
            request.setHeader(name, value)
        return self.body


def client_for(resource, token="queue-token", clock=None):
    clock = clock or Clock()
    stub = RequestTraversalAgent(resource)
    return (
        QueueClient(
            stub, clock, QueueEndpoint("http://queue:8090", token), "host:1:2:gorge-worker"
        ),
        stub,
        clock,
    )


def result_of(coro):
    d = Deferred.fromCoroutine(coro)
    results = []
    d.addBoth(results.append)
    return results[0] if results else None


def test_lease_request_shape():
    resource = ScriptedQueue(
        body=json.dumps({"data": [{"id": 3, "taskClass": "A", "data": "{}"}]}).encode()
    )
    client, _, _ = client_for(resource)
    tasks = result_of(client.lease(2, ["B", "A"]))
    # Each task says the owner this lease call leased it as.
    owner = "host:1:2:gorge-worker:1"
    assert tasks == [{"id": 3, "taskClass": "A", "data": "{}", "leaseOwner": owner}]
    (req,) = resource.requests
    assert (req["method"], req["path"]) == (b"POST", b"/api/queue/lease")
    assert req["headers"][b"content-type"] == b"application/json"
    assert req["headers"][b"accept"] == b"application/json"
    assert req["headers"][b"x-service-token"] == b"queue-token"
    assert req["headers"][b"x-lease-owner"] == owner.encode()
    assert json.loads(req["body"]) == {"limit": 2, "taskClasses": ["A", "B"]}


def test_no_token_no_header_and_classes_omitted_when_all():
    resource = ScriptedQueue()
    client, _, _ = client_for(resource, token="")
    assert result_of(client.lease(4, None)) == []
    (req,) = resource.requests
    assert b"x-service-token" not in req["headers"]
    assert json.loads(req["body"]) == {"limit": 4}


def test_report_bodies():
    resource = ScriptedQueue(body=b'{"data":{"status":"ok"}}')
    client, _, _ = client_for(resource)
    result_of(client.complete(5, 1234, timeout=10))
    result_of(client.fail(6, True, timeout=10))
    result_of(client.fail(7, False, retry_wait=60, message="m" * 2000, timeout=10))
    result_of(client.yield_task(8, 2, timeout=10))
    bodies = [(r["path"], json.loads(r["body"])) for r in resource.requests]
    # Every report names an owner, so a fencing queue refuses a stale one:
    # the worker's name when the lease's own is not given.
    assert all(b"x-lease-owner" not in r["headers"] for r in resource.requests)
    me = "host:1:2:gorge-worker"
    assert bodies == [
        (b"/api/queue/complete", {"taskID": 5, "duration": 1234, "leaseOwner": me}),
        (b"/api/queue/fail", {"taskID": 6, "permanent": True, "leaseOwner": me}),
        (
            b"/api/queue/fail",
            {
                "taskID": 7,
                "permanent": False,
                "retryWait": 60,
                "message": "m" * 1000,
                "leaseOwner": me,
            },
        ),
        (b"/api/queue/yield", {"taskID": 8, "duration": 5, "leaseOwner": me}),
    ]


def test_each_lease_call_has_an_owner_of_its_own_that_its_report_names():
    resource = ScriptedQueue(body=json.dumps({"data": [{"id": 3, "taskClass": "A"}]}).encode())
    client, _, _ = client_for(resource)
    first = result_of(client.lease(1, None))[0]["leaseOwner"]
    second = result_of(client.lease(1, None))[0]["leaseOwner"]
    assert first != second and first.startswith("host:1:2:gorge-worker:")
    resource.body = b'{"data":{"status":"ok"}}'
    result_of(client.yield_task(3, 5, timeout=10, owner=second))
    assert json.loads(resource.requests[-1]["body"])["leaseOwner"] == second


def test_a_complete_carries_its_followups_and_a_plain_one_no_key():
    resource = ScriptedQueue(body=b'{"data":{"id":5,"taskClass":"A"}}')
    client, _, _ = client_for(resource)
    followups = (
        MappingProxyType({"taskClass": "Child", "data": '{"a":1}', "priority": None}),
        {"taskClass": "Later", "delayUntil": 1795950000, "objectPHID": "PHID-X"},
    )
    assert result_of(client.complete(5, 1234, followups=followups, timeout=10)) is None
    assert result_of(client.complete(6, 1, followups=(), timeout=10)) is None
    assert [(r["path"], json.loads(r["body"])) for r in resource.requests] == [
        (
            b"/api/queue/complete",
            {
                "taskID": 5,
                "duration": 1234,
                "followups": [
                    {"taskClass": "Child", "data": '{"a":1}', "priority": None},
                    {"taskClass": "Later", "delayUntil": 1795950000, "objectPHID": "PHID-X"},
                ],
                "leaseOwner": "host:1:2:gorge-worker",
            },
        ),
        # An older queue never sees the key for a plain complete.
        (
            b"/api/queue/complete",
            {"taskID": 6, "duration": 1, "leaseOwner": "host:1:2:gorge-worker"},
        ),
    ]


def test_a_refused_followup_list_fails_the_complete_for_good():
    refusal = (
        b'{"error":{"code":"ERR_BAD_REQUEST","message":"followups[0]: taskClass is required"}}'
    )
    client, _, _ = client_for(ScriptedQueue(status=400, body=refusal))
    failure = result_of(client.complete(5, 1, followups=[{"data": "{}"}], timeout=10))
    assert failure.check(QueueError)
    assert (failure.value.status, failure.value.code) == (400, "ERR_BAD_REQUEST")
    assert "followups[0]: taskClass is required" in str(failure.value)
    assert not failure.value.retryable


@pytest.mark.parametrize(
    "status, body, fragment, retryable",
    [
        (200, b"<html>oops</html>", "unmarshal (status 200)", True),
        (
            500,
            b'{"error":{"code":"ERR_INTERNAL","message":"internal server error"}}',
            "api error [ERR_INTERNAL]: internal server error",
            True,
        ),
        (200, b'{"error":{"code":"ERR_X","message":"m"}}', "api error [ERR_X]: m", True),
        (
            404,
            b'{"error":{"code":"ERR_NOT_FOUND","message":"task not found"}}',
            "api error [ERR_NOT_FOUND]: task not found",
            False,
        ),
        (401, b'{"error":{"code":"ERR_UNAUTHORIZED","message":"x"}}', "ERR_UNAUTHORIZED", False),
        (
            409,
            b'{"error":{"code":"ERR_LEASE_CONFLICT","message":"task lease no longer belongs '
            b'to this owner"}}',
            "api error [ERR_LEASE_CONFLICT]",
            False,
        ),
        (429, b'{"error":{"code":"ERR_BAD_REQUEST","message":"slow"}}', "slow", True),
        (503, b'{"status":"unavailable"}', "unexpected status 503", True),
        (303, b'{"data":[]}', "unexpected status 303", True),
    ],
)
def test_failures_are_described_and_classified(status, body, fragment, retryable):
    resource = ScriptedQueue(status=status, body=body, headers={b"location": b"/elsewhere"})
    client, _, _ = client_for(resource)
    failure = result_of(client.complete(1, 0, timeout=10))
    assert failure.check(QueueError)
    assert fragment in str(failure.value)
    assert failure.value.retryable is retryable
    assert len(resource.requests) == 1  # a redirect is not followed
    lease_failure = result_of(client.lease(1, None))
    assert str(lease_failure.value).startswith("lease: ")


def test_a_hanging_queue_is_cut_at_the_timeout():
    resource = ScriptedQueue(hang=True)
    clock = Clock()
    client, stub, _ = client_for(resource, clock=clock)
    d = Deferred.fromCoroutine(client.complete(1, 0, timeout=2.5))
    stub.flush()
    assert not d.called
    clock.advance(2.5)
    failure = []
    d.addErrback(failure.append)
    assert failure and "http: POST /api/queue/complete: timed out after 2.5s" in str(
        failure[0].value
    )
    assert failure[0].value.retryable


def test_transport_error_is_an_http_error():
    class Broken:
        def request(self, *args, **kwargs):
            from twisted.internet.error import ConnectionRefusedError

            raise ConnectionRefusedError()

    client = QueueClient(Broken(), Clock(), QueueEndpoint("http://q"), "o")
    failure = result_of(client.lease(1, None))
    assert str(failure.value).startswith("lease: http: POST /api/queue/lease")


@pytest.mark.parametrize(
    "data",
    [
        {"x": 1},
        [{"id": 1, "taskClass": "A"}, {"id": 2, "taskClass": "A"}, {"id": 3, "taskClass": "A"}],
        [{"id": 0, "taskClass": "A"}],
        [{"id": True, "taskClass": "A"}],
        [{"id": "1", "taskClass": "A"}],
        [{"id": 1, "taskClass": ""}],
        [{"id": 1}],
        ["task"],
    ],
)
def test_malformed_lease_answers_are_rejected_whole(data):
    with pytest.raises(QueueError, match="^lease: "):
        validate_lease_answer(data, 2)


def test_null_lease_data_is_empty():
    assert validate_lease_answer(None, 3) == []


@given(st.text(min_size=0, max_size=80))
def test_owner_host_fits_24_bytes_on_a_character_boundary(host):
    cut = truncate_host(host)
    assert len(cut.encode("utf-8")) <= 24
    if len(host.encode("utf-8")) <= 24:
        assert cut == host
    else:
        assert cut.endswith("...") and host.startswith(cut[:-3])
    owner = lease_owner(host, 4_194_304, 1_795_946_970)
    # Room for a lease call's sequence number (7 digits) within the column's 64.
    assert len(owner) <= 64 - 8 and owner.endswith(":4194304:1795946970:gorge-worker")


def test_deeply_nested_answer_is_an_unmarshal_error():
    resource = ScriptedQueue(body=b"[" * 100_000)
    client, _, _ = client_for(resource)
    failure = result_of(client.complete(1, 0, timeout=10))
    assert failure.check(QueueError)
    assert "unmarshal (status 200)" in str(failure.value)
    assert failure.value.retryable


@pytest.mark.parametrize("status", [400, 404])
def test_a_4xx_without_a_json_envelope_is_retried(status):
    resource = ScriptedQueue(status=status, body=b"<html>Not Found</html>")
    client, _, _ = client_for(resource)
    failure = result_of(client.complete(1, 0, timeout=10))
    assert failure.check(QueueError)
    assert f"unmarshal (status {status})" in str(failure.value)
    assert failure.value.retryable


def _agent_client(resource, clock=None):
    """The client over an in-memory Agent."""
    from treq.testing import RequestTraversalAgent

    clock = clock or Clock()
    agent = RequestTraversalAgent(resource)
    client = QueueClient(
        agent, clock, QueueEndpoint("http://queue:8090", "queue-token"), "host:1:2:gorge-worker"
    )
    return client, agent, clock


def test_agent_path_sends_the_same_request_and_reads_the_answer():
    resource = ScriptedQueue(
        body=json.dumps({"data": [{"id": 3, "taskClass": "A", "data": "{}"}]}).encode()
    )
    client, agent, _ = _agent_client(resource)
    d = Deferred.fromCoroutine(client.lease(2, ["B", "A"], wait=5))
    agent.flush()
    owner = "host:1:2:gorge-worker:1"
    assert result_of_deferred(d) == [{"id": 3, "taskClass": "A", "data": "{}", "leaseOwner": owner}]
    (req,) = resource.requests
    assert (req["method"], req["path"]) == (b"POST", b"/api/queue/lease")
    assert req["headers"][b"content-type"] == b"application/json"
    assert req["headers"][b"x-service-token"] == b"queue-token"
    assert req["headers"][b"x-lease-owner"] == owner.encode()
    assert json.loads(req["body"]) == {"limit": 2, "taskClasses": ["A", "B"], "wait": 5}


def test_agent_path_errors_and_timeouts_are_queue_errors():
    refused = ScriptedQueue(
        status=409, body=b'{"error":{"code":"ERR_LEASE_CONFLICT","message":"gone"}}'
    )
    client, agent, _ = _agent_client(refused)
    d = Deferred.fromCoroutine(client.complete(4, 10, timeout=5))
    agent.flush()
    failure = result_of_deferred(d)
    assert (failure.value.status, failure.value.code) == (409, "ERR_LEASE_CONFLICT")
    client, agent, clock = _agent_client(ScriptedQueue(hang=True))
    d = Deferred.fromCoroutine(client.complete(4, 10, timeout=5))
    agent.flush()
    clock.advance(5)
    failure = result_of_deferred(d)
    assert str(failure.value) == "http: POST /api/queue/complete: timed out after 5s"


def result_of_deferred(d):
    results = []
    d.addBoth(results.append)
    return results[0] if results else None


def test_an_answer_over_the_cap_is_an_http_error():
    from gorge.worker import queueclient

    resource = ScriptedQueue(body=b'{"data":"' + b"x" * queueclient.ANSWER_LIMIT + b'"}')
    client, _, _ = client_for(resource)
    failure = result_of(client.complete(1, 0, timeout=10))
    assert failure.check(QueueError)
    assert str(failure.value) == (
        "http: POST /api/queue/complete: response body over the limit of 1048576 bytes"
    )
    assert failure.value.retryable


def test_a_lease_answer_has_its_own_larger_cap(monkeypatch):
    from gorge.worker import queueclient

    monkeypatch.setattr(queueclient, "LEASE_ANSWER_LIMIT", 2 * queueclient.ANSWER_LIMIT)
    task = {"id": 3, "taskClass": "A", "data": "x" * queueclient.ANSWER_LIMIT}
    client, _, _ = client_for(ScriptedQueue(body=json.dumps({"data": [task]}).encode()))
    assert result_of(client.lease(1, None)) == [{**task, "leaseOwner": "host:1:2:gorge-worker:1"}]
    task["data"] += "x" * queueclient.ANSWER_LIMIT
    client, _, _ = client_for(ScriptedQueue(body=json.dumps({"data": [task]}).encode()))
    failure = result_of(client.lease(1, None))
    assert str(failure.value).startswith(
        "lease: http: POST /api/queue/lease: response body over the limit of"
    )
