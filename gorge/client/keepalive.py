"""Kept-alive HTTP/1.1 connections, for the senders whose requests are known
bytes and whose answers need only their status, headers and (bounded) body.

Twisted's ``Agent`` builds a request object, a header map, a body producer,
a response object with its own body protocol and a pooled-connection record
for every exchange: about 0.7 ms of CPU per request, most of what a webhook
delivery cost. Here a request is one write of bytes and the answer one
incremental parse by llhttp (:class:`ResponseParser`) on a connection kept per origin
(:class:`ConnectionPool`).

An exchange ends with what :mod:`gorge.httpclient` says for the other
senders: a :class:`~gorge.httpclient.Reply`, or a
:class:`~gorge.httpclient.TransportFailure` whose :class:`~gorge.httpclient.Cause`
each caller maps to its own vocabulary. The framing rules are HTTP/1.1's
(RFC 9112), as llhttp applies them: no body after 1xx, 204 and 304; chunked
when the last transfer coding is ``chunked``; else ``Content-Length``; else
the body ends when the connection does. Interim 1xx answers are skipped. A connection is reused only
after an HTTP/1.1 answer without ``Connection: close`` whose end was framed."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, cast

import httptools
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

_HEAD, _BODY, _DONE = range(3)


class _Extra(Exception):
    """Raised in llhttp's callback when a second answer begins: the bytes
    after the end of the answer stop the parse."""


class ResponseParser:
    """One answer, fed in whatever pieces the connection delivers, and read by
    llhttp (through ``httptools``).

    :meth:`feed` returns True once the answer is complete; :meth:`lost` says
    what a connection that ended before that leaves the caller with.

    As a client reads answers (RFC 9112), obsolete line folding and a bare LF
    are accepted; an answer framed two ways (``Transfer-Encoding`` beside
    ``Content-Length``, or two different lengths) is refused, as a server
    sending it may be trying to split answers.
    """

    def __init__(self, keep: int | None = None) -> None:
        """``keep``: body bytes kept for :meth:`reply` (one more raises
        :class:`~gorge.httpclient.BodyTooLarge`, as soon as the head declares
        a longer body); None keeps none."""
        self._keep = keep
        self._parts: list[bytes] = []
        self._kept = 0
        self._state = _HEAD
        self._head_bytes = 0
        self._fields: list[tuple[bytes, bytes]] = []
        self._interim = False
        self._until_close = False
        self._parser = httptools.HttpResponseParser(self)
        self._parser.set_dangerous_leniencies(
            lenient_headers=True, lenient_optional_cr_before_lf=True
        )
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
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            # A 101: the answer ends with its head; what follows is not ours.
            self._state = _DONE
            self.extra = self.extra or int(upgrade.args[0]) < len(data)
        except httptools.HttpParserCallbackError as e:
            cause = e.__context__
            if isinstance(cause, _Extra):
                return True
            if isinstance(cause, (MalformedResponse, BodyTooLarge)):
                raise cause from None
            raise MalformedResponse(f"{e}: {cause!r}") from cause
        except httptools.HttpParserError as e:
            if self._state == _DONE:
                # The answer was whole; llhttp refuses what came after it
                # (after a close, say): bytes nobody asked for.
                self.extra = True
                return True
            raise MalformedResponse(str(e)) from None
        if self._state == _HEAD:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD:
                raise MalformedResponse("response head over the limit")
        return self._state == _DONE

    # -- llhttp's callbacks

    def on_message_begin(self) -> None:
        if self._state == _DONE:
            self.extra = True
            raise _Extra()
        self._fields = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields.append((name, value))  # the trailers too: never read

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = parser.get_status_code()
        if status < 100 or status > 999:
            raise MalformedResponse(f"bad status code {status}")
        if status < 200 and status != 101:
            self._interim = True  # the final answer follows
            return
        self.status = status
        # Lower-cased names, the last of repeated fields (llhttp keeps the
        # blanks after a value).
        headers = {
            name.decode("latin-1").lower(): value.rstrip(b" \t").decode("latin-1")
            for name, value in self._fields
        }
        self.headers = headers
        self._state = _BODY  # the status line stands, whatever the body does
        length = headers.get("content-length")
        if "transfer-encoding" in headers:
            # Every field, as one list: "chunked" last means chunked.
            codings = b",".join(v for n, v in self._fields if n.lower() == b"transfer-encoding")
            chunked = codings.rsplit(b",", 1)[-1].strip().lower() == b"chunked"
            self._until_close = not chunked
        else:
            self._until_close = length is None
        if status in (101, 204, 304):
            self._until_close = False
        self.reusable = (
            not self._until_close
            and status != 101
            and parser.should_keep_alive()
            and parser.get_http_version() == "1.1"
        )
        if length is not None and self._keep is not None and status not in (204, 304):
            digits = length.lstrip("0")  # llhttp checked they are digits
            if len(digits) > 18 or int(digits or "0") > self._keep:
                raise BodyTooLarge(self._keep)

    def on_body(self, body: bytes) -> None:
        if self._keep is None:
            return
        self._kept += len(body)
        if self._kept > self._keep:
            raise BodyTooLarge(self._keep)
        self._parts.append(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            self._head_bytes = 0
            return
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
        if self._until_close:
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
