"""The hot channel: a service's hot routes answered without twisted.web's
Request, to the same bytes as the twisted.web path, and every other request
handed to twisted.web with the bytes already read."""

from __future__ import annotations

import json
import re

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from klein import Klein
from prometheus_client import CollectorRegistry
from twisted.internet import task
from twisted.internet.address import IPv4Address
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Protocol
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from gorge.config import ConfigError
from gorge.web.envelope import ApiError, add_error_handlers, ok, read_json_object
from gorge.web.hotchannel import MAX_HEAD, HotChannel
from gorge.web.site import GorgeChannel, GorgeHotChannel, build_site
from tests.support.fuzzing import fuzz_settings
from tests.support.logcapture import logged_events

TOKEN = "hot-token"
LIMIT = 1024
ECHO = b"/api/hot/echo"
HELD = b"/api/hot/held"
PEER = IPv4Address("TCP", "127.0.0.9", 40000)


class Handlers:
    """Hot routes whose answers depend on the request alone, and one that
    waits for the test."""

    def __init__(self) -> None:
        self.gates: list[Deferred] = []
        self.cancelled = 0

    async def echo(self, request) -> bytes:
        body = read_json_object(request)
        if "refuse" in body:
            raise ApiError(409, "ERR_REFUSED", str(body["refuse"]))
        if "crash" in body:
            raise RuntimeError("the handler broke")
        if "big" in body:
            return ok(request, "x" * int(body["big"]))
        owner = request.getHeader(b"x-lease-owner")
        return ok(
            request,
            {
                "body": body,
                "owner": owner.decode("latin-1") if owner is not None else None,
                "peer": request.getClientAddress().host,
            },
        )

    async def held(self, request) -> bytes:
        def cancelled(_):
            self.cancelled += 1

        gate: Deferred = Deferred(cancelled)
        self.gates.append(gate)
        return ok(request, await gate)

    def routes(self) -> dict:
        return {ECHO: self.echo, HELD: self.held}


def make_site(hot: bool, handlers: Handlers | None = None, clock=None, **kw):
    app = Klein()
    add_error_handlers(app)

    async def ready():
        return None

    handlers = handlers or Handlers()
    site = build_site(
        api_resource=app.resource(),
        prefix="/api/hot/",
        token=TOKEN,
        body_limit=LIMIT,
        readiness=ready,
        registry=CollectorRegistry(),
        clock=task.Clock(),
        hot_routes=handlers.routes(),
        # Off (GORGE_HTTP_FAST=off): the same site with its twisted.web path
        # only, DirectRoutes answering the hot routes in front of Klein.
        fast=hot,
        **kw,
    )
    # Channels time idle clients out with the site's reactor: never the real one here.
    site.reactor = clock or task.Clock()
    return site


def connect(site):
    transport = StringTransport(peerAddress=PEER)
    channel = site.buildProtocol(PEER)
    channel.makeConnection(transport)
    return channel, transport


def request(
    path: bytes = ECHO,
    body: bytes = b"{}",
    *,
    token: bytes | None = TOKEN.encode(),
    extra: bytes = b"",
    request_id: bytes | None = b"rid-1",
) -> bytes:
    fields = b"Host: 127.0.0.1\r\nContent-Length: %d\r\n" % len(body)
    if token is not None:
        fields += b"X-Service-Token: " + token + b"\r\n"
    if request_id is not None:
        fields += b"X-Request-Id: " + request_id + b"\r\n"
    return b"POST " + path + b" HTTP/1.1\r\n" + fields + extra + b"\r\n" + body


_DATE = re.compile(rb"\r\nDate: [^\r]*\r\n")
_MADE_ID = re.compile(rb"\r\nX-Request-Id: [0-9a-f]{32}\r\n")


def normalised(raw: bytes) -> bytes:
    """The answers without what differs between two sites: the time and
    the request ids the sites made up."""
    raw = _DATE.sub(b"\r\nDate: -\r\n", raw)
    return _MADE_ID.sub(b"\r\nX-Request-Id: made\r\n", raw)


def answers(raw: bytes) -> list[tuple[int, dict, bytes]]:
    """The answers in ``raw``: status, lower-cased fields, body."""
    out = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            fields[name.strip().lower()] = value.strip()
        length = int(fields[b"content-length"])
        if len(rest) < length:
            raise ValueError("an answer cut short")
        out.append((int(lines[0].split()[1]), fields, rest[:length]))
        raw = rest[length:]
    return out


