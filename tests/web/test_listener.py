"""Stopping the HTTP listener: new connections refused, idle ones closed,
requests already arriving read to their end and answered (real sockets)."""

from __future__ import annotations

import json

import pytest_twisted
from prometheus_client import CollectorRegistry
from twisted.internet import reactor, task
from twisted.internet.error import ConnectionRefusedError

from gorge.web.listener import listener
from gorge.web.site import build_site
from gorge_testing.procs import free_port
from tests.support.logcapture import logged_events
from tests.support.slowclient import connect, parse_response, post
from tests.support.twistd import healthz
from tests.web.test_site import ExampleApi, Readiness

BODY = json.dumps({"text": "x" * 200_000}).encode()


def started_listener(drain_timeout: float, clock):
    site = build_site(
        api_resource=ExampleApi().app.resource(),
        prefix="/api/example/",
        token="",
        body_limit=1024 * 1024,
        readiness=Readiness(),
        registry=CollectorRegistry(),
        clock=clock,
    )
    port = free_port()
    service = listener(
        f"tcp:{port}:interface=127.0.0.1", site, drain_timeout=drain_timeout, clock=clock
    )
    service.privilegedStartService()
    service.startService()
    return service, site, port


async def idle_and_half_sent(port: int):
    """A connection with nothing sent, and one with a head and half a body."""
    idle = await connect(reactor, port)
    slow = await connect(reactor, port)
    head, body = post("/api/example/echo", BODY)
    slow.send(head + body[:1000])
    # Both were accepted, and the head read, by the time this is answered.
    await healthz(reactor, port)
    return idle, slow, body


@pytest_twisted.ensureDeferred
async def test_stop_answers_a_request_still_arriving_and_closes_idle_connections():
    service, site, port = started_listener(10.0, task.Clock())
    idle, slow, body = await idle_and_half_sent(port)
    assert site.open_connections == 2

    stopping = service.stopService()
    # The idle connection closes without an answer: it had no request.
    assert await idle.closed.addTimeout(10, reactor) == b""
    assert not stopping.called
    try:
        await connect(reactor, port)
    except ConnectionRefusedError:
        pass
    else:
        raise AssertionError("a new connection was accepted after the stop")

    slow.send(body[1000:])
    status, headers, answer = parse_response(await slow.closed.addTimeout(10, reactor))
    assert status == 200 and json.loads(answer) == {"data": json.loads(BODY)}
    assert headers["connection"] == "close"
    await stopping.addTimeout(10, reactor)
    assert site.open_connections == 0


@pytest_twisted.ensureDeferred
async def test_the_drain_is_bounded():
    clock = task.Clock()
    service, site, port = started_listener(5.0, clock)
    idle, slow, _ = await idle_and_half_sent(port)
    with logged_events() as events:
        stopping = service.stopService()
        await idle.closed.addTimeout(10, reactor)  # the drain has begun
        clock.advance(4.9)
        assert not stopping.called
        clock.advance(0.1)
        await stopping.addTimeout(10, reactor)
    (abandoned,) = [
        e for e in events if str(e.get("log_format", "")).startswith("HTTP_DRAIN_ABANDONED")
    ]
    assert abandoned["open_connections"] == 1
    slow.transport.loseConnection()
    await slow.closed.addTimeout(10, reactor)
