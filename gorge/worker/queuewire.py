"""The queue calls on the wire: POSTs to gorge-taskqueue over kept-alive
connections (:mod:`gorge.client.keepalive`), each request's head built once per path.

A worker makes a lease or report call for every few tasks; through Twisted's
``Agent`` each cost about 0.7 ms of CPU, as much as running a batch of no-op
tasks. The queue is one origin: one pool, one endpoint that resolves the
host on every connect (a container's queue may move), TLS for ``https``
checked against a private CA or as a browser would.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.interfaces import IReactorTime, IStreamClientEndpoint
from twisted.internet.protocol import Factory
from twisted.web.client import BrowserLikePolicyForHTTPS

from gorge.client.exchange import Reply
from gorge.client.failure import Cause, ExchangeCancelled, TransportFailure
from gorge.client.keepalive import ConnectionPool, host_line

__all__ = ["QueueWire"]


class QueueWire:
    """POSTs to one base URL (``http`` or ``https``, a host, maybe a port and a
    path prefix), at most ``max_idle`` connections kept."""

    def __init__(
        self,
        reactor: Any,
        base_url: str,
        *,
        connect_timeout: float,
        max_idle: int,
        tls: Any = None,
    ) -> None:
        """``tls``: the connection creator for an ``https`` URL
        (:func:`gorge.client.tls.client_tls`); None checks the certificate
        against the system's CAs, as a browser would."""
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL with a host: {base_url!r}")
        default_port = 443 if parts.scheme == "https" else 80
        port = parts.port or default_port
        host = parts.hostname
        self._host_line = host_line(parts.netloc, parts.scheme, port)
        self._prefix = parts.path.rstrip("/")
        endpoint: IStreamClientEndpoint = HostnameEndpoint(
            reactor, host, port, timeout=connect_timeout
        )
        if parts.scheme == "https":
            if tls is None:
                tls = BrowserLikePolicyForHTTPS().creatorForNetloc(host.encode("idna"), port)
            endpoint = wrapClientTLS(tls, endpoint)
        self._endpoint = endpoint
        self._pool = ConnectionPool(reactor, max_idle=max_idle)
        self._key = (parts.scheme, host, port)

    def head(self, path: str, headers: dict[bytes, bytes]) -> bytes:
        """Request line and headers for ``path``, up to the ``Content-Length``
        that :meth:`post` adds; build it once and keep it."""
        lines = [b"POST " + (self._prefix + path).encode("ascii") + b" HTTP/1.1"]
        for name, value in headers.items():
            if b"\r" in value or b"\n" in value or b":" in name:
                raise ValueError(f"header {name!r} cannot be sent as it is")
            lines.append(name + b": " + value)
        lines.append(b"Host: " + self._host_line.encode("idna"))
        return b"\r\n".join(lines) + b"\r\nContent-Length: "

    async def post(
        self, head: bytes, body: bytes, *, keep: int, timeout: float, clock: IReactorTime
    ) -> Reply:
        """One exchange within ``timeout`` seconds on ``clock``, the answer's body
        kept up to ``keep`` bytes.

        Raises :class:`~gorge.client.failure.TransportFailure` as
        :func:`gorge.client.exchange.exchange` does: ``DEADLINE`` when the time ran
        out, :class:`~gorge.client.failure.ExchangeCancelled` when the caller
        cancelled.
        """
        request = head + b"%d\r\n\r\n" % len(body) + body
        exchange = Deferred.fromCoroutine(
            self._pool.request(self._key, self._connect, request, keep=keep)
        )
        expired: list[bool] = []

        def on_timeout(result: Any, _timeout: float) -> Any:
            expired.append(True)
            return result

        exchange.addTimeout(timeout, clock, onTimeoutCancel=on_timeout)
        try:
            return await exchange
        except TransportFailure:
            raise
        except Exception as exc:
            if expired:
                raise TransportFailure(Cause.DEADLINE, exc) from None
            if isinstance(exc, CancelledError):
                raise ExchangeCancelled(Cause.CANCELLED, exc) from None
            raise TransportFailure.from_error(exc, submitted=False) from None

    def _connect(self, factory: Factory) -> Deferred:
        return self._endpoint.connect(factory)

    def close(self) -> Deferred:
        return self._pool.close()
