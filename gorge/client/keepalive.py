"""Kept-alive HTTP/1.1 connections, for the senders whose requests are known
bytes and whose answers need only their status, headers and (bounded) body.

Twisted's ``Agent`` builds a request object, a header map, a body producer,
a response object with its own body protocol and a pooled-connection record
for every exchange: about 0.7 ms of CPU per request, most of what a webhook
delivery cost. Here a request is one write of bytes and the answer one
incremental parse (:class:`ResponseParser`) on a connection kept per origin
(:class:`ConnectionPool`).

An exchange ends with what :mod:`gorge.httpclient` says for the other
senders: a :class:`~gorge.httpclient.Reply`, or a
:class:`~gorge.httpclient.TransportFailure` whose :class:`~gorge.httpclient.Cause`
each caller maps to its own vocabulary. The framing rules are HTTP/1.1's
(RFC 9112): no body after 1xx, 204 and 304; chunked when the last transfer
coding is ``chunked``; else ``Content-Length``; else the body ends when the
connection does. Interim 1xx answers are skipped. A connection is reused only
after an HTTP/1.1 answer without ``Connection: close`` whose end was framed."""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from typing import Any, cast

from twisted.internet import error
from twisted.internet.defer import Deferred, DeferredList, fail
from twisted.internet.interfaces import IDelayedCall, ITCPTransport
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.python.failure import Failure

from gorge.client.exchange import Reply
from gorge.client.failure import BodyTooLarge, Cause, TransportFailure, tls_cause

__all__ = [
    "Connect",
    "ConnectionPool",
    "IDLE_TIMEOUT",
    "MalformedResponse",
    "ResponseParser",
    "host_line",
]

#: Status line and headers together; a longer head is refused.
MAX_HEAD = 64 * 1024
#: An idle connection is closed after this long (Twisted's pool keeps 240 s).
IDLE_TIMEOUT = 240.0

_STATUS_CODE = re.compile(rb"[0-9]{3}")
_VERSION = re.compile(rb"HTTP/([0-9])\.([0-9])")
_HEX_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")

#: Opens a connection for the pool: ``connect(factory)`` fires with the protocol
#: the factory built (an endpoint's ``connect``).
Connect = Callable[[Factory], "Deferred[Any]"]


class MalformedResponse(ValueError):
    """The answer broke HTTP/1.1's syntax."""


def host_line(netloc: str, scheme: str, port: int) -> str:
    """The ``Host`` value for a URI's authority: its host as written (case
    kept, IPv6 in brackets), with the port unless it is the scheme's default
    (what Twisted's Agent sends)."""
    hostport = netloc.rpartition("@")[2]
    if hostport.startswith("[") and "]" in hostport:
        host = hostport[: hostport.index("]") + 1]
    else:
        host = hostport.partition(":")[0]
    return host if (scheme, port) in (("http", 80), ("https", 443)) else f"{host}:{port}"


# ---------------------------------------------------------------- the answer

_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE, _DONE = range(8)


