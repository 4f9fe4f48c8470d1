"""The outbound URI policy: scheme, host, one lookup, the blacklist.

The host is resolved once and every address is checked; the transport then
connects only to a checked address, so a second lookup can never rebind it.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.threads import deferToThreadPool

Resolver = Callable[[str, int], Coroutine[Any, Any, list[str]]]


class UriRefused(Exception):
    """The outbound policy refuses this URI (a configuration failure, ``uri``)."""

    def __init__(self, check: str, host: str) -> None:
        super().__init__(f"{check}: {host}")
        self.check = check
        self.host = host


class Unresolvable(Exception):
    """The host has no address right now: a failed attempt (code 6), not a refusal."""

    def __init__(self, host: str, reason: str) -> None:
        super().__init__(f"{host}: {reason}")
        self.host = host
        self.reason = reason


@dataclass(frozen=True)
class Target:
    uri: str = field(repr=False)
    scheme: str
    host: str
    port: int
    addresses: tuple[str, ...]


def system_resolver(reactor) -> Resolver:
    """getaddrinfo (IPv4 and IPv6) in the reactor's thread pool."""

    async def resolve(host: str, port: int) -> list[str]:
        infos = await deferToThreadPool(
            reactor, reactor.getThreadPool(), socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM
        )
        addresses: list[str] = []
        for _family, _type, _proto, _name, sockaddr in infos:
            if sockaddr[0] not in addresses:
                addresses.append(str(sockaddr[0]))
        return addresses

    return resolve


class UriPolicy:
    def __init__(
        self,
        blacklist: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network],
        resolve: Resolver,
        clock: IReactorTime,
        timeout: float,
    ) -> None:
        self._blacklist = tuple(blacklist)
        self._resolve = resolve
        self._clock = clock
        self._timeout = timeout

    def blocked(self, address: str) -> bool:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        forms = [ip]
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            forms.append(ip.ipv4_mapped)
        return any(
            form in network
            for form in forms
            for network in self._blacklist
            if form.version == network.version
        )

    async def check(self, uri: str) -> Target:
        """Raise UriRefused or Unresolvable, else the target with its checked addresses."""
        scheme = uri.split(":", 1)[0] if ":" in uri else ""
        if scheme not in ("http", "https"):
            raise UriRefused("scheme", "")
        try:
            parts = urlsplit(uri)
            host = parts.hostname or ""
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError:
            raise UriRefused("host", "") from None
        if not host:
            raise UriRefused("host", "")
        try:
            addresses = [str(ipaddress.ip_address(host))]
        except ValueError:
            try:
                d = Deferred.fromCoroutine(self._resolve(host, port))
                addresses = await d.addTimeout(self._timeout, self._clock)
            except CancelledError:
                # Our caller gave up (the delivery deadline or shutdown), not the resolver.
                raise
            except Exception as e:
                raise Unresolvable(host, type(e).__name__) from None
            if not addresses:
                raise Unresolvable(host, "no address") from None
        for address in addresses:
            if self.blocked(address):
                raise UriRefused("blacklisted address", host)
        return Target(uri=uri, scheme=scheme, host=host, port=port, addresses=tuple(addresses))
