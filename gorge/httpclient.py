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
are kept: each caller decides about both.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from hyperlink import EncodedURL
from twisted.internet import defer, error
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.interfaces import IPushProducer, IReactorTime, IStreamClientEndpoint
from twisted.internet.protocol import Protocol
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.python.failure import Failure
from twisted.web.client import (
    Agent,
    BrowserLikePolicyForHTTPS,
    HTTPConnectionPool,
    PartialDownloadError,
    RequestGenerationFailed,
    RequestNotSent,
    RequestTransmissionFailed,
    ResponseDone,
    ResponseFailed,
    ResponseNeverReceived,
)
from twisted.web.error import SchemeNotSupported
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgent, IAgentEndpointFactory, IBodyProducer
from zope.interface import implementer

__all__ = [
    "BODY_LIMIT",
    "BodyCutShort",
    "BodyTooLarge",
    "Cause",
    "ExchangeCancelled",
    "OneShotBody",
    "QuietEndpoint",
    "Reply",
    "TransportFailure",
    "classify",
    "encode_url",
    "exchange",
    "leaf_reasons",
    "make_agent",
    "make_pool",
    "reasons_of",
    "tls_cause",
]

#: Body bytes kept unless the caller says otherwise.
BODY_LIMIT = 64 * 1024


# ---------------------------------------------------------------- agent and pool


@implementer(IStreamClientEndpoint)
class QuietEndpoint:
    """An endpoint whose connections log no "Starting factory" line.

    The connection pool makes one factory per connection, and a Twisted
    factory logs its start and stop unless told it is not ``noisy``."""

    def __init__(self, endpoint: IStreamClientEndpoint) -> None:
        self._endpoint = endpoint

    def connect(self, factory: Any) -> defer.Deferred:
        factory.noisy = False
        return self._endpoint.connect(factory)


#: Endpoints kept for reuse; past this many distinct origins the cache starts
#: over (a webhook sender may talk to any number of hosts).
ENDPOINT_CACHE_SIZE = 256


@implementer(IAgentEndpointFactory)
class _Endpoints:
    """TCP for http, TLS (verified like a browser) for https, each quiet: the
    endpoints an ``Agent`` makes by default.

    The Agent asks for an endpoint on every request, pooled connection or
    not, and building one (IDNA-encoding the host) cost a twentieth of a
    queue client's time: one endpoint per origin is kept and reused (an
    endpoint resolves its host anew on each connect)."""

    def __init__(self, reactor: Any, connect_timeout: float) -> None:
        self._reactor = reactor
        self._timeout = connect_timeout
        self._tls = BrowserLikePolicyForHTTPS()
        self._cache: dict[tuple[bytes, bytes, int], QuietEndpoint] = {}

    def endpointForURI(self, uri: Any) -> QuietEndpoint:
        key = (uri.scheme, uri.host, uri.port)
        endpoint = self._cache.get(key)
        if endpoint is None:
            endpoint = self._endpoint(uri)
            if len(self._cache) >= ENDPOINT_CACHE_SIZE:
                self._cache.clear()
            self._cache[key] = endpoint
        return endpoint

    def _endpoint(self, uri: Any) -> QuietEndpoint:
        try:
            host = uri.host.decode("ascii")
        except UnicodeDecodeError:
            raise ValueError(f"non-ASCII host in {uri.toBytes()!r}") from None
        endpoint: IStreamClientEndpoint = HostnameEndpoint(
            self._reactor, host, uri.port, timeout=self._timeout
        )
        if uri.scheme == b"https":
            endpoint = wrapClientTLS(self._tls.creatorForNetloc(uri.host, uri.port), endpoint)
        elif uri.scheme != b"http":
            raise SchemeNotSupported(f"Unsupported scheme: {uri.scheme!r}")
        return QuietEndpoint(endpoint)


def make_pool(
    reactor, *, max_per_host: int, retry_automatically: bool = False
) -> HTTPConnectionPool:
    """A persistent connection pool; pair it with :class:`QuietEndpoint`s.

    ``retry_automatically`` stays off by default: Twisted would silently
    resend an idempotent request on a connection the server had just closed,
    and our callers decide about retries themselves (a resent POST could
    deliver twice). The caller closes the pool
    (``pool.closeCachedConnections()``) as the last step of its stop.
    """
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = max_per_host
    pool.retryAutomatically = retry_automatically
    return pool


def make_agent(
    reactor, *, max_per_host: int, connect_timeout: float = 10, retry_automatically: bool = False
) -> tuple[Agent, HTTPConnectionPool]:
    """A service's one ``Agent`` over a :func:`make_pool` pool: ``(agent, pool)``."""
    pool = make_pool(reactor, max_per_host=max_per_host, retry_automatically=retry_automatically)
    agent = Agent.usingEndpointFactory(reactor, _Endpoints(reactor, connect_timeout), pool=pool)
    return agent, pool


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
    private ``_consumer`` is read here and nowhere else, and
    tests/platform/test_httpclient.py fails loudly if a new Twisted renames it.
    """
    return getattr(consumer, "_consumer", consumer)


# ---------------------------------------------------------------- what went wrong


class Cause(enum.Enum):
    """What ended an exchange without a usable answer; the value is the
    plain-words description. Callers map it to their own vocabulary (the
    mailer's "submitted or not", the webhook's cURL codes)."""

    DEADLINE = "deadline reached"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed out"  # a timeout other than the exchange's deadline (connect)
    DNS = "DNS lookup failed"
    REFUSED = "connection refused"
    CONNECT = "connect failed"
    CERTIFICATE = "TLS certificate not accepted"
    TLS = "TLS error"
    NOT_SENT = "request not sent"
    SEND_FAILED = "connection failed while sending the request"
    EMPTY_REPLY = "connection closed"  # before any byte of a status line
    RESET = "connection lost"  # before any byte of a status line
    HEAD_CUT = "connection lost inside the response head"
    BODY_CUT = "response body cut short"
    BODY_TOO_LARGE = "response body over the limit"
    OTHER = "failed"

    @property
    def tls(self) -> bool:
        return self in (Cause.CERTIFICATE, Cause.TLS)


class BodyCutShort(Exception):
    """The connection failed while the response body was being read: the
    body ended before its declared end. ``reasons`` holds the failure."""

    def __init__(self, reason: Failure) -> None:
        super().__init__(str(reason.value))
        self.reasons = [reason]


class BodyTooLarge(Exception):
    """The response body went past the limit the caller set."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} bytes")
        self.limit = limit