class ResponseParser:
    """One answer, fed in whatever pieces the connection delivers.

    :meth:`feed` returns True once the answer is complete; :meth:`lost` says
    what a connection that ended before that leaves the caller with.
    """

    def __init__(self, keep: int | None = None) -> None:
        """``keep``: body bytes kept for :meth:`reply` (one more raises
        :class:`~gorge.httpclient.BodyTooLarge`); None keeps none."""
        self._keep = keep
        self._parts: list[bytes] = []
        self._kept = 0
        self._buffer = b""
        self._state = _HEAD
        self._head_bytes = 0
        self._remaining = 0  # body bytes, or bytes of the current chunk
        self.got_bytes = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.reusable = False
        self.extra = False  # bytes arrived after the end of the answer

    @property
    def in_head(self) -> bool:
        return self._state == _HEAD

    def reply(self) -> Reply:
        return Reply(self.status, self.headers, b"".join(self._parts))

    def _body(self, data: bytes) -> None:
        if self._keep is None or not data:
            return
        self._kept += len(data)
        if self._kept > self._keep:
            raise BodyTooLarge(self._keep)
        self._parts.append(data)

    def feed(self, data: bytes) -> bool:
        """Take the next bytes; True when the answer is complete.

        Raises :class:`MalformedResponse` for an answer that breaks the syntax
        and :class:`~gorge.httpclient.BodyTooLarge` for a body over ``keep``.
        """
        if not data:
            return self._state == _DONE
        self.got_bytes = True
        if self._state == _DONE:
            self.extra = True
            return True
        if self._buffer:
            data = self._buffer + data
            self._buffer = b""
        position = 0
        while position < len(data) or self._state == _DONE:
            state = self._state
            if state == _DONE:
                if position < len(data):
                    self.extra = True
                return True
            if state == _HEAD:
                position = self._read_head(data, position)
                if position < 0:
                    return False
            elif state == _LENGTH or state == _CHUNK_DATA:
                position = self._counted(data, position)
                if not self._remaining:
                    self._state = _DONE if state == _LENGTH else _CHUNK_END
            elif state == _UNTIL_CLOSE:
                self._body(data[position:])
                return False
            else:
                line_end = data.find(b"\n", position)
                if line_end < 0:
                    self._hold(data[position:])
                    return False
                line = data[position:line_end].rstrip(b"\r")
                position = line_end + 1
                self._chunk_line(line)
        return self._state == _DONE

    def _counted(self, data: bytes, position: int) -> int:
        """Body bytes of a known length (the body's, or a chunk's) from
        ``position``; the position after them."""
        taken = min(self._remaining, len(data) - position)
        self._body(data[position : position + taken])
        self._remaining -= taken
        return position + taken

    def _hold(self, rest: bytes) -> None:
        if len(rest) > MAX_HEAD:
            raise MalformedResponse("a line longer than the limit")
        self._buffer = rest

    def _read_head(self, data: bytes, position: int) -> int:
        """Header lines from ``position``; the position after the head, or -1
        when more bytes are needed (what is left is kept)."""
        while True:
            line_end = data.find(b"\n", position)
            if line_end < 0:
                rest = data[position:]
                if self._head_bytes + len(rest) > MAX_HEAD:
                    raise MalformedResponse("response head over the limit")
                self._buffer = rest
                return -1
            self._head_bytes += line_end + 1 - position
            if self._head_bytes > MAX_HEAD:
                raise MalformedResponse("response head over the limit")
            line = data[position:line_end].rstrip(b"\r")
            position = line_end + 1
            if not self.status:
                self._status_line(line)
            elif line:
                self._header_line(line)
            else:
                self._end_of_head()
                if self._state != _HEAD:
                    return position

    def _status_line(self, line: bytes) -> None:
        parts = line.split(b" ", 2)
        if len(parts) < 2:
            raise MalformedResponse(f"bad status line {line[:80]!r}")
        version = _VERSION.fullmatch(parts[0])
        if version is None or not _STATUS_CODE.fullmatch(parts[1]):
            raise MalformedResponse(f"bad status line {line[:80]!r}")
        self._version = (int(version.group(1)), int(version.group(2)))
        self.status = int(parts[1])
        if self.status < 100:
            raise MalformedResponse(f"bad status code {self.status}")
        self._fields: list[tuple[str, str]] = []

    def _header_line(self, line: bytes) -> None:
        if line[:1] in (b" ", b"\t"):  # obsolete folding: part of the previous value
            if not self._fields:
                raise MalformedResponse("a continuation line before any header")
            folded, before = self._fields[-1]
            more = line.strip(b" \t").decode("latin-1")
            self._fields[-1] = (folded, f"{before} {more}")
            return
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise MalformedResponse(f"bad header line {line[:80]!r}")
        self._fields.append((name.decode("latin-1").lower(), value.strip(b" \t").decode("latin-1")))

    def _end_of_head(self) -> None:
        status = self.status
        if 100 <= status < 200 and status != 101:
            self.status = 0  # an interim answer: the final one follows
            self._head_bytes = 0
            return
        headers: dict[str, str] = {}
        lengths: set[str] = set()
        codings = ""
        close = False
        for name, value in self._fields:
            headers[name] = value
            if name == "content-length":
                lengths.update(v.strip() for v in value.split(","))
            elif name == "transfer-encoding":
                codings = value
            elif name == "connection":
                close = close or "close" in (t.strip().lower() for t in value.split(","))
        self.headers = headers
        persistent = self._version == (1, 1) and not close and status != 101
        if status in (101, 204, 304) or 100 <= status < 200:
            self._state = _DONE
        elif codings:
            if lengths:
                persistent = False  # both framings: close after it (RFC 9112, 6.3)
            if codings.rsplit(",", 1)[-1].strip().lower() == "chunked":
                self._state = _CHUNK_SIZE
            else:
                self._state = _UNTIL_CLOSE
                persistent = False
        elif lengths:
            if len(lengths) > 1:
                raise MalformedResponse("conflicting Content-Length headers")
            (length,) = lengths
            if not length.isdigit() or not length.isascii():
                raise MalformedResponse(f"bad Content-Length {length[:40]!r}")
            self._remaining = int(length)
            self._state = _LENGTH if self._remaining else _DONE
        else:
            self._state = _UNTIL_CLOSE
            persistent = False
        self.reusable = persistent

    def _chunk_line(self, line: bytes) -> None:
        state = self._state
        if state == _CHUNK_SIZE:
            size = line.split(b";", 1)[0].strip(b" \t")
            if not _HEX_SIZE.fullmatch(size):
                raise MalformedResponse(f"bad chunk size {size[:20]!r}")
            self._remaining = int(size, 16)
            self._state = _CHUNK_DATA if self._remaining else _TRAILERS
        elif state == _CHUNK_END:
            if line:
                raise MalformedResponse("chunk data longer than its size")
            self._state = _CHUNK_SIZE
        elif not line:  # _TRAILERS: they end with an empty line
            self._state = _DONE

    def lost(self, reason: Failure) -> Reply:
        """The connection ended before :meth:`feed` said the answer was complete:
        the reply (a body that ends with the connection), or raise why not."""
        tls = tls_cause(reason.value) if reason.value is not None else None
        if self._state == _HEAD:
            if tls is not None:
                cause = tls
            elif not self.got_bytes:
                cause = Cause.EMPTY_REPLY if reason.check(error.ConnectionDone) else Cause.RESET
            else:
                cause = Cause.HEAD_CUT
            raise TransportFailure(cause, reason.value, submitted=True)
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE
            return self.reply()
        failure = TransportFailure(tls or Cause.BODY_CUT, reason.value, submitted=True)
        return Reply(self.status, self.headers, None, failure)


