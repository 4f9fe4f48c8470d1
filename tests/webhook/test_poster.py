"""The delivery client: the answer parser on all inputs, and its connections
against a scripted server on 127.0.0.1."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import error, reactor
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure

from gorge.httpclient import Cause, TransportFailure
from gorge.webhook.poster import MalformedResponse, ResponseParser, request_bytes
from gorge.webhook.transport import Transport
from gorge.webhook.uripolicy import Target, UriPolicy

# -- the parser ---------------------------------------------------------------

token = st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).filter(
    lambda name: name not in ("content-length", "transfer-encoding", "connection")
)
value = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=0, max_size=20).map(
    str.strip
)


@st.composite
def answers(draw):
    """(wire bytes, status, headers as a receiver would read them, framed, persistent)."""
    status = draw(st.sampled_from([200, 201, 204, 301, 304, 307, 404, 410, 429, 500, 503]))
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.0"]))
    fields = draw(st.lists(st.tuples(token, value), max_size=5))
    body = draw(st.binary(max_size=300))
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    close = draw(st.booleans())
    interim = draw(st.booleans())
    separator = draw(st.sampled_from(["\r\n", "\n"]))
    lines = [f"{version} {status} Whatever"]
    lines += [f"{name}: {text}" for name, text in fields]
    no_body = status in (204, 304)
    if no_body:
        body = b""
    if framing == "length" and not no_body:
        lines.append(f"Content-Length: {len(body)}")
    if framing == "chunked" and not no_body:
        lines.append("Transfer-Encoding: chunked")
    if close:
        lines.append("Connection: close")
    head = (separator.join(lines) + separator + separator).encode("latin-1")
    if framing == "chunked" and not no_body:
        cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=4)))
        pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
        encoded = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(piece), piece) for piece in pieces if piece)
        body_bytes = encoded + b"0\r\nTrailer: x\r\n\r\n"
    else:
        body_bytes = body
    wire = head + body_bytes
    if interim:
        wire = b"HTTP/1.1 100 Continue\r\nX-Early: 1\r\n\r\n" + wire
    headers: dict[str, str] = {}
    for name, text in fields:
        headers[name] = text
    framed = no_body or framing != "close"
    persistent = version == "HTTP/1.1" and not close and framed
    return wire, status, headers, framed, persistent


def feed_in_pieces(parser: ResponseParser, wire: bytes, cuts: list[int]) -> bool:
    done = False
    for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        done = parser.feed(wire[a:b])
    return done


@settings(max_examples=400, deadline=None)
@given(answer=answers(), data=st.data())
def test_every_answer_parses_the_same_however_it_is_split(answer, data):
    wire, status, headers, framed, persistent = answer
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    parser = ResponseParser()
    done = feed_in_pieces(parser, wire, cuts)
    assert parser.status == status
    assert {k: v for k, v in parser.headers.items() if k in headers} == headers
    if framed:
        assert done and not parser.extra
        assert parser.reusable == persistent
    else:
        # The body ends with the connection.
        assert not done and not parser.reusable
        reply = parser.lost(Failure(error.ConnectionDone()))
        assert reply.status == status and reply.body_failure is None


@settings(max_examples=200, deadline=None)
@given(answer=answers(), data=st.data())
def test_a_connection_lost_before_the_end_says_where(answer, data):
    wire, status, _headers, framed, _persistent = answer
    cut = data.draw(st.integers(0, len(wire) - 1))
    reason = data.draw(st.sampled_from([error.ConnectionDone(), error.ConnectionLost()]))
    parser = ResponseParser()
    if parser.feed(wire[:cut]):
        return  # the part before the cut was already a whole answer
    if parser.in_head:
        with pytest.raises(TransportFailure) as raised:
            parser.lost(Failure(reason))
        if cut == 0:
            expected = (
                Cause.EMPTY_REPLY if isinstance(reason, error.ConnectionDone) else Cause.RESET
            )
        else:
            expected = Cause.HEAD_CUT
        assert raised.value.cause is expected
        return
    reply = parser.lost(Failure(reason))
    assert reply.status == status
    if framed:
        assert reply.body_failure is not None and reply.body_failure.cause is Cause.BODY_CUT
    else:
        assert reply.body_failure is None


def test_bytes_after_the_end_make_the_connection_unusable():
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA")
    assert parser.reusable and parser.extra


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 OK\r\n\r\n",
        b"SPDY/3 200 OK\r\n\r\n",
        b"HTTP/1.1\r\n\r\n",
        b"HTTP/1.1 099 Low\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n folded first\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1e3\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokX\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * (70 * 1024),
    ],
)
def test_a_malformed_answer_is_refused(wire):
    with pytest.raises(MalformedResponse):
        ResponseParser().feed(wire)


def test_folded_header_lines_join_the_value_before():
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.1 307 Moved\r\nLocation: /a\r\n  /b\r\nContent-Length: 0\r\n\r\n")
    assert parser.headers["location"] == "/a /b"


def test_the_last_of_repeated_headers_wins_and_names_are_lower_case():
    parser = ResponseParser()
    parser.feed(
        b"HTTP/1.1 429 Slow\r\nRetry-After: 5\r\nRETRY-AFTER: 7\r\nContent-Length: 0\r\n\r\n"
    )
    assert parser.headers["retry-after"] == "7"


def test_both_framings_go_by_chunked_and_close_after():
    parser = ResponseParser()
    wire = (
        b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\nok\r\n0\r\n\r\n"
    )
    assert parser.feed(wire) and not parser.reusable


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


class _Scripted(Protocol):
    def connectionMade(self):
        self.factory.connections.append(self)
        self.received = b""

    def dataReceived(self, data):
        self.received += data
        while b"\r\n\r\n" in self.received:
            head, _, rest = self.received.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(rest) < length:
                return
            self.received = rest[length:]
            self.factory.requests.append(head + b"\r\n\r\n" + rest[:length])
            answer, hang_up = self.factory.answers.pop(0)
            self.transport.write(answer)
            if hang_up:
                self.transport.loseConnection()

    def connectionLost(self, reason):
        self.factory.closed.append(self)
        for waiter in self.factory.close_waiters:
            if not waiter.called:
                waiter.callback(None)


class _ScriptedFactory(Factory):
    protocol = _Scripted
    noisy = False

    def __init__(self):
        self.connections: list[_Scripted] = []
        self.closed: list[_Scripted] = []
        self.requests: list[bytes] = []
        self.answers: list[tuple[bytes, bool]] = []
        self.close_waiters: list[Deferred] = []

    def closing(self) -> Deferred:
        waiter: Deferred = Deferred()
        self.close_waiters.append(waiter)
        return waiter


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@pytest.fixture
def scripted():
    factory = _ScriptedFactory()
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    yield factory, port.getHost().port
    for connection in factory.connections:
        connection.transport.abortConnection()
    port.stopListening()


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
