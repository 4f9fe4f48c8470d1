"""One bounded delivery POST and the code it records.

The connection goes to an address the URI policy checked, while ``Host``,
SNI and certificate checks still use the hook's host name.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import cast
from urllib.parse import urljoin

from twisted.internet import error as net_error
from twisted.internet.defer import CancelledError, Deferred, TimeoutError as DeferredTimeout
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP6ClientEndpoint, wrapClientTLS
from twisted.internet.interfaces import IPushProducer, IStreamClientEndpoint
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.ssl import optionsForClientTLS
from twisted.python.failure import Failure
from twisted.web.client import (
    Agent,
    HTTPConnectionPool,
    PartialDownloadError,
    ResponseDone,
    ResponseNeverReceived,
)
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory
from zope.interface import implementer

from gorge.httpclient import OneShotBody, QuietEndpoint, make_pool
from gorge.webhook.payload import ERROR_TYPE_HTTP, ERROR_TYPE_TIMEOUT
from gorge.webhook.uripolicy import Target, Unresolvable, UriPolicy, UriRefused

USER_AGENT = "gorge-webhook"
MAX_REDIRECTS = 10

CODE_TIMEOUT = 28  # cURL's codes, as Phorge's worker records them
CODE_UNRESOLVED = 6
CODE_CONNECT = 7
CODE_PARTIAL = 18
CODE_TLS = 35
CODE_EMPTY_REPLY = 52
CODE_RESET = 56
CODE_CERTIFICATE = 60
CODE_OTHER = 0


@implementer(IAgentEndpointFactory)
class _CheckedEndpointFactory:
    """Connect to the address the policy checked, keep the name for Host/SNI/certificate."""

    def __init__(self, reactor, target: Target, connect_timeout: float, trust_root=None) -> None:
        self._reactor = reactor
        self._target = target
        self._timeout = connect_timeout
        self._trust_root = trust_root

    def endpointForURI(self, uri):
        address = self._target.addresses[0]
        port = uri.port
        endpoint: IStreamClientEndpoint
        if ipaddress.ip_address(address.split("%", 1)[0]).version == 6:
            endpoint = TCP6ClientEndpoint(self._reactor, address, port, timeout=self._timeout)
        else:
            endpoint = TCP4ClientEndpoint(self._reactor, address, port, timeout=self._timeout)
        if uri.scheme == b"https":
            endpoint = wrapClientTLS(
                optionsForClientTLS(self._target.host, trustRoot=self._trust_root), endpoint)
        return QuietEndpoint(endpoint)


@dataclass(frozen=True)
class Attempt:
    """The outcome of one delivery attempt; ``aborted`` means nothing may be written."""

    ok: bool = False
    error_type: str = ERROR_TYPE_HTTP
    code: int | str = CODE_OTHER
    detail: str = ""
    aborted: bool = False
    retry_after: bytes | None = None  # the final answer's Retry-After header, as sent


class BodyCutShort(Exception):
    """The connection failed while the response body was being read: the
    body ended before its declared end. ``reasons`` holds the failure."""

    def __init__(self, reason: Failure) -> None:
        super().__init__(str(reason.value))
        self.reasons = [reason]


class _Discard(Protocol):
    """Reads a response body to its end and keeps none of it."""

    def __init__(self, done: Deferred) -> None:
        self._done = done

    def dataReceived(self, data: bytes) -> None:
        pass

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self._done.called:
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            self._done.callback(None)
        else:
            self._done.errback(BodyCutShort(reason))


def _discard_body(response) -> Deferred:
    protocol: _Discard

    def cancel(d: Deferred) -> None:
        if protocol.transport is not None:
            cast(IPushProducer, protocol.transport).stopProducing()

    done: Deferred = Deferred(cancel)
    protocol = _Discard(done)
    response.deliverBody(protocol)
    return done


def _reasons(exc: BaseException) -> list[BaseException]:
    found = []
    for reason in getattr(exc, "reasons", None) or []:
        inner = cast(BaseException, reason.value) if isinstance(reason, Failure) else reason
        found.extend(_reasons(inner) or [inner])
    return found


def transport_code(exc: BaseException) -> int:
    """cURL's code for a transport failure; our own deadline is decided elsewhere."""
    if isinstance(exc, Unresolvable):
        return CODE_UNRESOLVED
    if isinstance(exc, net_error.TimeoutError):
        return CODE_TIMEOUT
    if isinstance(exc, net_error.ConnectError):
        return CODE_CONNECT
    if isinstance(exc, PartialDownloadError):
        return CODE_PARTIAL
    reasons = _reasons(exc)
    for reason in reasons:
        if isinstance(reason, net_error.TimeoutError):
            return CODE_TIMEOUT
        if isinstance(reason, net_error.ConnectError):
            return CODE_CONNECT
        name = type(reason).__name__
        text = str(reason)
        if name == "VerificationError" or "certificate verify failed" in text:
            return CODE_CERTIFICATE
        if type(reason).__module__.startswith("OpenSSL"):
            return CODE_TLS
    if isinstance(exc, BodyCutShort):
        return CODE_PARTIAL
    if isinstance(exc, ResponseNeverReceived):
        if any(isinstance(r, net_error.ConnectionDone) for r in reasons):
            return CODE_EMPTY_REPLY
        if any(isinstance(r, net_error.ConnectionLost) for r in reasons):
            return CODE_RESET
    # A ResponseFailed before the body closed inside the status line or the
    # headers: "anything else", not a body cut short.
    return CODE_OTHER