# ---------------------------------------------------------------- connections


class _Connection(Protocol):
    """One connection: at most one exchange at a time, idle in its pool between."""

    def __init__(self, pool: ConnectionPool, key: Hashable) -> None:
        self._pool = pool
        self.key = key
        self._waiting: Deferred[Reply] | None = None
        self._parser: ResponseParser | None = None
        self.idle_since = 0.0
        self.closed: Deferred[None] = Deferred()
        self.lost = False

    def send(self, request: bytes, keep: int | None) -> Deferred[Reply]:
        if self.lost:  # closed between being opened and this request
            return fail(TransportFailure(Cause.RESET, error.ConnectionLost()))
        waiting: Deferred[Reply] = Deferred(self._cancel)
        self._waiting = waiting
        self._parser = ResponseParser(keep)
        self._wire.write(request)
        return waiting

    @property
    def _wire(self) -> ITCPTransport:
        return cast(ITCPTransport, self.transport)

    def hang_up(self) -> None:
        self._wire.loseConnection()

    def _cancel(self, waiting: Deferred) -> None:
        # The deadline or a shutdown: the connection is in an unknown state.
        self._waiting = None
        self._wire.abortConnection()

    def dataReceived(self, data: bytes) -> None:
        parser, waiting = self._parser, self._waiting
        if parser is None or waiting is None:
            # Bytes nobody asked for: the server is not speaking HTTP/1.1 to us.
            self._wire.abortConnection()
            return
        try:
            complete = parser.feed(data)
        except (MalformedResponse, BodyTooLarge) as e:
            self._finish()
            self._wire.abortConnection()
            if parser.in_head:
                waiting.errback(TransportFailure(Cause.OTHER, e, submitted=True))
            else:
                cause = Cause.BODY_TOO_LARGE if isinstance(e, BodyTooLarge) else Cause.BODY_CUT
                body_failure = TransportFailure(cause, e, submitted=True)
                waiting.callback(Reply(parser.status, parser.headers, None, body_failure))
            return
        if not complete:
            return
        self._finish()
        if parser.reusable and not parser.extra:
            self._pool.release(self)
        else:
            self.hang_up()
        waiting.callback(parser.reply())

    def _finish(self) -> None:
        self._waiting = None
        self._parser = None

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.lost = True
        self._pool.forget(self)
        parser, waiting = self._parser, self._waiting
        self._finish()
        if waiting is not None and parser is not None:
            try:
                reply = parser.lost(reason)
            except TransportFailure as e:
                waiting.errback(e)
            else:
                waiting.callback(reply)
        self.closed.callback(None)