def the_one_answer_closing(transport) -> bytes:
    """The body of the connection's only answer, a 200 with ``Connection:
    close``, after which the connection is closing."""
    [(status, fields, body)] = answers(transport.value())
    assert (status, fields.get(b"connection")) == (200, b"close")
    assert transport.disconnecting
    return body


def exchange(hot: bool, data: list[bytes]) -> tuple[bytes, bool, list[tuple]]:
    """What a connection to a fresh site answers to ``data`` sent in these
    pieces, whether it closed, and what was logged."""
    site = make_site(hot)
    with logged_events() as events:
        channel, transport = connect(site)
        for piece in data:
            if transport.disconnecting:
                break  # a socket delivers nothing once it is being closed
            channel.dataReceived(piece)
    logged = [
        (str(e.get("log_format", "")).split(" ")[0], e.get("status"), e.get("uri")) for e in events
    ]
    return normalised(transport.value()), transport.disconnecting, logged


# -- the same answer as twisted.web

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
bodies = st.one_of(
    st.dictionaries(st.text(max_size=6), json_values, max_size=4).map(
        lambda d: json.dumps(d).encode()
    ),
    st.sampled_from(
        [b'{"refuse":"taken"}', b'{"crash":1}', b"[]", b"{", b"", b"\xff\xfe", b'{"a":"\\ud800"}']
    ),
    st.binary(max_size=40),
)
tokens = st.sampled_from([TOKEN.encode(), b"wrong", None])
extras = st.lists(
    st.sampled_from(
        [
            b"X-Lease-Owner: w1\r\n",
            b"x-lease-owner: w2\r\n",
            b"Connection: keep-alive\r\n",
            b"Connection: close\r\n",
            b"Content-Type: application/json\r\n",
            b"X-Empty:\r\n",
            b"X-Spaced:   padded value \t\r\n",
        ]
    ),
    max_size=3,
).map(b"".join)
plain_requests = st.builds(
    lambda path, body, token, extra: request(path, body, token=token, extra=extra),
    st.sampled_from([ECHO, ECHO + b"?x=1", b"/api/hot/echo/", b"/api/hot/other"]),
    bodies,
    tokens,
    extras,
)
# Requests the hot channel must leave to twisted.web.
OTHER_REQUESTS = [
    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    b"GET /api/hot/echo HTTP/1.1\r\nX-Service-Token: hot-token\r\n\r\n",
    b"POST /api/hot/echo HTTP/1.1\r\nX-Service-Token: hot-token\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    b"POST /api/hot/echo HTTP/1.1\r\nX-Service-Token: hot-token\r\n"
    b"Content-Length: 2\r\nConnection: Upgrade\r\n\r\n{}",
    b"POST /api/hot/echo HTTP/1.1\r\nX-Service-Token: hot-token\r\n"
    b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /api/hot/echo HTTP/1.1\r\nX-Service-Token: hot-token\r\n"
    b"Content-Length: %d\r\n\r\n" % (LIMIT + 1) + b"x" * (LIMIT + 1),
    b"POST /api/hot/echo HTTP/1.1\r\nContent-Length : 2\r\n\r\n{}",
    b"POST /api/hot/echo HTTP/1.1\r\nX-Service-Token: hot-token\r\nContent-Length: 2\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    b"POST /api/hot/echo HTTP/1.1\r\nX-Service-Token: hot-token\r\nContent-Length: 2\r\n"
    b"Expect: 100-continue\r\n\r\n{}",
    b"POST /api/hot/echo HTTP/1.0\r\nX-Service-Token: hot-token\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /api/hot/echo HTTP/1.1\r\nX-Service-Token: hot-token\r\nContent-Length: +2\r\n\r\n{}",
    b"POST /api/hot/echo HTTP/1.1\r\nX-Service-Token: hot-token\r\nX-Bad: a\x01b\r\n"
    b"Content-Length: 2\r\n\r\n{}",
    b"POST /api/hot/echo HTTP/1.1\r\nX-Service-Token: hot-token\nContent-Length: 2\r\n\r\n{}",
]
other_requests = st.sampled_from(OTHER_REQUESTS)


def cut(data: bytes, points: list[int]) -> list[bytes]:
    marks = sorted({p % (len(data) + 1) for p in points})
    pieces, start = [], 0
    for mark in [*marks, len(data)]:
        pieces.append(data[start:mark])
        start = mark
    return [p for p in pieces if p]