class Transport:
    """POSTs over one shared connection pool, each exchange under one deadline."""

    def __init__(self, reactor, policy: UriPolicy, timeout: float, *,
                 pool: HTTPConnectionPool | None = None, max_per_host: int = 8,
                 trust_root=None) -> None:
        self._reactor = reactor
        self._policy = policy
        self._timeout = timeout
        # None: the platform's CA store. Tests pass their own CA.
        self._trust_root = trust_root
        if pool is None:
            pool = make_pool(reactor, max_per_host=max(max_per_host, 2))
        self._pool = pool
        self._running: set[Deferred] = set()
        self._cut: set[Deferred] = set()  # exchanges abort_all cancelled
        self._aborting = False

    async def attempt(self, target: Target, body: bytes, headers: dict[str, str]) -> Attempt:
        """One delivery: redirects (307/308 only) and the body read share the deadline."""
        deadline_fired = []
        exchange = Deferred.fromCoroutine(self._exchange(target, body, headers))
        self._running.add(exchange)

        def expire() -> None:
            deadline_fired.append(True)
            exchange.cancel()

        timer = self._reactor.callLater(self._timeout, expire)
        try:
            status, retry_after = await exchange
        except Exception as e:
            if self._aborting:
                return Attempt(aborted=True, detail="shutdown")
            if deadline_fired:
                return Attempt(error_type=ERROR_TYPE_TIMEOUT, code=CODE_TIMEOUT, detail="deadline")
            if isinstance(e, (CancelledError, DeferredTimeout)):
                return Attempt(error_type=ERROR_TYPE_TIMEOUT, code=CODE_TIMEOUT,
                               detail=type(e).__name__)
            code = transport_code(e)
            error_type = ERROR_TYPE_TIMEOUT if code == CODE_TIMEOUT else ERROR_TYPE_HTTP
            return Attempt(error_type=error_type, code=code, detail=_describe(e))
        finally:
            self._running.discard(exchange)
            cut = exchange in self._cut
            self._cut.discard(exchange)
            if timer.active():
                timer.cancel()
        # A cancel that landed where it could be absorbed still ends the exchange
        # as cancelled: never record a status that arrived before the cut.
        if cut:
            return Attempt(aborted=True, detail="shutdown")
        if deadline_fired:
            return Attempt(error_type=ERROR_TYPE_TIMEOUT, code=CODE_TIMEOUT, detail="deadline")
        return Attempt(ok=200 <= status < 300, error_type=ERROR_TYPE_HTTP, code=status,
                       retry_after=retry_after)

    async def _exchange(self, target: Target, body: bytes,
                        headers: dict[str, str]) -> tuple[int, bytes | None]:
        """The final status, and its Retry-After header if it had one."""
        send_headers = Headers({name.encode("ascii"): [value.encode("ascii")]
                                for name, value in headers.items()})
        send_headers.setRawHeaders(b"user-agent", [USER_AGENT.encode("ascii")])
        for _ in range(MAX_REDIRECTS + 1):
            agent = Agent.usingEndpointFactory(
                self._reactor,
                _CheckedEndpointFactory(self._reactor, target, self._timeout, self._trust_root),
                pool=self._pool)
            response = await agent.request(b"POST", target.uri.encode("utf-8"), send_headers,
                                           OneShotBody(body))
            # Read the body to the end so the connection can be reused.
            await _discard_body(response)
            location = response.headers.getRawHeaders(b"location") or []
            retry_after = (response.headers.getRawHeaders(b"retry-after") or [None])[0]
            if response.code not in (307, 308) or not location:
                return response.code, retry_after
            try:
                target = await self._policy.check(
                    urljoin(target.uri, location[0].decode("latin-1")))
            except UriRefused:
                return response.code, retry_after
            # Unresolvable propagates: not a refusal, a failed attempt (code 6).
        return response.code, retry_after

    def abort_all(self) -> None:
        """Shutdown budget spent: cut the exchanges still open; their rows get no write."""
        self._aborting = True
        for exchange in list(self._running):
            self._cut.add(exchange)
            exchange.cancel()

    async def close(self) -> None:
        await self._pool.closeCachedConnections()


def _describe(exc: BaseException) -> str:
    reasons = _reasons(exc)
    inner = reasons[0] if reasons else exc
    return f"{type(inner).__name__}: {inner}"[:200]
