"""What the four HTTP provider backends share.

* :func:`endpoint_url` -- the optional ``endpoint`` option (base URL; plain
  ``http`` for loopback hosts only).
* :func:`post` -- one bounded POST (:func:`gorge.client.exchange.exchange`)
  through the service's agent: never follows redirects, reads at most
  64 KiB of answer, and raises :class:`PostFailed` with ``submitted``
  telling whether the whole request had been handed to the transport when
  it failed.
* :func:`classify_status` / :func:`failure_outcome` -- the generic tables
  that turn an HTTP status or a transport failure into an :class:`Outcome`.
* :func:`json_body` / :func:`json_object` -- the JSON a provider is sent and
  the JSON receipt it answers with.

Where the line between "not submitted" and "may have been accepted" runs:
the request body is written by :class:`gorge.client.exchange.OneShotBody` in a single call once
the connection is up, so "the body producer ran" is the moment the complete
request was handed over -- for ``https`` only once the TLS handshake has
also completed, because TLS buffers application bytes until then. A failure
before that point (DNS, refused, connect timeout, a stalled or failed
handshake, our deadline or a cancel meanwhile) provably delivered nothing
-> ``TRANSIENT``. Anything else after the hand-over without a status line ->
``UNKNOWN``.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from twisted.internet.interfaces import IReactorTime
from twisted.web.client import ResponseFailed

from gorge.client.exchange import Reply, exchange
from gorge.client.failure import Cause, TransportFailure
from gorge.log.redaction import scrub
from gorge.mailer.backends.base import BackendEntry
from gorge.mailer.outcome import Outcome, parse_retry_after

#: Whole exchange, body read included (always clipped to the dispatch deadline).
REQUEST_CAP = 20.0
#: Connect + TLS handshake + response headers.
HEADERS_TIMEOUT = 10.0
#: TCP connect cap; the service's ``Agent(connectTimeout=...)`` enforces it.
CONNECT_TIMEOUT = 5.0
#: Response bytes we read; one more and the body counts as unavailable.
RESPONSE_LIMIT = 65536
#: Characters of a provider's error body quoted in a cause.
EXCERPT = 200


class PostFailed(Exception):
    """No status line came back. ``submitted`` is False only when the
    request provably did not reach the server in full."""

    def __init__(self, submitted: bool, reason: str) -> None:
        super().__init__(reason)
        self.submitted = submitted
        self.reason = reason


#: A status line was received (``gorge.client.exchange.Reply``). ``body`` is
#: ``None`` when it could not be read in full (reset, deadline, over
#: :data:`RESPONSE_LIMIT`).
HttpReply = Reply


# ---------------------------------------------------------------- config


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def endpoint_url(
    entry: BackendEntry, default: str, *, name: str = "endpoint", bare_host: bool = False
) -> str:
    """The base URL from option ``name`` (or ``default``), without a trailing
    slash. ``bare_host`` lets ``email.us-west-2.amazonaws.com`` mean
    ``https://email.us-west-2.amazonaws.com`` (Phorge's documented SES form)."""
    raw = entry.str(name, "").strip()
    if not raw:
        return default.rstrip("/")
    if bare_host and "://" not in raw:
        raw = "https://" + raw
    parts = urlsplit(raw)
    scheme = parts.scheme.lower()
    # Reasons never echo the value: a URL may carry userinfo.
    if scheme not in ("http", "https") or not parts.hostname:
        raise entry.error(name, "must be an http(s) URL with a host")
    if parts.username is not None or parts.password is not None:
        raise entry.error(name, "must not contain credentials")
    if parts.query or parts.fragment:
        raise entry.error(name, "must not contain a query or fragment")
    try:
        _ = parts.port  # urlsplit checks the port only when asked for it
    except ValueError:
        raise entry.error(name, "has an invalid port") from None
    if scheme == "http" and not _is_loopback(parts.hostname):
        raise entry.error(name, "plain http is allowed for loopback hosts only; use https")
    return raw.rstrip("/")


# ---------------------------------------------------------------- the POST


def _post_failed(failure: TransportFailure) -> PostFailed:
    """Where the line between TRANSIENT and UNKNOWN runs (module docstring)."""
    if failure.cause.tls and not failure.submitted:
        return PostFailed(False, "TLS handshake failed")
    # After the hand-over (for https: after the handshake) a TLS error is a
    # broken connection like any other: the provider may have the request.
    what = "TLS error" if failure.cause.tls else str(failure)
    if not failure.submitted:
        return PostFailed(False, f"{what} before the request was sent")
    if isinstance(failure.error, ResponseFailed) or failure.cause is Cause.DEADLINE:
        return PostFailed(True, f"{what} after the request was sent, no response")
    return PostFailed(True, f"{what} after the request was sent")


def transport_failure(exc: BaseException, *, handed_over: bool, deadline_fired: bool) -> PostFailed:
    """Classify an exception from the request phase (no status line yet)."""
    return _post_failed(
        TransportFailure.from_error(exc, submitted=handed_over, deadline=deadline_fired)
    )


