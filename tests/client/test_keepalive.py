"""The kept-alive HTTP/1.1 client's answer parser, on all inputs and however
the bytes arrive."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import error
from twisted.python.failure import Failure

from gorge.client.failure import BodyTooLarge, Cause, TransportFailure
from gorge.client.keepalive import MalformedResponse, ResponseParser

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
    return wire, status, headers, framed, persistent, body


def feed_in_pieces(parser: ResponseParser, wire: bytes, cuts: list[int]) -> bool:
    done = False
    for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        done = parser.feed(wire[a:b])
    return done


@settings(max_examples=400, deadline=None)
@given(answer=answers(), data=st.data())
def test_every_answer_parses_the_same_however_it_is_split(answer, data):
    wire, status, headers, framed, persistent, body = answer
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    keep = data.draw(st.none() | st.just(len(body)) | st.integers(len(body), 1000))
    parser = ResponseParser(keep)
    done = feed_in_pieces(parser, wire, cuts)
    assert parser.status == status
    assert {k: v for k, v in parser.headers.items() if k in headers} == headers
    if framed:
        assert done and not parser.extra
        assert parser.reusable == persistent
        reply = parser.reply()
    else:
        # The body ends with the connection.
        assert not done and not parser.reusable
        reply = parser.lost(Failure(error.ConnectionDone()))
        assert reply.status == status and reply.body_failure is None
    assert reply.body == (b"" if keep is None else body)


@settings(max_examples=200, deadline=None)
@given(answer=answers(), data=st.data())
def test_a_body_over_the_limit_is_refused(answer, data):
    wire, _status, _headers, _framed, _persistent, body = answer
    if not body:
        return
    keep = data.draw(st.integers(0, len(body) - 1))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    with pytest.raises(BodyTooLarge):
        feed_in_pieces(ResponseParser(keep), wire, cuts)


@settings(max_examples=200, deadline=None)
@given(answer=answers(), data=st.data())
def test_a_connection_lost_before_the_end_says_where(answer, data):
    wire, status, _headers, framed, _persistent, _body = answer
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
    # The fold and its blanks become spaces (RFC 9112, 5.2).
    assert parser.headers["location"] == "/a  /b"


def test_the_last_of_repeated_headers_wins_and_names_are_lower_case():
    parser = ResponseParser()
    parser.feed(
        b"HTTP/1.1 429 Slow\r\nRetry-After: 5\r\nRETRY-AFTER: 7\r\nContent-Length: 0\r\n\r\n"
    )
    assert parser.headers["retry-after"] == "7"


@pytest.mark.parametrize(
    "fields",
    [
        b"Content-Length: 99\r\nTransfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: chunked\r\nContent-Length: 99\r\n",
        b"Content-Length: 2\r\nContent-Length: 3\r\n",
        b"Content-Length: 2\r\nContent-Length: 2\r\n",
        b"Content-Length: 2, 2\r\n",
    ],
)
def test_an_answer_framed_two_ways_is_refused(fields):
    # RFC 9112, 6.3: such an answer "ought to be handled as an error"; a
    # proxy on the way may have read it otherwise.
    with pytest.raises(MalformedResponse):
        ResponseParser().feed(b"HTTP/1.1 200 OK\r\n" + fields + b"\r\n2\r\nok\r\n0\r\n\r\n")


def test_repeated_transfer_encoding_fields_are_one_list():
    # "chunked" in the last field is the last coding: the body is chunked.
    parser = ResponseParser(keep=100)
    wire = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\nok\r\n0\r\n\r\n"
    )
    assert parser.feed(wire) and parser.reusable and parser.reply().body == b"ok"
    # "chunked" first and another coding after it: the body runs to the close.
    parser = ResponseParser(keep=100)
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\nraw"
    assert not parser.feed(wire) and not parser.reusable
    assert parser.lost(Failure(error.ConnectionDone())).body == b"raw"


@pytest.mark.parametrize(
    "length,refusal",
    [(b"65", BodyTooLarge), (b"9" * 30, MalformedResponse), (b"9" * 5000, MalformedResponse)],
)
def test_a_declared_body_over_the_limit_is_refused_at_once(length, refusal):
    # Before a byte of the body; a length past 2**64 is malformed (llhttp).
    parser = ResponseParser(keep=64)
    with pytest.raises(refusal):
        parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: " + length + b"\r\n\r\n")


def test_a_long_length_of_zeros_is_a_small_number():
    parser = ResponseParser(keep=64)
    assert parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: " + b"0" * 5000 + b"2\r\n\r\nok")
    assert parser.reply().body == b"ok"
