"""An HTTP/1.1 server channel that answers a service's hot routes itself.

twisted.web builds a ``Request`` with its header objects, producers and
notifications for every request, about a quarter of a millisecond of CPU: on
the queue's busiest calls (a worker's lease and report, a few hundred bytes
each way) that is more than the work behind them. :class:`HotChannel` reads a
plain request, a ``POST`` to one of a few exact paths with a
``Content-Length`` body, and hands it to :meth:`HotChannel.process` as a
:class:`HotRequest`, which offers the part of ``Request`` that the routes use.

Anything else (another method or path, a query, ``Transfer-Encoding``,
``Expect``, HTTP/1.0, a body over the limit, a head it does not read as
plain) goes to a twisted.web channel, with the bytes already read, and that
connection stays with twisted.web to its end. So every unusual request still
gets twisted.web's answer, and the hot channel only has to be right about the
plain ones."""

from __future__ import annotations

import functools
from collections.abc import Callable, Container
from io import BytesIO
from typing import Any

import httptools
from twisted.internet import tcp
from twisted.internet.interfaces import IDelayedCall, ITCPTransport
from twisted.internet.protocol import Protocol, connectionDone
from twisted.python.failure import Failure
from twisted.web.http import RESPONSES

from gorge.app.private_names import unsent_writes

__all__ = ["HotChannel", "HotRequest", "MAX_HEAD", "write_now"]

#: The longest request head read here; a longer one goes to twisted.web.
MAX_HEAD = 16 * 1024

# Keys of a _Head no field name can be (names are tokens: no spaces): the
# target, and the mark of a Connection field this channel does not read.
_URL = b" url"
_OTHER_CONNECTION = b" other connection"


class _Head(dict[bytes, bytes]):
    """llhttp's callbacks for one request head: its fields by lower-cased
    name, the last of repeated ones as twisted.web's ``getHeader`` gives
    them, except that a ``close`` in any Connection field stays; its target
    under ``_URL``; ``_OTHER_CONNECTION`` if any Connection field is not
    exactly ``close`` or ``keep-alive`` (twisted.web reads those)."""

    def on_url(self, url: bytes) -> None:
        self[_URL] = self.get(_URL, b"") + url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"connection":
            value = value.lower().rstrip(b" \t")
            if value not in (b"close", b"keep-alive"):
                self[_OTHER_CONNECTION] = value  # whatever fields follow
            if self.get(name) == b"close":
                return  # a close in any Connection field closes
        # llhttp drops the leading blanks only.
        self[name] = value.rstrip(b" \t")


HAND_OFF = object()


@functools.lru_cache(maxsize=64)
def field_name(lowered: bytes) -> bytes:
    """The spelling twisted.web writes a field name in: each word capitalised."""
    return b"-".join(word.capitalize() for word in lowered.split(b"-"))


@functools.lru_cache(maxsize=64)
def _status_line(code: int) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (code, RESPONSES.get(code, b"Unknown Status"))


