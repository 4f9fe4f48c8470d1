"""HTTP providers behind the whole service: POST /api/mailer/send through the
real Site, dispatcher and backend, with the provider's TCP connection held
in a MemoryReactorClock (answers for provider outcomes)."""

from __future__ import annotations

import json

from twisted.internet import defer
from twisted.internet.testing import MemoryReactorClock

from tests.mailer.conftest import make_harness
from tests.mailer.test_providers_support import response, split_request
from tests.support.memoryhttp import TcpStringTransport

TOKEN = "contract-token"


def harness_for(*mailers: dict, retries: str = "0"):
    reactor = MemoryReactorClock()
    env = {
        "GORGE_SERVICE_TOKEN": TOKEN,
        "GORGE_MAILER_MAX_RETRIES": retries,
        "GORGE_MAILER_RETRY_WAIT": "1",
        "GORGE_MAILER_CONFIG": json.dumps(list(mailers)),
    }
    return make_harness(env, clock=reactor), reactor


def postmark(key: str = "pm", priority: int = 10, port: int = 8025) -> dict:
    return {
        "key": key,
        "type": "postmark",
        "priority": priority,
        "options": {"access-token": "tok", "endpoint": f"http://127.0.0.1:{port}"},
    }


def connect(reactor: MemoryReactorClock, index: int = -1):
    factory = reactor.tcpClients[index][2]
    protocol = factory.buildProtocol(None)
    transport = TcpStringTransport()
    protocol.makeConnection(transport)
    return protocol, transport


def settle(h, d: defer.Deferred, rounds: int = 5):
    for _ in range(rounds):
        if d.called:
            break
        h.client.flush()
    assert d.called, "no HTTP answer"
    return d.result


def test_accepted_send_reports_key_and_message_id():
    h, reactor = harness_for(postmark())
    d = defer.Deferred.fromCoroutine(h.send())
    protocol, transport = connect(reactor)
    line, headers, body = split_request(transport.value())
    assert line == "POST /email HTTP/1.1" and headers["x-postmark-server-token"] == "tok"
    assert json.loads(body)["To"] == "Alice <alice@example.com>"
    protocol.dataReceived(response(200, b'{"ErrorCode":0,"MessageID":"pm-1","Message":"OK"}'))
    status, doc = settle(h, d)
    assert (status, doc) == (200, {"data": {"mailerKey": "pm", "messageId": "pm-1"}})


def test_inactive_recipient_is_a_permanent_failure():
    h, reactor = harness_for(postmark())
    d = defer.Deferred.fromCoroutine(h.send())
    protocol, _ = connect(reactor)
    protocol.dataReceived(response(422, b'{"ErrorCode":406,"Message":"inactive recipient"}'))
    status, doc = settle(h, d)
    assert status == 422 and doc["error"]["code"] == "ERR_PERMANENT_FAILURE"
    assert "tok" not in doc["error"]["message"]


def test_deadline_after_submission_is_outcome_unknown_and_no_failover():
    h, reactor = harness_for(postmark("first", 20, 8025), postmark("second", 10, 8026))
    d = defer.Deferred.fromCoroutine(h.send())
    connect(reactor)
    reactor.advance(20)  # the provider's whole-request cap
    status, doc = settle(h, d)
    assert status == 502 and doc["error"]["code"] == "ERR_OUTCOME_UNKNOWN"
    assert len(reactor.tcpClients) == 1


def test_revoked_credentials_fail_over_to_the_next_provider():
    h, reactor = harness_for(postmark("first", 20, 8025), postmark("second", 10, 8026))
    d = defer.Deferred.fromCoroutine(h.send())
    assert [c[1] for c in reactor.tcpClients] == [8025]
    protocol, _ = connect(reactor)
    protocol.dataReceived(response(401, b'{"ErrorCode":10,"Message":"bad token"}'))
    # Backend-scoped: no retry on "first", straight to "second".
    assert [c[1] for c in reactor.tcpClients] == [8025, 8026]
    protocol, _ = connect(reactor)
    protocol.dataReceived(response(200, b'{"ErrorCode":0,"MessageID":"pm-2"}'))
    status, doc = settle(h, d)
    assert (status, doc) == (200, {"data": {"mailerKey": "second", "messageId": "pm-2"}})


def test_throttled_provider_is_retried_after_retry_after():
    h, reactor = harness_for(postmark(), retries="1")
    d = defer.Deferred.fromCoroutine(h.send())
    protocol, transport = connect(reactor)
    protocol.dataReceived(response(429, b"", {"Retry-After": "3"}))

    def posts() -> int:
        # The kept-alive connection carries the retry; a new one would too.
        return sum(t.value().count(b"POST /email ") for t in transports)

    transports = [transport]
    reactor.advance(2.9)
    assert posts() == 1  # waits max(retry wait 1 s, Retry-After 3 s)
    reactor.advance(0.2)  # past 3 s whatever the float rounding of the start time
    if len(reactor.tcpClients) > 1:
        protocol, transport = connect(reactor)
        transports.append(transport)
    assert posts() == 2
    protocol.dataReceived(response(200, b'{"ErrorCode":0,"MessageID":"pm-3"}'))
    status, doc = settle(h, d)
    assert status == 200 and doc["data"]["messageId"] == "pm-3"


def test_connection_never_established_is_send_failed():
    h, reactor = harness_for(postmark())
    d = defer.Deferred.fromCoroutine(h.send())
    reactor.advance(20)
    status, doc = settle(h, d)
    assert status == 502 and doc["error"]["code"] == "ERR_SEND_FAILED"
