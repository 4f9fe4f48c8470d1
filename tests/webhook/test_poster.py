"""The webhook's delivery client: its request bytes, and its kept connections
against a scripted server on 127.0.0.1."""

from __future__ import annotations

import pytest
from twisted.internet import reactor
from twisted.internet.defer import Deferred

from gorge.webhook.poster import Poster, request_bytes
from gorge.webhook.transport import Transport
from gorge.webhook.uripolicy import Target, UriPolicy
from tests.support.scriptedhttp import OK

# -- the request --------------------------------------------------------------


def _target(uri: str, port: int = 80, scheme: str = "http", host: str = "hook.example"):
    return Target(uri=uri, scheme=scheme, host=host, port=port, addresses=("127.0.0.1",))


def test_request_bytes_are_what_the_agent_wrote():
    wire = request_bytes(
        _target("http://Hook.Example:8080/a/b?x=1&y=2#frag", 8080),
        {"Content-Type": "application/json", "User-Agent": "gorge-webhook"},
        b"{}",
    )
    assert wire == (
        b"POST /a/b?x=1&y=2 HTTP/1.1\r\nContent-Length: 2\r\n"
        b"Content-Type: application/json\r\nUser-Agent: gorge-webhook\r\n"
        b"Host: Hook.Example:8080\r\n\r\n{}"
    )


@pytest.mark.parametrize(
    "uri,port,scheme,host_line",
    [
        ("http://hook.example", 80, "http", b"Host: hook.example\r\n"),
        ("https://hook.example/x", 443, "https", b"Host: hook.example\r\n"),
        ("https://hook.example:80/x", 80, "https", b"Host: hook.example:80\r\n"),
        ("http://user:pw@[::1]:81/x", 81, "http", b"Host: [::1]:81\r\n"),
    ],
)
def test_the_host_line_leaves_out_a_default_port(uri, port, scheme, host_line):
    wire = request_bytes(_target(uri, port, scheme), {}, b"")
    assert host_line in wire
    assert wire.startswith(b"POST /" + (b"x" if uri.endswith("/x") else b"") + b" HTTP/1.1\r\n")


@pytest.mark.parametrize(
    "uri,headers",
    [
        ("http://hook.example/a b", {}),
        ("http://hook.example/\u00e9", {}),
        ("http://hook.example/", {"X-Bad": "a\r\nInjected: 1"}),
        ("http://hook.example/", {"X-Bad:": "1"}),
    ],
)
def test_what_cannot_be_sent_as_it_is_raises_value_error(uri, headers):
    with pytest.raises(ValueError):
        request_bytes(_target(uri), headers, b"")


# -- connections, against a scripted server -----------------------------------


async def _attempts(port: int, answers: list[tuple[bytes, bool]], factory, close=True):
    factory.answers.extend(answers)
    policy = UriPolicy((), None, reactor, 5)
    transport = Transport(reactor, policy, 5)
    target = await policy.check(f"http://127.0.0.1:{port}/hook")
    results = []
    for n in range(len(answers)):
        results.append(await transport.attempt(target, b'{"n":%d}' % n, {"X-N": str(n)}))
    if close:
        await transport.close()
    return results, transport


async def test_one_connection_carries_consecutive_posts(scripted):
    factory, port = scripted
    results, _ = await _attempts(port, [(OK, False)] * 3, factory)
    assert [r.code for r in results] == [200, 200, 200]
    assert len(factory.connections) == 1
    assert [r.split(b"\r\n", 1)[0] for r in factory.requests] == [b"POST /hook HTTP/1.1"] * 3
    assert all(b"\r\nHost: 127.0.0.1:%d\r\n" % port in r for r in factory.requests)
    assert factory.requests[2].endswith(b'{"n":2}')


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ],
)
async def test_an_answer_that_ends_the_connection_gets_a_new_one(scripted, answer):
    factory, port = scripted
    results, _ = await _attempts(port, [(answer, False), (OK, False)], factory)
    assert [r.code for r in results] == [200, 200]
    assert len(factory.connections) == 2


async def test_a_body_that_ends_with_the_connection_is_an_answer(scripted):
    factory, port = scripted
    results, _ = await _attempts(
        port, [(b"HTTP/1.1 503 Busy\r\nRetry-After: 3\r\n\r\nbusy", True), (OK, False)], factory
    )
    assert [(r.ok, r.code, r.retry_after) for r in results] == [
        (False, 503, b"3"),
        (True, 200, None),
    ]
    assert len(factory.connections) == 2


async def test_a_kept_connection_the_server_closed_is_not_used_again(scripted):
    factory, port = scripted
    closed = factory.closing()
    results, transport = await _attempts(port, [(OK, False)], factory, close=False)
    factory.connections[0].transport.loseConnection()  # the server's idle timeout
    await closed
    more, _ = await _attempts(port, [(OK, False)], factory)
    await transport.close()
    assert [r.code for r in results + more] == [200, 200]
    assert len(factory.connections) == 2


async def test_close_hangs_up_the_idle_connections(scripted):
    factory, port = scripted
    closed = factory.closing()
    _, transport = await _attempts(port, [(OK, False), (OK, False)], factory, close=False)
    assert factory.closed == []
    await transport.close()
    await closed
    assert factory.closed == factory.connections


async def test_a_malformed_status_line_is_code_0_and_the_connection_dropped(scripted):
    factory, port = scripted
    results, _ = await _attempts(port, [(b"HTTP/1.1 twohundred\r\n\r\n", False)], factory)
    assert (results[0].ok, results[0].code) == (False, 0)
    assert "MalformedResponse" in results[0].detail


def _poster_target(port: int) -> Target:
    return Target(
        uri=f"http://127.0.0.1:{port}/hook",
        scheme="http",
        host="127.0.0.1",
        port=port,
        addresses=("127.0.0.1",),
    )


async def test_an_exchange_that_ends_after_close_is_not_kept(scripted):
    factory, port = scripted
    factory.answers.append((None, False))
    poster = Poster(reactor, connect_timeout=5, max_idle=4)
    target = _poster_target(port)
    answered = Deferred.fromCoroutine(poster.post(target, request_bytes(target, {}, b"{}")))
    await factory.requested(1)
    await poster.close()  # nothing idle yet: fires at once
    hung_up = factory.closing()
    factory.held[0].transport.write(OK)
    assert (await answered).status == 200
    await hung_up
    assert factory.closed == factory.connections


async def test_no_more_than_max_idle_connections_are_kept(scripted):
    factory, port = scripted
    factory.answers += [(None, False), (None, False), (OK, False)]
    poster = Poster(reactor, connect_timeout=5, max_idle=1)
    target = _poster_target(port)
    wire = request_bytes(target, {}, b"{}")
    both = [Deferred.fromCoroutine(poster.post(target, wire)) for _ in range(2)]
    await factory.requested(2)
    hung_up = factory.closing()
    for held in factory.held:
        held.transport.write(OK)
    assert [(await d).status for d in both] == [200, 200]
    await hung_up
    assert len(factory.connections) == 2 and len(factory.closed) == 1
    third = await poster.post(target, wire)  # on the one connection kept
    await poster.close()
    assert third.status == 200 and len(factory.connections) == 2