class HotRequest:
    """One plain request, with the part of twisted.web's ``Request`` that a
    hot route uses: its body, its fields, and the answer's status and fields."""

    def __init__(
        self, channel: HotChannel, path: bytes, fields: dict[bytes, bytes], body: bytes
    ) -> None:
        self.channel = channel
        self.method = b"POST"
        self.path = path
        self.uri = path
        self.content = BytesIO(body)
        self.code = 200
        self.close = fields.get(b"connection") == b"close"
        self.gorge_error: str | None = None
        # Set by the service's channel before the handler runs, for its log line.
        self.request_id = ""
        self.started = 0.0
        self._fields = fields
        self.response_fields: dict[bytes, bytes] = {}

    def getHeader(self, name: bytes) -> bytes | None:
        return self._fields.get(name.lower())

    def setHeader(self, name: bytes, value: bytes) -> None:
        self.response_fields[name.lower()] = value

    def setResponseCode(self, code: int) -> None:
        self.code = code

    def getClientAddress(self) -> Any:
        return self.channel.transport.getPeer()

    def head(self) -> bytes:
        """The answer's status line and fields, in the order they were set."""
        lines = [_status_line(self.code)]
        if self.close:
            lines.append(b"Connection: close\r\n")
        for name, value in self.response_fields.items():
            lines.append(field_name(name) + b": " + value + b"\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)


def write_now(transport: Any, data: bytes) -> None:
    """Write ``data`` to the socket at once when the connection has nothing queued.

    twisted queues every write for the reactor's next turn: for a small
    answer that is one more trip through the event loop (a writability
    event and two epoll updates), which costs about as much as answering the
    request. Only a plain TCP connection with nothing buffered, not closing,
    is written at once, so the bytes keep their order; what the socket does
    not take, and everything else, goes through ``transport.write``.
    """
    # twisted's queue of writes not yet handed to the socket: if a release
    # renames it, every write simply takes the queued path again.
    queued = unsent_writes(transport)
    if (
        isinstance(transport, tcp.Connection)
        and queued == []
        and not transport.dataBuffer
        and not transport.disconnecting
        and not transport.disconnected
    ):
        sent = transport.writeSomeData(data)
        # Anything but a count is an error, left for write() to report.
        if isinstance(sent, int) and sent > 0:
            data = data[sent:]
        if not data:
            return
    transport.write(data)


class HotChannel(Protocol):
    """One connection: plain requests to ``routes`` answered by :meth:`process`,
    one at a time and in order; the first other request hands the connection
    to ``fallback()``.

    A Site's ``buildProtocol`` sets ``site``, ``factory``, ``requestFactory``,
    ``timeOut`` and ``callLater`` on it, as on any twisted.web channel; they
    are passed on to the channel a connection is handed to.
    """

    #: The exact paths answered here.
    routes: Container[bytes] = frozenset()
    #: The largest body answered here; a larger one gets twisted.web's refusal.
    body_limit = 2 * 1024 * 1024
    timeOut: float | None = None
    transport: Any
    factory: Any
    callLater: Callable[..., IDelayedCall] | None = None

    def __init__(self) -> None:
        self._buffer = b""
        # A head read, its body still due: path, fields, body start and end.
        self._pending: tuple[bytes, dict[bytes, bytes], int, int] | None = None
        self._current: HotRequest | None = None  # the request being answered
        self._close_next = False  # the requests still to come are answered with close
        self._reading = False  # inside _next: an answer written now must not re-enter it
        self._closing = False  # an answer said close: nothing more is read
        self._paused = False
        self._last_active = 0.0  # when the last byte arrived or the last answer left
        self._idle_timer: IDelayedCall | None = None
        self.delegate: Any = None  # the twisted.web channel, once handed off
        self.gone = False
        self._head = _Head()
        self._parser = httptools.HttpRequestParser(self._head)

    # -- the connection

    def connectionMade(self) -> None:
        if ITCPTransport.providedBy(self.transport):
            # Small answers must not wait for Nagle's algorithm.
            self.transport.setTcpNoDelay(True)
        self._touch()

    def _touch(self) -> None:
        """Something happened: the idle period starts again from now."""
        if self.timeOut is None or self.callLater is None:
            return
        self._last_active = self._seconds()
        if self._idle_timer is None:
            self._idle_timer = self.callLater(self.timeOut, self._idle_check)

    def _seconds(self) -> float:
        # The clock the site's callLater runs on (twisted.web sets both).
        return float(self.factory.reactor.seconds())

    def dataReceived(self, data: bytes) -> None:
        if self.delegate is not None:
            self.delegate.dataReceived(data)
            return
        self._buffer += data
        self._touch()
        self._next()
        if self._busy and not self._paused and len(self._buffer) > self.body_limit + MAX_HEAD:
            # The next request waits for this answer; a client that keeps
            # sending is held off rather than buffered without end.
            self._paused = True
            self.transport.pauseProducing()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.gone = True
        self._stop_idle_timer()
        if self.delegate is not None:
            self.delegate.connectionLost(reason)
        elif self._current is not None:
            self.abandon(self._current)

    @property
    def _busy(self) -> bool:
        """A request is being answered."""
        return self._current is not None

    def _stop_idle_timer(self) -> None:
        if self._idle_timer is not None and self._idle_timer.active():
            self._idle_timer.cancel()
        self._idle_timer = None

    def _resume(self) -> None:
        """Read again, if a request under way had held the client off."""
        if self._paused:
            self._paused = False
            self.transport.resumeProducing()

    def _idle_check(self) -> None:
        """The timer is one per connection, moved on only when it fires (a
        reset per read would cost more than the check): the connection
        closes ``timeOut`` after its last byte or answer, as twisted.web's
        does; while a request is being answered there is no timeout."""
        self._idle_timer = None
        if self.delegate is not None or self.gone or self._busy:
            return  # an answer starts the period again (respond)
        assert self.callLater is not None and self.timeOut is not None
        left = self._last_active + self.timeOut - self._seconds()
        if left > 0:
            self._idle_timer = self.callLater(left, self._idle_check)
            return
        self.transport.loseConnection()

    # -- requests

    def _next(self) -> None:
        """Take the buffered requests in order, up to one that is not complete."""
        if self._reading:
            return
        self._reading = True
        try:
            while not self._busy and not self._closing and self.delegate is None:
                if not self._buffer:
                    return
                read = self._read()
                if read is None:
                    return
                if read is HAND_OFF:
                    self._hand_off()
                    return
                request, end = read
                self._buffer = self._buffer[end:]
                self._current = request
                self.process(request)
        finally:
            self._reading = False

    def _read(self) -> Any:
        """The next request and where it ends in the buffer, None while it is
        incomplete, or HAND_OFF for one twisted.web must read."""
        buffer = self._buffer
        if self._pending is None:
            head = self._read_head(buffer)
            if head is None or head is HAND_OFF:
                return head
            self._pending = head
        path, fields, start, end = self._pending
        if len(buffer) < end:
            return None
        self._pending = None
        body = buffer[start:end]
        if body:
            # The parser counts the body off, to be at the next head.
            self._parser.feed_data(body)
        request = HotRequest(self, path, fields, body)
        if self._close_next:
            request.close = True
        return request, end

    def _read_head(self, buffer: bytes) -> Any:
        """The path, fields and body span of the buffered head, None while it is
        incomplete, or HAND_OFF."""
        head_end = buffer.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
        if head_end < 0:
            return HAND_OFF if len(buffer) > MAX_HEAD else None
        start = head_end + 4
        head = buffer[:start]
        fields = self._head
        fields.clear()
        try:
            self._parser.feed_data(head)
        except httptools.HttpParserError:
            # llhttp's strict mode refuses a bare CR or LF, a folded line, a
            # control character, a length twice or beside Transfer-Encoding:
            # twisted.web gives the refusal (or reads it as it reads it).
            return HAND_OFF
        path = fields.pop(_URL, b"")
        # llhttp has checked the length is digits, once, not beside a
        # Transfer-Encoding; int() refuses more than 4300 of them.
        declared = fields.get(b"content-length")
        digits = declared.lstrip(b"0") if declared is not None else b""
        if (
            declared is None
            or len(digits) > 18
            or b"transfer-encoding" in fields
            or b"expect" in fields
            or _OTHER_CONNECTION in fields
            or not buffer.startswith(b"POST " + path + b" HTTP/1.1\r\n")
            or path not in self.routes
        ):
            return HAND_OFF
        length = int(digits or b"0")
        if length > self.body_limit:
            return HAND_OFF  # twisted.web's 413
        return path, fields, start, start + length

    def _hand_off(self) -> None:
        delegate = self.fallback()
        # What the Site's buildProtocol gave this channel.
        for name in ("factory", "site", "requestFactory", "timeOut", "callLater"):
            if hasattr(self, name):
                setattr(delegate, name, getattr(self, name))
        self.delegate = delegate
        self._stop_idle_timer()
        data, self._buffer = self._buffer, b""
        self._pending = None
        delegate.makeConnection(self.transport)
        self._resume()
        if data:
            delegate.dataReceived(data)
        self.handed_off()

    def respond(self, request: HotRequest, body: bytes) -> None:
        """Write ``request``'s answer, then take the next buffered request."""
        self._current = None
        if self.gone:
            return
        write_now(self.transport, request.head() + body)
        if request.close:
            self._closing = True
            self.transport.loseConnection()
            return
        self._touch()
        self._resume()
        self._next()

    def close_after_answer(self) -> None:
        """End the connection now if no request is under way, else once it is answered.

        A request whose first bytes have arrived counts as under way: it is
        read to its end and answered, with ``Connection: close``.
        """
        if self.delegate is not None or self.gone:
            return
        if self.idle:
            self.transport.loseConnection()
            return
        self._close_next = True
        if self._current is not None:
            self._current.close = True

    @property
    def idle(self) -> bool:
        """Nothing under way: no request being answered, no byte of the next one."""
        return not self._busy and not self._buffer

    # -- what a service's channel decides

    def fallback(self) -> Any:
        """A new twisted.web channel, for a connection to be handed to."""
        raise NotImplementedError

    def process(self, request: HotRequest) -> None:
        """Answer ``request`` with :meth:`respond`, now or later."""
        raise NotImplementedError

    def abandon(self, request: HotRequest) -> None:
        """The client went away while ``request`` was being answered."""

    def handed_off(self) -> None:
        """The connection now belongs to :attr:`delegate`, which has had the
        bytes read so far."""