@fuzz_settings(150)
@given(
    st.lists(st.one_of(plain_requests, plain_requests, other_requests), min_size=1, max_size=4),
    st.lists(st.integers(min_value=0), max_size=6),
)
def test_every_answer_is_the_twisted_web_answer_to_the_byte(requests, points):
    data = b"".join(requests)
    hot = exchange(True, cut(data, points))
    plain = exchange(False, [data])
    assert hot == plain


@pytest.mark.parametrize("other", OTHER_REQUESTS)
@pytest.mark.parametrize("before", [b"", request()])
def test_each_other_request_gets_the_twisted_web_answer(before, other):
    data = before + other + request(body=b'{"after":1}')
    assert exchange(True, [data]) == exchange(False, [data])
    site = make_site(True)
    channel, _ = connect(site)
    channel.dataReceived(data)
    assert channel.delegate is not None


def test_a_plain_request_is_answered_by_the_hot_channel():
    site = make_site(True)
    channel, transport = connect(site)
    channel.dataReceived(request(body=b'{"a":1}', extra=b"X-Lease-Owner: w1\r\n"))
    assert isinstance(channel, HotChannel) and channel.delegate is None
    [(status, fields, body)] = answers(transport.value())
    assert status == 200
    assert list(fields) == [b"x-request-id", b"server", b"date", b"content-type", b"content-length"]
    assert fields[b"x-request-id"] == b"rid-1"
    assert json.loads(body) == {"data": {"body": {"a": 1}, "owner": "w1", "peer": "127.0.0.9"}}


def test_request_ids_are_made_when_none_is_given():
    channel, transport = connect(make_site(True))
    channel.dataReceived(request(request_id=None) * 2)
    ids = [fields[b"x-request-id"] for _, fields, _ in answers(transport.value())]
    assert len(ids) == 2 and ids[0] != ids[1]
    assert all(re.fullmatch(rb"[0-9a-f]{32}", i) for i in ids)


def test_the_first_other_request_hands_the_connection_over_for_good():
    channel, transport = connect(make_site(True))
    channel.dataReceived(request() + b"GET /healthz HTTP/1.1\r\n\r\n" + request(body=b'{"b":2}'))
    assert channel.delegate is not None
    assert [(s, json.loads(b)) for s, _, b in answers(transport.value())] == [
        (200, {"data": {"body": {}, "owner": None, "peer": "127.0.0.9"}}),
        (200, {"status": "ok"}),
        (200, {"data": {"body": {"b": 2}, "owner": None, "peer": "127.0.0.9"}}),
    ]


def test_a_close_request_is_the_last_one_read():
    channel, transport = connect(make_site(True))
    channel.dataReceived(request(extra=b"Connection: close\r\n") + request())
    the_one_answer_closing(transport)


# -- a request under way


def test_a_client_that_leaves_cancels_its_request():
    handlers = Handlers()
    site = make_site(True, handlers)
    with logged_events() as events:
        channel, transport = connect(site)
        channel.dataReceived(request(HELD))
        assert len(handlers.gates) == 1
        channel.connectionLost(Failure(ConnectionDone()))
    assert handlers.cancelled == 1
    assert transport.value() == b""
    names = [str(e.get("log_format", "")).split(" ")[0] for e in events]
    assert "REQUEST_ABANDONED_FAILED" not in names and "PANIC_RECOVERED" not in names
    assert names.count("REQUEST") == 1


def test_requests_behind_one_under_way_wait_their_turn_and_pause_the_client():
    handlers = Handlers()
    channel, transport = connect(make_site(True, handlers))
    queued = request(body=b'{"n":1}') * 250  # more than a body limit and a head
    assert len(queued) > LIMIT + MAX_HEAD
    channel.dataReceived(request(HELD) + queued)
    assert transport.value() == b"" and transport.producerState == "paused"
    handlers.gates[0].callback("first")
    got = answers(transport.value())
    assert len(got) == 251 and json.loads(got[0][2]) == {"data": "first"}
    assert transport.producerState == "producing"


def test_an_answer_bigger_than_a_socket_buffer_is_written_whole():
    channel, transport = connect(make_site(True))
    channel.dataReceived(request(body=b'{"big":300000}'))
    [(status, _, body)] = answers(transport.value())
    assert (status, len(body)) == (200, 300000 + len('{"data":""}'))


# -- a stop's drain