async def post(
    agent: Any,
    clock: IReactorTime,
    url: str,
    *,
    body: bytes,
    headers: Mapping[str, str],
    deadline: float,
    limit: int = RESPONSE_LIMIT,
) -> HttpReply:
    """POST ``body`` to ``url`` through the service's agent and return the
    answer; one :func:`gorge.client.exchange.exchange`.

    ``deadline`` is absolute on ``clock``; the exchange also stops after
    :data:`REQUEST_CAP` seconds and waits at most :data:`HEADERS_TIMEOUT`
    for the status line. Raises :class:`PostFailed` when no status line was
    received (cancellation of the awaiting Deferred included). The status
    line is the verdict: a body that could not be read is ``None``, and
    each provider says what a missing receipt means.
    """
    started = clock.seconds()
    budget = min(REQUEST_CAP, deadline - started)
    if budget <= 0:
        raise PostFailed(False, "deadline reached before start")
    try:
        return await exchange(
            agent,
            clock,
            "POST",
            url,
            headers=headers,
            body=body,
            deadline=started + budget,
            headers_deadline=started + HEADERS_TIMEOUT,
            body_limit=limit,
        )
    except TransportFailure as failure:
        raise _post_failed(failure) from None


# ---------------------------------------------------------------- verdicts


def excerpt(body: bytes | None, secrets: Iterable[str] = (), size: int = EXCERPT) -> str:
    """The first ``size`` characters of a body, whitespace collapsed, secrets removed."""
    if not body:
        return ""
    text = " ".join(body[: size * 4].decode("utf-8", errors="replace").split())
    return scrub(text, secrets)[:size]


def error_text(provider: str, reply: HttpReply, secrets: Iterable[str] = ()) -> str:
    """``<provider>: HTTP <status>: <first part of body>``."""
    text = f"{provider}: HTTP {reply.status}"
    quoted = excerpt(reply.body, secrets)
    if reply.body is None and not 200 <= reply.status < 300:
        quoted = "(body unreadable)"
    return f"{text}: {quoted}" if quoted else text


def classify_status(
    provider: str, reply: HttpReply, now: float, secrets: Iterable[str] = ()
) -> Outcome | None:
    """The generic status table; ``None`` for 2xx (the provider's
    receipt rule decides)."""
    status = reply.status
    if 200 <= status < 300:
        return None
    cause = error_text(provider, reply, secrets)
    if status in (401, 403, 404, 407):
        return Outcome.rejected_backend(cause)
    if status in (408, 425, 429, 503):
        return Outcome.transient(
            cause, retry_after=parse_retry_after(reply.header("retry-after"), now)
        )
    if 400 <= status < 500:
        return Outcome.rejected_unscoped(cause)
    # 1xx leftovers, 3xx (never followed) and the other 5xx: the request
    # may have been processed.
    return Outcome.unknown(cause)


def json_object(body: bytes | None) -> dict[str, Any] | None:
    """A receipt body as a JSON object, or ``None`` if it is missing, not
    UTF-8, not JSON or not an object."""
    if body is None:
        return None
    try:
        doc = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def failure_outcome(provider: str, failure: PostFailed) -> Outcome:
    cause = f"{provider}: {failure.reason}"
    if failure.submitted:
        return Outcome.unknown(cause)
    return Outcome.transient(cause)


# ---------------------------------------------------------------- backends


def json_body(doc: Mapping[str, Any]) -> bytes:
    """A provider's JSON request body: compact, UTF-8 rather than escapes."""
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


@dataclass(frozen=True)
class ProviderRequest:
    """One fully built provider request. Credentials live in ``headers``,
    which never shows in ``repr``."""

    url: str
    body: bytes = field(repr=False)
    headers: Mapping[str, str] = field(repr=False)


class HttpBackend:
    """Common ``send`` for the provider backends: deadline check, one bounded
    POST, classification. Subclasses set ``type`` and implement the two pure
    halves: :meth:`build_request` and :meth:`classify`."""

    type = ""

    def __init__(self, entry: BackendEntry, *, clock: IReactorTime, client: Any) -> None:
        self.key = entry.key
        self.priority = entry.priority
        self._clock = clock
        self._client = client

    def __repr__(self) -> str:
        return f"<{type(self).__name__} key={self.key!r} priority={self.priority}>"

    def secrets(self) -> tuple[str, ...]:
        """Credential values to scrub from anything quoted back."""
        return ()

    def build_request(self, message: Any) -> ProviderRequest:
        raise NotImplementedError

    def classify(self, reply: HttpReply, now: float) -> Outcome:
        raise NotImplementedError

    async def send(self, message: Any, *, deadline: float) -> Outcome:
        if deadline - self._clock.seconds() <= 0:
            return Outcome.transient(f"{self.type}: deadline reached before start")
        request = self.build_request(message)
        try:
            reply = await post(
                self._client,
                self._clock,
                request.url,
                body=request.body,
                headers=request.headers,
                deadline=deadline,
            )
        except PostFailed as failed:
            return failure_outcome(self.type, failed)
        return self.classify(reply, self._clock.seconds())


__all__ = [
    "HttpBackend",
    "ProviderRequest",
    "CONNECT_TIMEOUT",
    "HEADERS_TIMEOUT",
    "REQUEST_CAP",
    "RESPONSE_LIMIT",
    "HttpReply",
    "PostFailed",
    "classify_status",
    "endpoint_url",
    "error_text",
    "excerpt",
    "failure_outcome",
    "json_body",
    "json_object",
    "post",
    "transport_failure",
]