def reasons_of(exc: BaseException) -> list[BaseException]:
    """``exc`` and every reason nested in it, depth first (Twisted's client
    errors wrap their causes in a ``reasons`` list of failures)."""
    found = [exc]
    for reason in getattr(exc, "reasons", None) or ():
        value = reason.value if isinstance(reason, Failure) else reason
        if isinstance(value, BaseException):
            found.extend(reasons_of(value))
    return found


def leaf_reasons(exc: BaseException) -> list[BaseException]:
    """The innermost reasons: what actually happened underneath the wrappers."""
    return [r for r in reasons_of(exc) if not getattr(r, "reasons", None)]


def _is_tls(exc: BaseException) -> bool:
    module = type(exc).__module__
    return module.startswith(("OpenSSL", "service_identity"))


def _is_certificate(exc: BaseException) -> bool:
    return type(exc).__name__ == "VerificationError" or "certificate verify failed" in str(exc)


def tls_cause(exc: BaseException) -> Cause | None:
    """CERTIFICATE or TLS when TLS broke anywhere under ``exc``, else None."""
    return _tls_cause_among(reasons_of(exc))


def _tls_cause_among(found: list[BaseException]) -> Cause | None:
    if any(_is_tls(r) for r in found):
        return Cause.CERTIFICATE if any(_is_certificate(r) for r in found) else Cause.TLS
    return None


# First match wins, over the exception and every reason inside it.
_BY_TYPE: tuple[tuple[tuple[type, ...], Cause], ...] = (
    ((defer.CancelledError, error.ConnectingCancelledError), Cause.CANCELLED),
    # error.TimeoutError (Twisted's connect timeout) is also a ConnectError.
    ((defer.TimeoutError, error.TimeoutError), Cause.TIMED_OUT),
    ((error.DNSLookupError,), Cause.DNS),
    ((error.ConnectionRefusedError,), Cause.REFUSED),
    ((error.ConnectError,), Cause.CONNECT),
    ((RequestNotSent, RequestGenerationFailed), Cause.NOT_SENT),
    ((RequestTransmissionFailed,), Cause.SEND_FAILED),
    ((BodyTooLarge,), Cause.BODY_TOO_LARGE),
    ((BodyCutShort, PartialDownloadError), Cause.BODY_CUT),
)


def classify(exc: BaseException) -> Cause:
    """The :class:`Cause` of a failed exchange from the exception it raised.

    Our own deadline cannot be told from the exception (it surfaces as a
    cancel); :func:`exchange` records it itself.
    """
    if isinstance(exc, TransportFailure):
        return exc.cause
    found = reasons_of(exc)
    tls = _tls_cause_among(found)
    if tls is not None:
        return tls
    for types, cause in _BY_TYPE:
        if any(isinstance(r, types) for r in found):
            return cause
    if isinstance(exc, ResponseNeverReceived):
        if any(isinstance(r, error.ConnectionDone) for r in found):
            return Cause.EMPTY_REPLY
        if any(isinstance(r, error.ConnectionLost) for r in found):
            return Cause.RESET
    if isinstance(exc, ResponseFailed):
        # The connection ended inside the status line or the headers.
        return Cause.HEAD_CUT
    return Cause.OTHER


class TransportFailure(Exception):
    """An exchange that got no usable answer.

    ``cause`` says what happened; ``submitted`` is False only when the
    request provably did not reach the connection in full; ``error`` is the
    exception it came from (``reasons`` wraps it the way Twisted's client
    errors wrap theirs).
    """

    def __init__(
        self, cause: Cause, error: BaseException | None = None, *, submitted: bool = False
    ) -> None:
        super().__init__(cause.value)
        self.cause = cause
        self.error = error
        self.submitted = submitted
        self.reasons = [error] if error is not None else []

    @classmethod
    def from_error(
        cls, error: BaseException, *, submitted: bool, deadline: bool = False
    ) -> TransportFailure:
        cause = Cause.DEADLINE if deadline else classify(error)
        kind = ExchangeCancelled if cause is Cause.CANCELLED else cls
        return kind(cause, error, submitted=submitted)

    def __str__(self) -> str:
        if self.error is not None:
            if self.cause is Cause.OTHER:
                return type(reasons_of(self.error)[-1]).__name__
            if isinstance(self.error, BodyTooLarge):
                return f"{self.cause.value} of {self.error.limit} bytes"
        return self.cause.value


class ExchangeCancelled(TransportFailure, defer.CancelledError):
    """The caller cancelled the exchange. It is a ``CancelledError`` (so a
    cancel stays a cancel for callers that only pass it on) and a
    :class:`TransportFailure` (so callers that must classify it know how
    far the request got)."""


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