class _ConnectionFactory(Factory):
    noisy = False  # the pool opens connections all the time: no "Starting factory" lines

    def __init__(self, pool: ConnectionPool, key: Hashable) -> None:
        self._pool = pool
        self._key = key

    def buildProtocol(self, addr: Any) -> _Connection:
        connection = _Connection(self._pool, self._key)
        connection.factory = self
        return connection


class ConnectionPool:
    """Connections kept per key (an origin, as the caller defines it), at most
    ``max_idle`` idle ones per key, closed after ``IDLE_TIMEOUT`` unused.

    A request is never sent twice: a kept connection the server had closed
    meanwhile ends the exchange as an empty reply, as with Twisted's pool
    when it does not retry.
    """

    def __init__(self, reactor: Any, *, max_idle: int) -> None:
        self._reactor = reactor
        self._max_idle = max_idle
        self._idle: dict[Hashable, list[_Connection]] = {}
        self._sweep: IDelayedCall | None = None
        self._closed = False

    async def request(
        self, key: Hashable, connect: Connect, request: bytes, *, keep: int | None = None
    ) -> Reply:
        """Send ``request`` (the whole request, bytes as they go on the wire) over
        a kept connection of ``key``, or one ``connect`` opens; the answer's
        body is kept up to ``keep`` bytes (None: read and dropped).

        Cancelling the awaiting Deferred aborts the connection.
        """
        connection = self._take_idle(key)
        if connection is None:
            opened = await connect(_ConnectionFactory(self, key))
            connection = cast(_Connection, opened)
        return await connection.send(request, keep)

    def _take_idle(self, key: Hashable) -> _Connection | None:
        idle = self._idle.get(key)
        if idle is None:
            return None
        now = self._reactor.seconds()
        found = None
        while idle and found is None:
            connection = idle.pop()
            if not connection.lost and now - connection.idle_since < IDLE_TIMEOUT:
                found = connection
            else:
                connection.hang_up()
        if not idle:
            del self._idle[key]  # a sender may talk to any number of origins
        return found

    def release(self, connection: _Connection) -> None:
        """An exchange ended cleanly: keep the connection for the next one."""
        if self._closed:
            connection.hang_up()
            return
        idle = self._idle.setdefault(connection.key, [])
        if len(idle) >= self._max_idle:
            connection.hang_up()
            return
        connection.idle_since = self._reactor.seconds()
        idle.append(connection)
        if self._sweep is None:
            self._sweep = self._reactor.callLater(IDLE_TIMEOUT, self._close_stale)

    def forget(self, connection: _Connection) -> None:
        idle = self._idle.get(connection.key)
        if idle and connection in idle:
            idle.remove(connection)
            if not idle:
                del self._idle[connection.key]

    def _close_stale(self) -> None:
        self._sweep = None
        cutoff = self._reactor.seconds() - IDLE_TIMEOUT
        for idle in list(self._idle.values()):
            for connection in [c for c in idle if c.idle_since <= cutoff]:
                connection.hang_up()
        if any(self._idle.values()):
            self._sweep = self._reactor.callLater(IDLE_TIMEOUT, self._close_stale)

    def close(self) -> Deferred:
        """Close every idle connection; fires once they are closed. Exchanges
        still running are the caller's to cancel first; one that ends later
        is closed then."""
        self._closed = True
        if self._sweep is not None and self._sweep.active():
            self._sweep.cancel()
        self._sweep = None
        closing = [c for idle in self._idle.values() for c in idle]
        self._idle.clear()
        for connection in closing:
            connection.hang_up()
        return DeferredList([c.closed for c in closing], consumeErrors=True)
