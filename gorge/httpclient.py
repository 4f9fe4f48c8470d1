"""The outbound HTTP client each service builds once, and
the request body both senders use."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.web.client import Agent, BrowserLikePolicyForHTTPS, HTTPConnectionPool
from twisted.web.error import SchemeNotSupported
from twisted.web.iweb import IAgentEndpointFactory, IBodyProducer
from zope.interface import implementer

__all__ = ["OneShotBody", "QuietEndpoint", "make_http_client", "make_pool"]


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


@implementer(IAgentEndpointFactory)
class _Endpoints:
    """TCP for http, TLS (verified like a browser) for https, each quiet: the
    endpoints an ``Agent`` makes by default."""

    def __init__(self, reactor: Any, connect_timeout: float) -> None:
        self._reactor = reactor
        self._timeout = connect_timeout
        self._tls = BrowserLikePolicyForHTTPS()

    def endpointForURI(self, uri: Any) -> QuietEndpoint:
        try:
            host = uri.host.decode("ascii")
        except UnicodeDecodeError:
            raise ValueError(f"non-ASCII host in {uri.toBytes()!r}") from None
        endpoint: IStreamClientEndpoint = HostnameEndpoint(
            self._reactor, host, uri.port, timeout=self._timeout)
        if uri.scheme == b"https":
            endpoint = wrapClientTLS(self._tls.creatorForNetloc(uri.host, uri.port), endpoint)
        elif uri.scheme != b"http":
            raise SchemeNotSupported(f"Unsupported scheme: {uri.scheme!r}")
        return QuietEndpoint(endpoint)


def make_pool(reactor, *, max_per_host: int, retry_automatically: bool = False) -> HTTPConnectionPool:
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


def make_http_client(reactor, *, max_per_host: int, connect_timeout: float = 10,
                     retry_automatically: bool = False):
    """A :func:`make_pool` pool and a treq ``HTTPClient`` over it: ``(client, pool)``."""
    from treq.client import HTTPClient

    pool = make_pool(reactor, max_per_host=max_per_host, retry_automatically=retry_automatically)
    agent = Agent.usingEndpointFactory(reactor, _Endpoints(reactor, connect_timeout), pool=pool)
    return HTTPClient(agent), pool


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
