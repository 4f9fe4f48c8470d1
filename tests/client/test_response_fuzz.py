"""Fuzzing the kept-alive client's answer parser: generated answers read as
h11 reads them, and answers mutated from real ones never raise anything but
the parser's own refusals, however the bytes arrive.

Bounded so the suite stays fast; bench/fuzz/ runs the same properties longer."""

from __future__ import annotations

import h11
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import error
from twisted.python.failure import Failure

from gorge.client.failure import BodyTooLarge, TransportFailure
from gorge.client.keepalive import MalformedResponse, ResponseParser
from tests.client.test_keepalive import answers
from tests.support.fuzzing import fuzz_settings
from tests.web.test_request_fuzz import mutated

KEEP = 4096


def h11_reading(wire: bytes, framed: bool) -> tuple:
    """(status, fields, body, persistent) as h11 reads ``wire``, the answer
    to a POST."""
    connection = h11.Connection(h11.CLIENT)
    connection.send(
        h11.Request(method="POST", target="/", headers=[("Host", "x"), ("Content-Length", "0")])
    )
    connection.send(h11.EndOfMessage())
    connection.receive_data(wire)
    if not framed:
        connection.receive_data(b"")  # the body ends with the connection
    status, fields, body = 0, {}, b""
    while True:
        event = connection.next_event()
        if isinstance(event, h11.Response):
            status = event.status_code
            fields = {
                name.decode("latin-1"): value.decode("latin-1") for name, value in event.headers
            }
        elif isinstance(event, h11.Data):
            body += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
            break
    # A body that ended with the connection leaves nothing to keep.
    persistent = framed and connection.our_state is h11.DONE and connection.their_state is h11.DONE
    return status, fields, body, persistent


def our_reading(wire: bytes, cuts: list[int]) -> tuple:
    parser = ResponseParser(keep=KEEP)
    done = False
    for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        done = parser.feed(wire[a:b])
    if done:
        reply = parser.reply()
    else:
        reply = parser.lost(Failure(error.ConnectionDone()))
    persistent = done and parser.reusable and not parser.extra
    return reply.status, dict(reply.headers), reply.body, persistent


@fuzz_settings(300)
@given(answer=answers(), data=st.data())
def test_a_generated_answer_reads_as_h11_reads_it(answer, data):
    wire, _, _, framed, _, _ = answer
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=4)))
    status, fields, body, persistent = our_reading(wire, cuts)
    expected = h11_reading(wire, framed)
    assert (status, body, persistent) == (expected[0], expected[2], expected[3])
    # Every field h11 saw, with its last value (h11 keeps Content-Length and
    # Transfer-Encoding as it reads them; they are framing, compared above).
    for name, value in expected[1].items():
        if name not in ("content-length", "transfer-encoding"):
            assert fields[name] == value


# Answers as they come back: the queue's lease answer, a webhook receiver's
# chunked 202, a 100 then a 200, an HTTP/1.0 answer that ends with the
# connection, a 413 from a proxy.
CAPTURED = [
    b"HTTP/1.1 200 OK\r\nX-Request-Id: 5d0c4b7e9a1f4e3c8b2a6d9e0f1a2b3c\r\n"
    b"Server: TwistedWeb/26.10.0\r\nDate: Thu, 03 Dec 2026 11:00:00 GMT\r\n"
    b'Content-Type: application/json\r\nContent-Length: 21\r\n\r\n{"data":[{"id":41}]}\n',
    b"HTTP/1.1 202 Accepted\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nqueue\r\n3;x=1\r\nd!!\r\n0\r\nX-Trailer: 1\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\n\r\n<html>ok</html>",
    b"HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
]


@fuzz_settings(400)
@given(wire=mutated(CAPTURED), data=st.data())
def test_a_mutated_answer_raises_only_the_parsers_refusals_however_split(wire, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=4)))
    outcomes = []
    for pieces in ([], cuts):
        try:
            outcome: object = our_reading(wire, pieces)[:3]
        except (MalformedResponse, BodyTooLarge, TransportFailure) as refused:
            outcome = type(refused)
        outcomes.append(outcome)
    assert outcomes[0] == outcomes[1]
