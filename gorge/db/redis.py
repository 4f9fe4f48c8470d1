"""Redis access through txredisapi, imported lazily.

txredisapi binds the global reactor when it is imported, so nothing imports
it at module level: :func:`make_redis` does, from ``makeService`` or a test."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.defer import TimeoutError as DeferredTimeoutError
from twisted.internet.interfaces import IReactorTime

__all__ = [
    "RedisSettings",
    "parse_redis_addr",
    "make_redis",
    "tls_options",
    "LuaScript",
    "ping",
]


@dataclass(frozen=True)
class RedisSettings:
    """``username``: an ACL user (Redis 6 and later; empty: the default user).
    ``tls``: ``verify`` speaks TLS and checks the server's certificate against
    ``tls_ca`` (a PEM file; empty: the system's CAs) and ``host``.
    ``sentinels``: Sentinel addresses; when set, ``host``/``port`` are
    unused and the master of ``sentinel_service`` is asked of them before
    every connection, so a failover is followed by reconnecting."""

    host: str = "127.0.0.1"
    port: int = 6379
    db: int = 0
    password: str = field(default="", repr=False)
    poolsize: int = 10
    connect_timeout: float = 5
    reply_timeout: float = 30
    username: str = ""
    tls: str = "disabled"
    tls_ca: str = ""
    sentinels: tuple[tuple[str, int], ...] = ()
    sentinel_service: str = "mymaster"


def parse_redis_addr(addr: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too); raises ValueError with the reason."""
    match = re.fullmatch(r"(?:\[([0-9A-Fa-f:.]+)\]|([^:\[\]]+)):([0-9]+)", addr.strip())
    if match is None:
        raise ValueError(f"not a host:port address: {addr!r}")
    port = int(match.group(3))
    if not 1 <= port <= 65535:
        raise ValueError(f"port out of range: {addr!r}")
    return (match.group(1) or match.group(2)), port


def make_redis(settings: RedisSettings, reactor: Any = None) -> Any:
    """A lazy txredisapi connection pool (no connection attempt until used),
    connecting through ``reactor`` (the global one when None).

    txredisapi's own connection functions always take the global reactor;
    the factory they build is public, so it is built here with an endpoint on
    the reactor the daemon was given. (Its retry timers still run on the
    global reactor, which is the same one in a daemon.)

    ``convertNumbers=False``: the default turns ``"0012"`` into ``12``.
    """
    import txredisapi
    from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS

    if reactor is None:
        from twisted.internet import reactor as global_reactor

        reactor = global_reactor
    if settings.sentinels:
        return _master_of_sentinels(settings)
    factory = txredisapi.RedisFactory(
        f"{settings.host}:{settings.port}",
        settings.db or None,  # 0 is the default; SELECT 0 on a closing pool only adds noise
        settings.poolsize,
        isLazy=True,
        handler=txredisapi.ConnectionHandler,
        charset="utf-8",
        password=settings.password or None,
        replyTimeout=settings.reply_timeout,
        convertNumbers=False,
        username=settings.username or None,
    )
    factory.reconnect = True
    endpoint: Any = HostnameEndpoint(
        reactor, settings.host, settings.port, timeout=settings.connect_timeout
    )
    if settings.tls == "verify":
        endpoint = wrapClientTLS(tls_options(settings.host, settings.tls_ca), endpoint)
    factory.startConnecting(endpoint)
    return factory.handler


def tls_options(host: str, ca_path: str) -> Any:
    """Client TLS that checks the server's certificate against ``ca_path`` (a
    PEM file of one or more CAs; empty: the system's) and its name against ``host``."""
    from twisted.internet import ssl

    if not ca_path:
        return ssl.optionsForClientTLS(host)
    with open(ca_path, "rb") as pem:
        data = pem.read()
    roots = [ssl.Certificate.loadPEM(block) for block in _pem_blocks(data)]
    trust = roots[0] if len(roots) == 1 else ssl.trustRootFromCertificates(roots)
    return ssl.optionsForClientTLS(host, trustRoot=trust)


def _pem_blocks(data: bytes) -> list[bytes]:
    end = b"-----END CERTIFICATE-----"
    return [block + end for block in data.split(end) if b"-----BEGIN CERTIFICATE-----" in block]


def _master_of_sentinels(settings: RedisSettings) -> Any:
    """A pool whose every connection goes to the master Sentinel names now:
    txredisapi asks the sentinels before each connection and drops the pool's
    connections when the answer changes (a failover). Its sentinel and
    master connections run on the global reactor (a daemon's reactor)."""
    import txredisapi

    sentinel = txredisapi.Sentinel(list(settings.sentinels))
    return sentinel.master_for(
        settings.sentinel_service,
        dbid=settings.db or None,
        poolsize=settings.poolsize,
        isLazy=True,
        charset="utf-8",
        password=settings.password or None,
        username=settings.username or None,
        replyTimeout=settings.reply_timeout,
        convertNumbers=False,
    )


class LuaScript:
    """A script run by EVALSHA, loaded again after ``NOSCRIPT`` (a restarted
    or flushed server forgets loaded scripts)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()

    def run(self, conn: Any, keys: Sequence[str] = (), args: Sequence[Any] = ()) -> Deferred:
        """The script's answer. A plain Deferred chain rather than a
        coroutine: this runs for every queue call."""
        keys, args = list(keys), [str(a) if not isinstance(a, (str, bytes)) else a for a in args]

        def load_and_run(failure: Any) -> Any:
            e = failure.value
            if "NOSCRIPT" not in str(e) and type(e).__name__ != "ScriptDoesNotExist":
                return failure
            return conn.eval(self.source, keys=keys, args=args)

        return conn.evalsha(self.sha, keys=keys, args=args).addErrback(load_and_run)


READ_ONLY_REASON = "database read-only"


def is_read_only(error: BaseException) -> bool:
    """Whether ``error`` is the server refusing a write because it takes none
    now (``READONLY``: a replica, such as a master Sentinel demoted)."""
    return str(error).startswith("READONLY")


def role_takes_writes(role: Any) -> bool:
    """Whether a ``ROLE`` answer is a master's (the first element names the role)."""
    first = role[0] if isinstance(role, (list, tuple)) and role else role
    if isinstance(first, bytes):
        first = first.decode("ascii", "replace")
    return first == "master"


async def ping(conn: Any, clock: IReactorTime, timeout: float = 5) -> str | None:
    """None when Redis answers PING in time, else a short reason."""
    try:
        d: Deferred = conn.ping()
        await d.addTimeout(timeout, clock)
    except DeferredTimeoutError:
        return "redis ping timed out"
    except Exception as e:
        name = type(e).__name__
        if "Auth" in name or "NOAUTH" in str(e) or "WRONGPASS" in str(e):
            return "redis authentication failed"
        return "redis unreachable"
    return None
