"""Outbound HTTP: the agent each service builds once, and
the one bounded exchange every sender uses.

:func:`exchange` sends one request over an ``IAgent`` and returns a
:class:`Reply` (status line, headers, body). Everything about it is bounded:

* one ``deadline`` covers connecting, the TLS handshake, the status line and
  the body; ``headers_deadline`` may end the wait for the status line sooner;
* at most ``body_limit`` bytes of the body are kept (``keep_body=False``
  reads the body to its end and keeps none of it, so the connection can be
  reused).

A failure before the status line raises :class:`TransportFailure`, whose
:class:`Cause` is the one classification of what went wrong and whose
``submitted`` says whether the whole request had been handed over to the
connection. A failure while the body is read does not undo the status line:
it is in :attr:`Reply.body_failure`, and :meth:`Reply.require_body` raises it
for callers that need the body. Redirects are never followed and no cookies
are kept: each caller decides about both."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from hyperlink import EncodedURL
from twisted.internet import defer
from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.internet.protocol import Protocol
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.python.failure import Failure
from twisted.web.client import (
    ResponseDone,
)
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IBodyProducer
from zope.interface import implementer

from gorge.app.private_names import body_consumer_transport
from gorge.client.failure import (
    BodyCutShort,
    BodyTooLarge,
    Cause,
    TransportFailure,
)

#: Body bytes kept unless the caller says otherwise.
BODY_LIMIT = 64 * 1024


# ---------------------------------------------------------------- the request body


@implementer(IBodyProducer)
class OneShotBody:
    """A known-length request body (sent with Content-Length, never chunked),
    written in one call once the connection is up; it remembers that it was."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self.length = len(body)
        self._transport: Any = None
        self._written = False

    def startProducing(self, consumer: Any) -> defer.Deferred:
        self._transport = _transport_under(consumer)
        consumer.write(self._body)
        self._written = True
        return defer.succeed(None)

    @property
    def handed_over(self) -> bool:
        """The whole request went to the transport, and if that is TLS, its
        handshake had completed (before that, TLS only buffers the bytes)."""
        if not self._written:
            return False
        if isinstance(self._transport, TLSMemoryBIOProtocol):
            # The peer's Finished message ends the client's side of the
            # handshake; pyOpenSSL returns None until it has arrived.
            return self._transport.getHandle().get_peer_finished() is not None
        return True

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


def _transport_under(consumer: Any) -> Any:
    """The connection's transport beneath the consumer an ``Agent`` hands a
    body producer.

    The Agent wraps the transport in ``twisted.web._newclient``'s
    ``LengthEnforcingConsumer``, which offers no public way to it; its
    private ``_consumer`` is read through :mod:`gorge.app.private_names`.
    """
    return body_consumer_transport(consumer)


# ---------------------------------------------------------------- the exchange


@dataclass(frozen=True)
class Reply:
    """A status line was received. ``headers`` maps lower-case names to
    their last value. ``body`` is ``None`` when it could not be read in full;
    ``body_failure`` then says why."""

    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes | None = None
    body_failure: TransportFailure | None = None

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def require_body(self) -> bytes:
        """The body, or the failure that kept it from being read."""
        if self.body_failure is not None:
            raise self.body_failure
        return self.body if self.body is not None else b""


class _BodyReader(Protocol):
    """Reads a response body to its end, keeping at most ``limit`` bytes
    (``None``: keeping none). One byte more fails the read and drops the
    connection."""

    def __init__(self, done: defer.Deferred, limit: int | None) -> None:
        self._done = done
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self._abandoned = False

    def dataReceived(self, data: bytes) -> None:
        if self._done.called or self._limit is None:
            return
        self._size += len(data)
        if self._size > self._limit:
            self._done.errback(BodyTooLarge(self._limit))
            cast(IPushProducer, self.transport).stopProducing()
            return
        self._parts.append(data)

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[assignment]
        if self._done.called or self._abandoned:
            return
        if reason is not None and reason.check(ResponseDone, PotentialDataLoss):
            self._done.callback(b"".join(self._parts))
        else:
            self._done.errback(BodyCutShort(reason))

    def abandon(self) -> None:
        """The reader's Deferred was cancelled: hang up, and leave the
        outcome to the cancel."""
        self._abandoned = True
        if self.transport is not None:
            cast(IPushProducer, self.transport).stopProducing()


