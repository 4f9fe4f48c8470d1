"""The outbound HTTP client each service builds once (``style.md`` §7), and
the request body both senders use."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.web.client import Agent, HTTPConnectionPool, _HTTP11ClientFactory
from twisted.web.iweb import IBodyProducer
from zope.interface import implementer

__all__ = ["OneShotBody", "make_http_client", "make_pool"]


class _QuietClientFactory(_HTTP11ClientFactory):
    """No "Starting factory" log line per new connection."""

    noisy = False


def make_pool(reactor, *, max_per_host: int, retry_automatically: bool = False) -> HTTPConnectionPool:
    """A persistent, quiet connection pool.

    ``retry_automatically`` stays off by default: Twisted would silently
    resend an idempotent request on a connection the server had just closed,
    and our callers decide about retries themselves (a resent POST could
    deliver twice). The caller closes the pool
    (``pool.closeCachedConnections()``) as the last step of its stop.
    """
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = max_per_host
    pool.retryAutomatically = retry_automatically
    pool._factory = _QuietClientFactory
    return pool


def make_http_client(reactor, *, max_per_host: int, connect_timeout: float = 10,
                     retry_automatically: bool = False):
    """A :func:`make_pool` pool and a treq ``HTTPClient`` over it: ``(client, pool)``."""
    from treq.client import HTTPClient

    pool = make_pool(reactor, max_per_host=max_per_host, retry_automatically=retry_automatically)
    return HTTPClient(Agent(reactor, pool=pool, connectTimeout=connect_timeout)), pool


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
        # The Agent wraps the connection's transport in a length-enforcing
        # consumer; keep the transport to ask it about TLS later.
        self._transport = getattr(consumer, "_consumer", consumer)
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
            return bool(getattr(self._transport, "_handshakeDone", True))
        return True

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass
