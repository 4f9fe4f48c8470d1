"""The webhook's delivery POSTs: request bytes as Twisted's Agent wrote them,
sent over connections kept per origin (:mod:`gorge.client.keepalive`) to the
address the URI policy checked.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP6ClientEndpoint, wrapClientTLS
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.protocol import Factory
from twisted.internet.ssl import optionsForClientTLS

from gorge.client.exchange import Reply
from gorge.client.keepalive import ConnectionPool, host_line
from gorge.webhook.uripolicy import Target

__all__ = ["Poster", "request_bytes"]

# What Twisted's Agent accepts as a request URI: printable ASCII, no space.
_VALID_URI = re.compile(r"[\x21-\x7e]+")


def request_bytes(target: Target, headers: dict[str, str], body: bytes) -> bytes:
    """The whole request as it goes on the wire, in the order Twisted's Agent
    writes it: request line, ``Content-Length``, the caller's headers, ``Host``.

    Raises ValueError for a URI or a header that cannot be sent as it is.
    """
    if not _VALID_URI.fullmatch(target.uri):
        raise ValueError(f"not a valid request URI: {target.uri!r}")
    parts = urlsplit(target.uri)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    host = host_line(parts.netloc, target.scheme, target.port)
    lines = [f"POST {path} HTTP/1.1", f"Content-Length: {len(body)}"]
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"header {name!r} cannot be sent as it is")
        lines.append(f"{name}: {value}")
    lines.append(f"Host: {host}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Poster:
    """POSTs to checked addresses; connections are kept per origin (scheme,
    checked address, port, host name), at most ``max_idle`` idle ones each."""

    def __init__(
        self, reactor: Any, *, connect_timeout: float, max_idle: int, trust_root: Any = None
    ) -> None:
        self._reactor = reactor
        self._connect_timeout = connect_timeout
        self._trust_root = trust_root  # None: the platform's CA store
        self._pool = ConnectionPool(reactor, max_idle=max_idle)

    async def post(self, target: Target, request: bytes) -> Reply:
        """One exchange, the answer's body dropped; cancelling the awaiting
        Deferred aborts its connection."""
        key = (target.scheme, target.addresses[0], target.port, target.host)

        def connect(factory: Factory) -> Deferred:
            return self._endpoint(target).connect(factory)

        return await self._pool.request(key, connect, request)

    def _endpoint(self, target: Target) -> IStreamClientEndpoint:
        address = target.addresses[0]
        endpoint: IStreamClientEndpoint
        if ipaddress.ip_address(address.split("%", 1)[0]).version == 6:
            endpoint = TCP6ClientEndpoint(
                self._reactor, address, target.port, timeout=self._connect_timeout
            )
        else:
            endpoint = TCP4ClientEndpoint(
                self._reactor, address, target.port, timeout=self._connect_timeout
            )
        if target.scheme == "https":
            # The address was checked; the name still drives SNI and the certificate check.
            endpoint = wrapClientTLS(
                optionsForClientTLS(target.host, trustRoot=self._trust_root), endpoint
            )
        return endpoint

    def close(self) -> Deferred:
        return self._pool.close()
