"""One bounded delivery POST and the code it records.

The connection goes to an address the URI policy checked, while ``Host``,
SNI and certificate checks still use the hook's host name
(:mod:`gorge.webhook.poster` keeps the connections).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urljoin

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.defer import TimeoutError as DeferredTimeout

from gorge.client.failure import BodyCutShort, Cause, classify, leaf_reasons
from gorge.webhook.payload import ERROR_TYPE_HTTP, ERROR_TYPE_TIMEOUT
from gorge.webhook.poster import Poster, request_bytes
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

__all__ = [
    "Attempt",
    "BodyCutShort",
    "Transport",
    "transport_code",
    "USER_AGENT",
    "MAX_REDIRECTS",
    "CODE_TIMEOUT",
    "CODE_UNRESOLVED",
    "CODE_CONNECT",
    "CODE_PARTIAL",
    "CODE_TLS",
    "CODE_EMPTY_REPLY",
    "CODE_RESET",
    "CODE_CERTIFICATE",
    "CODE_OTHER",
]


@dataclass(frozen=True)
class Attempt:
    """The outcome of one delivery attempt; ``aborted`` means nothing may be written."""

    ok: bool = False
    error_type: str = ERROR_TYPE_HTTP
    code: int | str = CODE_OTHER
    detail: str = ""
    aborted: bool = False
    retry_after: bytes | None = None  # the final answer's Retry-After header, as sent


# cURL's code for each cause of a failed exchange; anything else is CODE_OTHER.
_CURL_CODES = {
    Cause.DEADLINE: CODE_TIMEOUT,
    Cause.CANCELLED: CODE_TIMEOUT,
    Cause.TIMED_OUT: CODE_TIMEOUT,
    Cause.DNS: CODE_UNRESOLVED,
    Cause.REFUSED: CODE_CONNECT,
    Cause.CONNECT: CODE_CONNECT,
    Cause.CERTIFICATE: CODE_CERTIFICATE,
    Cause.TLS: CODE_TLS,
    Cause.BODY_CUT: CODE_PARTIAL,
    Cause.EMPTY_REPLY: CODE_EMPTY_REPLY,
    Cause.RESET: CODE_RESET,
    # HEAD_CUT, a connection that ended inside the status line or the
    # headers, is "anything else", not a body cut short.
}


def transport_code(exc: BaseException) -> int:
    """cURL's code for a transport failure; our own deadline is decided elsewhere."""
    if isinstance(exc, Unresolvable):
        return CODE_UNRESOLVED
    return _CURL_CODES.get(classify(exc), CODE_OTHER)


class Transport:
    """POSTs over one shared connection pool, each exchange under one deadline."""

    def __init__(
        self,
        reactor,
        policy: UriPolicy,
        timeout: float,
        *,
        max_per_host: int = 8,
        trust_root=None,
    ) -> None:
        self._reactor = reactor
        self._policy = policy
        self._timeout = timeout
        # trust_root None: the platform's CA store. Tests pass their own CA.
        self._poster = Poster(
            reactor, connect_timeout=timeout, max_idle=max(max_per_host, 2), trust_root=trust_root
        )
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
                return Attempt(
                    error_type=ERROR_TYPE_TIMEOUT, code=CODE_TIMEOUT, detail=type(e).__name__
                )
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
        return Attempt(
            ok=200 <= status < 300, error_type=ERROR_TYPE_HTTP, code=status, retry_after=retry_after
        )

    async def _exchange(
        self, target: Target, body: bytes, headers: dict[str, str]
    ) -> tuple[int, bytes | None]:
        """The final status, and its Retry-After header if it had one."""
        send_headers = {**headers, "User-Agent": USER_AGENT}
        for _ in range(MAX_REDIRECTS + 1):
            # The body of the answer is read to its end (and dropped), so the
            # connection can be reused; the deadline is attempt()'s.
            reply = await self._poster.post(target, request_bytes(target, send_headers, body))
            reply.require_body()
            location = reply.header("location")
            retry_after = reply.header("retry-after")
            answer = reply.status, None if retry_after is None else retry_after.encode("latin-1")
            if reply.status not in (307, 308) or not location:
                return answer
            try:
                target = await self._policy.check(urljoin(target.uri, location))
            except UriRefused:
                return answer
            # Unresolvable propagates: not a refusal, a failed attempt (code 6).
        return answer

    def abort_all(self) -> None:
        """Shutdown budget spent: cut the exchanges still open; their rows get no write."""
        self._aborting = True
        for exchange in list(self._running):
            self._cut.add(exchange)
            exchange.cancel()

    async def close(self) -> None:
        await self._poster.close()


def _describe(exc: BaseException) -> str:
    inner = leaf_reasons(exc)[0]
    return f"{type(inner).__name__}: {inner}"[:200]