def _read_body(response: Any, limit: int | None) -> defer.Deferred:
    reader: _BodyReader | None = None

    def cancel(_: defer.Deferred) -> None:
        if reader is not None:
            reader.abandon()

    done: defer.Deferred = defer.Deferred(cancel)
    reader = _BodyReader(done, limit)
    response.deliverBody(reader)
    return done


def encode_url(url: str | bytes) -> bytes:
    """``bytes`` go out as given; text is turned into a URI the way treq
    does (non-ASCII percent-encoded, an IDN host in its ASCII form).

    A caller that sends to the same URLs again and again encodes them once
    and passes the bytes: the parse costs more than the rest of a request's
    set-up."""
    if isinstance(url, bytes):
        return url
    return EncodedURL.from_text(url).to_uri().to_text().encode("ascii")


def _bounded(
    d: defer.Deferred, until: float | None, clock: IReactorTime, fired: list[bool]
) -> defer.Deferred:
    """``d``, cancelled at ``until`` (absolute on ``clock``; ``None``: never);
    ``fired`` records that it was our timer, not some other cancel."""
    if until is None:
        return d

    def expired(result: Any, _timeout: float) -> Any:
        fired.append(True)
        return result

    return d.addTimeout(max(0.0, until - clock.seconds()), clock, onTimeoutCancel=expired)


async def exchange(
    agent: IAgent,
    clock: IReactorTime,
    method: str | bytes,
    url: str | bytes,
    *,
    headers: Mapping[Any, Any] | None = None,
    body: bytes = b"",
    deadline: float | None,
    headers_deadline: float | None = None,
    body_limit: int = BODY_LIMIT,
    keep_body: bool = True,
) -> Reply:
    """One request over ``agent``, bounded as the module docstring says.

    ``deadline`` and ``headers_deadline`` are absolute times on ``clock``.
    ``deadline=None`` is for the one caller whose wait may last as long as
    a task's lease (and be extended with it): it must cancel the exchange
    itself. ``headers`` values are strings or bytes, one value per name.
    ``body`` always goes out with its length (an empty one as
    ``Content-Length: 0``), never chunked.

    Raises :class:`TransportFailure` when no status line was received; a
    cancel of the awaiting Deferred raises :class:`ExchangeCancelled` then,
    and during the body read it only ends the read.
    """
    producer = OneShotBody(body)
    fired: list[bool] = []
    head_until = deadline
    if headers_deadline is not None:
        head_until = headers_deadline if deadline is None else min(deadline, headers_deadline)
    if deadline is not None and deadline <= clock.seconds():
        raise TransportFailure(Cause.DEADLINE)  # nothing dialled
    try:
        request = agent.request(
            method.encode("ascii") if isinstance(method, str) else method,
            encode_url(url),
            Headers({name: [value] for name, value in (headers or {}).items()}),
            producer,
        )
        response = await _bounded(request, head_until, clock, fired)
    except Exception as exc:
        raise TransportFailure.from_error(
            exc, submitted=producer.handed_over, deadline=bool(fired)
        ) from None
    reply_headers = {
        name.decode("latin-1").lower(): values[-1].decode("latin-1")
        for name, values in response.headers.getAllRawHeaders()
        if values
    }
    fired_in_body: list[bool] = []
    try:
        content = await _bounded(
            _read_body(response, body_limit if keep_body else None), deadline, clock, fired_in_body
        )
    except Exception as exc:
        # The status line is the answer; what the body could not say is the
        # caller's to judge.
        failure = TransportFailure.from_error(exc, submitted=True, deadline=bool(fired_in_body))
        return Reply(int(response.code), reply_headers, None, failure)
    return Reply(int(response.code), reply_headers, content)
