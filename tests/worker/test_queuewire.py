"""The worker's queue calls on kept-alive connections, against a scripted
server on 127.0.0.1 (the real taskqueue is in test_e2e.py)."""

from __future__ import annotations

import pytest
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred

from gorge.client.failure import Cause, ExchangeCancelled, TransportFailure
from gorge.worker.queueclient import QueueClient, QueueEndpoint
from gorge.worker.queueerror import QueueError
from gorge.worker.queuewire import QueueWire


def _json(status: int, text: bytes) -> bytes:
    return b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status,
        len(text),
        text,
    )


def test_the_head_carries_the_base_path_the_headers_and_the_host():
    wire = QueueWire(reactor, "http://Queue.Local:8170/base/", connect_timeout=1, max_idle=2)
    head = wire.head("/api/queue/lease", {b"X-Lease-Owner": b"me", b"Accept": b"application/json"})
    assert head == (
        b"POST /base/api/queue/lease HTTP/1.1\r\nX-Lease-Owner: me\r\n"
        b"Accept: application/json\r\nHost: Queue.Local:8170\r\nContent-Length: "
    )
    assert b"Host: q.example\r\n" in QueueWire(
        reactor, "https://q.example", connect_timeout=1, max_idle=2
    ).head("/x", {})
    assert b"Host: [::1]:81\r\n" in QueueWire(
        reactor, "http://[::1]:81", connect_timeout=1, max_idle=2
    ).head("/x", {})


@pytest.mark.parametrize("url", ["ftp://q.example", "http://", "q.example:8170"])
def test_a_base_url_that_is_not_http_is_refused(url):
    with pytest.raises(ValueError):
        QueueWire(reactor, url, connect_timeout=1, max_idle=2)


def test_a_header_that_cannot_be_sent_is_refused():
    wire = QueueWire(reactor, "http://127.0.0.1:1", connect_timeout=1, max_idle=2)
    with pytest.raises(ValueError):
        wire.head("/x", {b"X-Bad": b"a\r\nInjected: 1"})


def _client(port: int, **kwargs) -> tuple[QueueClient, QueueWire]:
    wire = QueueWire(reactor, f"http://127.0.0.1:{port}", connect_timeout=5, max_idle=4)
    client = QueueClient(
        None,
        reactor,
        QueueEndpoint(f"http://127.0.0.1:{port}", "tok"),
        "owner",
        wire=wire,
        **kwargs,
    )
    return client, wire


async def test_calls_share_one_connection_and_say_who_leases(scripted):
    factory, port = scripted
    factory.answers += [
        (_json(200, b'{"data":[{"taskID":7,"status":"renewed","leaseExpires":9}]}'), False),
        (_json(200, b'{"data":[]}'), False),
        (_json(200, b'{"data":[{"taskID":7,"status":"lost"}]}'), False),
    ]
    client, wire = _client(port)
    try:
        renewed = await client.renew([(7, "owner:1")], 60, timeout=5)
        leased = await client.lease(4, None)  # another answer limit, the same connection
        again = await client.renew([(7, "owner:1")], 60, timeout=5)
    finally:
        await wire.close()
    assert (renewed, leased, again) == ({7: 60}, [], {7: None})
    assert len(factory.connections) == 1
    first, lease = factory.requests[0], factory.requests[1]
    assert first.startswith(b"POST /api/queue/renew HTTP/1.1\r\n")
    # A renewal names each lease's owner in its body; the lease call says
    # the owner it leases as in the header every queue reads.
    assert b"X-Lease-Owner" not in first and b"\r\nX-Service-Token: tok\r\n" in first
    assert first.endswith(b'{"leases":[{"taskID":7,"leaseOwner":"owner:1"}],"duration":60}')
    assert b"\r\nX-Lease-Owner: owner:1\r\n" in lease


async def test_an_error_answer_is_a_queue_error_with_its_code(scripted):
    factory, port = scripted
    factory.answers.append(
        (_json(409, b'{"error":{"code":"ERR_LEASE_LOST","message":"taken over"}}'), False)
    )
    client, wire = _client(port)
    try:
        with pytest.raises(QueueError) as raised:
            await client.renew([(7, "owner:1")], 60, timeout=5)
    finally:
        await wire.close()
    assert (raised.value.status, raised.value.code) == (409, "ERR_LEASE_LOST")


async def test_an_answer_over_the_limit_fails_the_call_and_drops_the_connection(scripted):
    factory, port = scripted
    factory.answers.append((_json(200, b'{"data":"' + b"x" * 2000 + b'"}'), False))
    wire = QueueWire(reactor, f"http://127.0.0.1:{port}", connect_timeout=5, max_idle=4)
    hung_up = factory.closing()
    try:
        reply = await wire.post(wire.head("/x", {}), b"{}", keep=100, timeout=5, clock=reactor)
        with pytest.raises(TransportFailure) as raised:
            reply.require_body()
    finally:
        await wire.close()
    assert raised.value.cause is Cause.BODY_TOO_LARGE
    await hung_up  # not kept for the next call
    assert factory.closed == factory.connections


async def test_no_answer_in_time_is_a_deadline(scripted):
    factory, port = scripted
    factory.answers.append((None, False))
    client, wire = _client(port, timeout=0.2)
    try:
        with pytest.raises(QueueError, match="timed out after 0.2s"):
            await client.renew([(7, "owner:1")], 60, timeout=5)
    finally:
        await wire.close()


async def test_a_cancelled_call_is_a_cancel_and_hangs_up(scripted):
    factory, port = scripted
    factory.answers.append((None, False))
    wire = QueueWire(reactor, f"http://127.0.0.1:{port}", connect_timeout=5, max_idle=4)
    arrived = factory.requested(1)
    call = Deferred.fromCoroutine(
        wire.post(wire.head("/x", {}), b"{}", keep=100, timeout=30, clock=reactor)
    )
    await arrived
    hung_up = factory.closing()
    call.cancel()
    with pytest.raises(CancelledError) as raised:
        await call
    assert isinstance(raised.value, ExchangeCancelled)
    await hung_up
    await wire.close()
    assert factory.closed == factory.connections


async def test_a_refused_connection_names_its_cause():
    wire = QueueWire(reactor, "http://127.0.0.1:1", connect_timeout=5, max_idle=4)
    with pytest.raises(TransportFailure) as raised:
        await wire.post(wire.head("/x", {}), b"{}", keep=100, timeout=5, clock=reactor)
    assert raised.value.cause is Cause.REFUSED
