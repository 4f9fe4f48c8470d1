"""Fuzzing the inbound readers: requests mutated from real ones must get the
same answer from the hot channel as from twisted.web's channel, and plain
requests must mean to the hot channel what they mean to h11.

Bounded (a few hundred examples each) so the suite stays fast; the harness
in bench/fuzz/ runs the same properties for as long as it is told."""

from __future__ import annotations

import h11
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.testing import StringTransport

from gorge.web.hotchannel import HotChannel, HotRequest
from tests.support.fuzzing import fuzz_settings
from tests.web.test_hotchannel import ECHO, PEER, cut, exchange, plain_requests, request

# Requests as clients send them: a worker's lease and report calls (the
# queue's busiest), a producer's enqueue, a probe, a chunked body, a close.
CAPTURED = [
    b"POST /api/hot/echo HTTP/1.1\r\nConnection: keep-alive\r\nHost: 127.0.0.1:8090\r\n"
    b"User-Agent: gorge-worker\r\nContent-Type: application/json\r\n"
    b"X-Service-Token: hot-token\r\nX-Lease-Owner: host-1:4242:1\r\n"
    b"X-Request-Id: 5d0c4b7e9a1f4e3c8b2a6d9e0f1a2b3c\r\nContent-Length: 32\r\n\r\n"
    b'{"limit":10,"leaseSeconds":7200}',
    b"POST /api/hot/echo HTTP/1.1\r\nHost: 127.0.0.1:8090\r\nX-Service-Token: hot-token\r\n"
    b'Content-Length: 29\r\n\r\n{"taskID":41,"result":"done"}',
    b"POST /api/hot/echo HTTP/1.1\r\nHost: gorge-taskqueue:8090\r\nAccept: */*\r\n"
    b"X-Service-Token: hot-token\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b'Content-Length: 50\r\n\r\n{"taskClass":"PhabricatorSearchWorker","data":{}}',
    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    b"POST /api/hot/echo HTTP/1.1\r\nX-Service-Token: hot-token\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
]

# Bytes that matter to an HTTP/1.1 reader.
SPECIAL = [b"\r\n", b"\r", b"\n", b" ", b"\t", b"\x00", b":", b",", b"0", b"9", b"-", b"\x7f"]
SPECIAL += [b"\xff", b"Content-Length: 2\r\n", b"Transfer-Encoding: chunked\r\n"]
SPECIAL += [b"Connection: close\r\n", b"Expect: 100-continue\r\n", b"HTTP/1.0", b"post"]
# Whole field lines, put in at a line's start.
FIELDS = [
    b"Connection: close",
    b"Connection: keep-alive",
    b"Connection: Keep-Alive, close",
    b"Content-Length: 2",
    b"Content-Length: 32",
    b"Content-Length: 0",
    b"Content-Length: 99999999999999999999999",
    b"Transfer-Encoding: chunked",
    b"Transfer-Encoding: identity",
    b"X-Service-Token: hot-token",
    b"X-Service-Token: wrong",
    b"X-Lease-Owner: other",
    b" folded",
    b"Host: a, b",
]


@st.composite
def mutated(draw, seeds: list[bytes]) -> bytes:
    """A captured message with a few byte-level mutations: bytes replaced,
    inserted, dropped, case flipped, a line doubled or removed."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        op = draw(
            # Fields most often: their repeats and mixes are what readers disagree on.
            st.sampled_from(["replace", "insert", "delete", "case", "line", "drop"] + ["field"] * 4)
        )
        if op == "replace":
            data[at : at + 1] = draw(st.sampled_from(SPECIAL) | st.binary(min_size=1, max_size=1))
        elif op == "insert":
            data[at:at] = draw(st.sampled_from(SPECIAL))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 4))]
        elif op == "case":
            data[at : at + 8] = bytes(data[at : at + 8]).swapcase()
        else:
            lines = bytes(data).split(b"\r\n")
            index = at % len(lines)
            if op == "field":
                lines.insert(1 + index % 3, draw(st.sampled_from(FIELDS)))
            elif op == "line":
                lines.insert(index, lines[index])
            else:
                del lines[index]
            data = bytearray(b"\r\n".join(lines))
    return bytes(data)


@fuzz_settings(300)
@given(
    st.lists(mutated(CAPTURED), min_size=1, max_size=3),
    st.lists(st.integers(min_value=0), max_size=5),
)
def test_a_mutated_request_gets_the_twisted_web_answer_to_the_byte(requests, points):
    data = b"".join(requests) + request(body=b'{"after":1}')
    hot = exchange(True, cut(data, points))
    plain = exchange(False, [data])
    assert hot == plain
    # Nothing reached an unhandled exception on either channel.
    assert not [name for name, _, _ in hot[2] if name not in ("REQUEST", "PANIC_RECOVERED")]


# -- the same meaning as h11


class Recorder(HotChannel):
    """A hot channel that notes what it read of each request."""

    routes = frozenset({ECHO})

    def __init__(self) -> None:
        super().__init__()
        self.read: list[tuple] = []
        self.handed = False

    def process(self, request: HotRequest) -> None:
        fields = {name: value for name, value in request._fields.items()}
        self.read.append((request.path, fields, request.content.read(), request.close))
        self.respond(request, b"")

    def fallback(self):
        self.handed = True
        return _Sink()


class _Sink:
    def makeConnection(self, transport) -> None:
        pass

    def dataReceived(self, data: bytes) -> None:
        pass

    def connectionLost(self, reason) -> None:
        pass


def h11_reading(data: bytes) -> list[tuple]:
    """What h11 reads: per request its target, fields (lower-cased, the last
    of repeated ones, a close in any Connection field kept), body and close."""
    connection = h11.Connection(h11.SERVER)
    connection.receive_data(data)
    read: list[tuple] = []
    target, fields, body, close = b"", {}, b"", False
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA or event is h11.PAUSED:
            break
        if isinstance(event, h11.Request):
            target, fields, body, close = event.target, {}, b"", False
            for name, value in event.headers:
                if name == b"connection":
                    value = value.lower()
                    close = close or value == b"close"
                    if fields.get(name) == b"close":
                        continue
                fields[name] = value
        elif isinstance(event, h11.Data):
            body += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
            read.append((target, fields, body, close))
            connection.send(h11.Response(status_code=200, headers=[("Content-Length", "0")]))
            connection.send(h11.EndOfMessage())
            if connection.our_state is not h11.DONE:
                break
            connection.start_next_cycle()
    return read


@fuzz_settings(300)
@given(st.lists(plain_requests, min_size=1, max_size=3), st.lists(st.integers(0), max_size=5))
def test_a_plain_request_means_to_the_hot_channel_what_it_means_to_h11(requests, points):
    data = b"".join(requests)
    channel = Recorder()
    channel.makeConnection(StringTransport(peerAddress=PEER))
    for piece in cut(data, points):
        channel.dataReceived(piece)
    expected = h11_reading(data)
    if channel.handed:
        # A request for another path (a query, a slash): twisted.web's.
        assert channel.read == expected[: len(channel.read)]
        assert any(target != ECHO for target, *_ in expected[len(channel.read) :])
    else:
        assert channel.read == expected