def test_drain_closes_an_idle_connection_at_once():
    site = make_site(True)
    channel, transport = connect(site)
    channel.dataReceived(request())
    done = site.drain(5, task.Clock())
    assert transport.disconnecting
    channel.connectionLost(Failure(ConnectionDone()))
    assert done.result is True


def test_drain_answers_the_request_under_way_then_closes():
    handlers = Handlers()
    site = make_site(True, handlers)
    channel, transport = connect(site)
    channel.dataReceived(request(HELD))
    done = site.drain(5, task.Clock())
    assert not transport.disconnecting and not done.called
    handlers.gates[0].callback("last")
    assert the_one_answer_closing(transport) == b'{"data":"last"}'


@pytest.mark.parametrize(
    "whole, handed_over",
    [(request(body=b'{"late":true}'), False), (b"GET /healthz HTTP/1.1\r\n\r\n", True)],
    ids=["hot", "handed-over"],
)
def test_drain_reads_a_request_begun_to_its_end_and_answers_it(whole, handed_over):
    site = make_site(True)
    channel, transport = connect(site)
    channel.dataReceived(whole[:20])
    assert channel.delegate is None  # not read whole yet
    site.drain(5, task.Clock())
    assert not transport.disconnecting
    channel.dataReceived(whole[20:])
    the_one_answer_closing(transport)
    assert (channel.delegate is not None) == handed_over


def test_a_request_arriving_while_the_site_drains_is_answered_with_close():
    site = make_site(True)
    channel, transport = connect(site)
    channel.dataReceived(request()[:5])
    site.draining = True
    channel.dataReceived(request()[5:])
    the_one_answer_closing(transport)


# -- idle clients


@pytest.mark.parametrize("hot", [True, False], ids=["hot", "twisted.web"])
def test_an_idle_connection_closes_after_the_site_timeout_to_the_second(hot):
    # Both channels close a connection timeOut after its last byte or its
    # last answer, no later.
    clock = task.Clock()
    site = make_site(hot, clock=clock)
    site.timeOut = 10
    channel, transport = connect(site)
    clock.advance(9)
    channel.dataReceived(request())  # answered at once
    clock.advance(9.5)
    assert not transport.disconnecting
    channel.dataReceived(b"POST /api/hot/echo HTTP/1.1\r\n")  # a slow client's first line
    clock.advance(9.5)
    assert not transport.disconnecting
    clock.advance(0.5)
    assert transport.disconnecting


def test_a_connection_with_a_request_under_way_is_not_idle():
    clock = task.Clock()
    handlers = Handlers()
    site = make_site(True, handlers, clock=clock)
    site.timeOut = 10
    channel, transport = connect(site)
    channel.dataReceived(request(HELD))
    clock.advance(50)
    assert not transport.disconnecting
    handlers.gates[0].callback("done")
    clock.advance(9.5)  # the period starts again with the answer
    assert not transport.disconnecting
    clock.advance(0.5)
    assert transport.disconnecting


# -- over a real socket


class Collect(Protocol):
    def __init__(self, count: int) -> None:
        self.count = count
        self.data = b""
        self.done: Deferred = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        try:
            got = answers(self.data)
        except (KeyError, ValueError, IndexError):
            return
        if len(got) >= self.count and not self.done.called:
            self.done.callback(got)


@pytest_twisted.ensureDeferred
async def test_over_tcp_answers_arrive_whole_and_in_order():
    from twisted.internet import reactor

    site = make_site(True)
    site.reactor = reactor
    port = reactor.listenTCP(0, site, interface="127.0.0.1")
    try:
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port.getHost().port)
        collect = await connectProtocol(endpoint, Collect(22))
        # Large answers fill the socket buffer: what it does not take waits
        # its turn, ahead of the small answers after it.
        bodies = [b'{"big":400000}', *(b'{"n":%d}' % i for i in range(20)), b'{"big":200000}']
        collect.transport.write(b"".join(request(body=b) for b in bodies))
        got = await collect.done.addTimeout(30, reactor)
        assert [s for s, _, _ in got] == [200] * 22
        assert len(got[0][2]) == 400000 + 11 and len(got[21][2]) == 200000 + 11
        assert [json.loads(b)["data"]["body"] for _, _, b in got[1:21]] == [
            {"n": i} for i in range(20)
        ]
        collect.transport.loseConnection()
    finally:
        await port.stopListening()


