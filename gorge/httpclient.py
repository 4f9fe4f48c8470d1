"""The outbound HTTP client each service builds once (``style.md`` §7)."""

from __future__ import annotations

from twisted.web.client import Agent, HTTPConnectionPool, _HTTP11ClientFactory

__all__ = ["make_http_client"]


class _QuietClientFactory(_HTTP11ClientFactory):
    """No "Starting factory" log line per new connection."""

    noisy = False


def make_http_client(reactor, *, max_per_host: int, connect_timeout: float = 10,
                     retry_automatically: bool = False):
    """A persistent pool and a treq ``HTTPClient`` over it: ``(client, pool)``.

    ``retry_automatically`` stays off by default: Twisted would silently
    resend an idempotent request on a connection the server had just closed,
    and our callers decide about retries themselves. The caller closes the
    pool (``pool.closeCachedConnections()``) as the last step of its stop.
    """
    from treq.client import HTTPClient

    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = max_per_host
    pool.retryAutomatically = retry_automatically
    pool._factory = _QuietClientFactory
    return HTTPClient(Agent(reactor, pool=pool, connectTimeout=connect_timeout)), pool
