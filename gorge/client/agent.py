"""The outbound HTTP agent: a connection pool whose endpoints stay quiet
in the log and bound their connect time."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.web.client import (
    Agent,
    BrowserLikePolicyForHTTPS,
    HTTPConnectionPool,
)
from twisted.web.error import SchemeNotSupported
from twisted.web.iweb import IAgentEndpointFactory
from zope.interface import implementer

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
    reactor: Any, *, max_per_host: int, retry_automatically: bool = False
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
    reactor: Any,
    *,
    max_per_host: int,
    connect_timeout: float = 10,
    retry_automatically: bool = False,
) -> tuple[Agent, HTTPConnectionPool]:
    """A service's one ``Agent`` over a :func:`make_pool` pool: ``(agent, pool)``."""
    pool = make_pool(reactor, max_per_host=max_per_host, retry_automatically=retry_automatically)
    agent = Agent.usingEndpointFactory(reactor, _Endpoints(reactor, connect_timeout), pool=pool)
    return agent, pool