def test_a_site_without_hot_routes_uses_plain_twisted_web_channels():
    async def ready():
        return None

    site = build_site(
        api_resource=Klein().resource(),
        prefix="/api/hot/",
        token=TOKEN,
        body_limit=LIMIT,
        readiness=ready,
        registry=CollectorRegistry(),
        clock=task.Clock(),
    )
    site.reactor = task.Clock()
    channel, _ = connect(site)
    assert isinstance(channel, GorgeChannel) and not isinstance(channel, GorgeHotChannel)


def test_hot_routes_must_lie_under_the_api_prefix():
    async def ready():
        return None

    async def handler(request):
        return b""

    with pytest.raises(ValueError, match="outside the API prefix"):
        build_site(
            api_resource=Klein().resource(),
            prefix="/api/hot/",
            token=TOKEN,
            body_limit=LIMIT,
            readiness=ready,
            registry=CollectorRegistry(),
            clock=task.Clock(),
            hot_routes={b"/metrics": handler},
        )


def test_cancelled_handler_failure_is_not_logged_as_a_crash():
    # A handler that turns the cancel into its own error is still an abandoned
    # request, logged once, not answered.
    handlers = Handlers()
    site = make_site(True, handlers)

    async def stubborn(request):
        try:
            await Deferred()
        except CancelledError:
            raise RuntimeError("cleanup failed") from None
        return b""

    site.hot_routes.handlers[HELD] = stubborn
    with logged_events() as events:
        channel, transport = connect(site)
        channel.dataReceived(request(HELD))
        channel.connectionLost(Failure(ConnectionDone()))
    names = [str(e.get("log_format", "")).split(" ")[0] for e in events]
    assert names.count("REQUEST_ABANDONED_FAILED") == 1
    assert transport.value() == b""


class Answering(HotChannel):
    """A bare hot channel that answers every request at once."""

    routes = frozenset({ECHO})

    def process(self, request):
        self.respond(request, b"")

    def fallback(self):
        from twisted.web.http import HTTPChannel

        return HTTPChannel()


def test_close_after_answer_reads_the_request_begun_and_answers_it_with_close():
    channel = Answering()
    transport = StringTransport()
    channel.makeConnection(transport)
    whole = request()
    channel.dataReceived(whole[:10])
    channel.close_after_answer()
    assert not transport.disconnecting
    channel.dataReceived(whole[10:] + request())
    assert transport.value().startswith(b"HTTP/1.1 200 OK\r\nConnection: close\r\n")
    assert transport.value().count(b"HTTP/1.1") == 1
    assert transport.disconnecting


def test_a_handler_that_answers_after_its_client_left_is_logged_once():
    site = make_site(True)

    async def deaf(request):
        try:
            await Deferred()
        except CancelledError:
            pass  # finishes its work anyway
        return ok(request, "late")

    site.hot_routes.handlers[HELD] = deaf
    with logged_events() as events:
        channel, transport = connect(site)
        channel.dataReceived(request(HELD))
        channel.connectionLost(Failure(ConnectionDone()))
    names = [str(e.get("log_format", "")).split(" ")[0] for e in events]
    assert names.count("REQUEST") == 1
    assert transport.value() == b""


# -- limits that hold, on both channels alike

both = pytest.mark.parametrize("hot", [True, False], ids=["hot", "twisted.web"])


def status_of(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def head(length: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST /api/hot/echo HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Service-Token: hot-token\r\n"
        b"Content-Length: " + length + b"\r\n" + extra + b"\r\n"
    )


@both
@pytest.mark.parametrize(
    "length", [b"%d" % (LIMIT + 1), b"1" * 30, b"7" * 5000], ids=["over", "huge", "5000-digits"]
)
def test_a_declared_length_over_the_limit_is_refused_at_once_and_closes(hot, length):
    answer, closed, logged = exchange(hot, [head(length)])  # not one byte of the body
    [(status, fields, body)] = answers(answer)
    assert (status, fields[b"connection"]) == (413, b"close")
    assert json.loads(body)["error"]["code"] == "ERR_TOO_LARGE"
    assert closed
    assert [name for name, _, _ in logged] == ["REQUEST"]  # and nothing raised


@both
def test_leading_zeros_do_not_make_a_length_long(hot):
    answer, closed, _ = exchange(hot, [head(b"0" * 5000 + b"2") + b"{}"])
    [(status, _, _)] = answers(answer)
    assert (status, closed) == (200, False)


@both
@pytest.mark.parametrize("method", [b"post", b"Post", b"TRACE", b"OPTIONS"])
def test_methods_are_case_sensitive_and_others_refused(hot, method):
    raw = b"%s /api/hot/echo HTTP/1.1\r\nX-Service-Token: hot-token\r\nContent-Length: 2\r\n\r\n{}"
    answer, _, _ = exchange(hot, [raw % method])
    [(status, fields, body)] = answers(answer)
    assert (status, fields[b"allow"]) == (405, b"POST")
    assert json.loads(body)["error"]["code"] == "ERR_METHOD_NOT_ALLOWED"


@both
@pytest.mark.parametrize(
    "fields",
    [
        b"Connection: keep-alive\r\nConnection: close\r\n",
        b"Connection: close\r\nConnection: keep-alive\r\n",
        b"Connection: keep-alive, close\r\n",
        b"Connection: keep-alive,close\r\n",
    ],
)
def test_a_close_in_any_connection_field_closes(hot, fields):
    answer, closed, _ = exchange(hot, [head(b"2", fields) + b"{}" + request()])
    [(status, answer_fields, _)] = answers(answer)
    assert (status, answer_fields[b"connection"], closed) == (200, b"close", True)


@both
@pytest.mark.parametrize(
    "fields",
    [
        b"Content-Length: 3\r\n",  # conflicting
        b"Content-Length: 2\r\n",  # repeated
        b"Transfer-Encoding: chunked\r\n",  # both framings
        b"Transfer-Encoding: gzip\r\n",
    ],
)
def test_ambiguous_framing_is_refused_and_closes(hot, fields):
    answer, closed, _ = exchange(hot, [head(b"2", fields) + b"{}" + request()])
    assert (status_of(answer), closed) == (400, True)
    assert answer.count(b"HTTP/1.1 ") == 1  # the request behind it is never read


def test_the_switch_leaves_every_request_to_twisted_web():
    from gorge.config import Env, load_http_settings

    def fast(environ):
        return load_http_settings(Env(environ), default_listen=":1").fast

    assert fast({}) is True
    assert fast({"GORGE_HTTP_FAST": "off"}) is False
    with pytest.raises(ConfigError, match="GORGE_HTTP_FAST"):
        fast({"GORGE_HTTP_FAST": "sometimes"})
    assert make_site(True).protocol is GorgeHotChannel
    assert make_site(False).protocol is GorgeChannel


@both
@pytest.mark.parametrize(
    "target,host",
    [(b"/api/hot/\x80x", b"127.0.0.1"), (b"/api/hot/%80x", b"127.0.0.1"), (b"/api/hot/x", b"\xff")],
)
def test_a_path_or_host_that_is_not_utf8_gets_the_envelope(hot, target, host):
    raw = b"GET %s HTTP/1.1\r\nHost: %s\r\nX-Service-Token: hot-token\r\n\r\n" % (target, host)
    answer, _, logged = exchange(hot, [raw])
    [(status, fields, body)] = answers(answer)
    assert (status, fields[b"content-type"]) == (400, b"application/json")
    assert json.loads(body)["error"]["code"] == "ERR_BAD_REQUEST"
    assert [name for name, _, _ in logged] == ["REQUEST"]


def chunked_head() -> bytes:
    return (
        b"POST /api/hot/echo HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Service-Token: hot-token\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )


@both
@pytest.mark.parametrize("pieces", [1, 3], ids=["one-read", "three-reads"])
def test_a_chunked_body_past_the_limit_is_refused_before_its_end_and_closes(hot, pieces):
    # The body never ends: each chunk is under the limit, their sum is not.
    chunk = b"%x\r\n" % 512 + b"x" * 512 + b"\r\n"
    over = chunk * (LIMIT // 512 + 1)
    step = len(over) // pieces + 1
    endless = [chunked_head()] + [over[i : i + step] for i in range(0, len(over), step)]
    endless += [chunk] * 50  # what a client would go on sending
    answer, closed, logged = exchange(hot, endless)
    [(status, fields, body)] = answers(answer)
    assert (status, fields[b"connection"]) == (413, b"close")
    assert json.loads(body)["error"]["code"] == "ERR_TOO_LARGE"
    assert closed
    assert [name for name, _, _ in logged] == ["REQUEST"]


@both
def test_a_chunked_body_at_the_limit_is_still_read_to_its_end(hot):
    body = b'{"a":"' + b"x" * (LIMIT - 8) + b'"}'
    raw = chunked_head() + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    answer, closed, _ = exchange(hot, [raw])
    [(status, _, _)] = answers(answer)
    assert (status, closed) == (200, False)
