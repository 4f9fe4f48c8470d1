"""Why an outbound call failed, in one word (Cause), from whatever
Twisted raised."""

from __future__ import annotations

import enum

from twisted.internet import defer, error
from twisted.python.failure import Failure
from twisted.web.client import (
    PartialDownloadError,
    RequestGenerationFailed,
    RequestNotSent,
    RequestTransmissionFailed,
    ResponseFailed,
    ResponseNeverReceived,
)

# ---------------------------------------------------------------- what went wrong


class Cause(enum.Enum):
    """What ended an exchange without a usable answer; the value is the
    plain-words description. Callers map it to their own vocabulary (the
    mailer's "submitted or not", the webhook's cURL codes)."""

    DEADLINE = "deadline reached"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed out"  # a timeout other than the exchange's deadline (connect)
    DNS = "DNS lookup failed"
    REFUSED = "connection refused"
    CONNECT = "connect failed"
    CERTIFICATE = "TLS certificate not accepted"
    TLS = "TLS error"
    NOT_SENT = "request not sent"
    SEND_FAILED = "connection failed while sending the request"
    EMPTY_REPLY = "connection closed"  # before any byte of a status line
    RESET = "connection lost"  # before any byte of a status line
    HEAD_CUT = "connection lost inside the response head"
    BODY_CUT = "response body cut short"
    BODY_TOO_LARGE = "response body over the limit"
    OTHER = "failed"

    @property
    def tls(self) -> bool:
        return self in (Cause.CERTIFICATE, Cause.TLS)


class BodyCutShort(Exception):
    """The connection failed while the response body was being read: the
    body ended before its declared end. ``reasons`` holds the failure."""

    def __init__(self, reason: Failure) -> None:
        super().__init__(str(reason.value))
        self.reasons = [reason]


class BodyTooLarge(Exception):
    """The response body went past the limit the caller set."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} bytes")
        self.limit = limit


def reasons_of(exc: BaseException) -> list[BaseException]:
    """``exc`` and every reason nested in it, depth first (Twisted's client
    errors wrap their causes in a ``reasons`` list of failures)."""
    found = [exc]
    for reason in getattr(exc, "reasons", None) or ():
        value = reason.value if isinstance(reason, Failure) else reason
        if isinstance(value, BaseException):
            found.extend(reasons_of(value))
    return found


def leaf_reasons(exc: BaseException) -> list[BaseException]:
    """The innermost reasons: what actually happened underneath the wrappers."""
    return [r for r in reasons_of(exc) if not getattr(r, "reasons", None)]


def _is_tls(exc: BaseException) -> bool:
    module = type(exc).__module__
    return module.startswith(("OpenSSL", "service_identity"))


def _is_certificate(exc: BaseException) -> bool:
    return type(exc).__name__ == "VerificationError" or "certificate verify failed" in str(exc)


def tls_cause(exc: BaseException) -> Cause | None:
    """CERTIFICATE or TLS when TLS broke anywhere under ``exc``, else None."""
    return _tls_cause_among(reasons_of(exc))


def tls_detail(exc: BaseException) -> str:
    """What TLS said under ``exc``, in its own words ("certificate verify
    failed", a name mismatch), or "" when TLS said nothing."""
    words: list[str] = []
    for reason in reasons_of(exc):
        if not _is_tls(reason):
            continue
        args = reason.args[0] if reason.args else None
        if isinstance(args, list):  # OpenSSL's [(library, function, reason), ...]
            words += [str(entry[-1]) for entry in args if isinstance(entry, tuple) and entry]
        else:
            words.append(str(reason))
    return "; ".join(dict.fromkeys(word for word in words if word))


def _tls_cause_among(found: list[BaseException]) -> Cause | None:
    if any(_is_tls(r) for r in found):
        return Cause.CERTIFICATE if any(_is_certificate(r) for r in found) else Cause.TLS
    return None


# First match wins, over the exception and every reason inside it.
_BY_TYPE: tuple[tuple[tuple[type, ...], Cause], ...] = (
    ((defer.CancelledError, error.ConnectingCancelledError), Cause.CANCELLED),
    # error.TimeoutError (Twisted's connect timeout) is also a ConnectError.
    ((defer.TimeoutError, error.TimeoutError), Cause.TIMED_OUT),
    ((error.DNSLookupError,), Cause.DNS),
    ((error.ConnectionRefusedError,), Cause.REFUSED),
    ((error.ConnectError,), Cause.CONNECT),
    ((RequestNotSent, RequestGenerationFailed), Cause.NOT_SENT),
    ((RequestTransmissionFailed,), Cause.SEND_FAILED),
    ((BodyTooLarge,), Cause.BODY_TOO_LARGE),
    ((BodyCutShort, PartialDownloadError), Cause.BODY_CUT),
)


def classify(exc: BaseException) -> Cause:
    """The :class:`Cause` of a failed exchange from the exception it raised.

    Our own deadline cannot be told from the exception (it surfaces as a
    cancel); :func:`exchange` records it itself.
    """
    if isinstance(exc, TransportFailure):
        return exc.cause
    found = reasons_of(exc)
    tls = _tls_cause_among(found)
    if tls is not None:
        return tls
    for types, cause in _BY_TYPE:
        if any(isinstance(r, types) for r in found):
            return cause
    if isinstance(exc, ResponseNeverReceived):
        if any(isinstance(r, error.ConnectionDone) for r in found):
            return Cause.EMPTY_REPLY
        if any(isinstance(r, error.ConnectionLost) for r in found):
            return Cause.RESET
    if isinstance(exc, ResponseFailed):
        # The connection ended inside the status line or the headers.
        return Cause.HEAD_CUT
    return Cause.OTHER


class TransportFailure(Exception):
    """An exchange that got no usable answer.

    ``cause`` says what happened; ``submitted`` is False only when the
    request provably did not reach the connection in full; ``error`` is the
    exception it came from (``reasons`` wraps it the way Twisted's client
    errors wrap theirs).
    """

    def __init__(
        self, cause: Cause, error: BaseException | None = None, *, submitted: bool = False
    ) -> None:
        super().__init__(cause.value)
        self.cause = cause
        self.error = error
        self.submitted = submitted
        self.reasons = [error] if error is not None else []

    @classmethod
    def from_error(
        cls, error: BaseException, *, submitted: bool, deadline: bool = False
    ) -> TransportFailure:
        cause = Cause.DEADLINE if deadline else classify(error)
        kind = ExchangeCancelled if cause is Cause.CANCELLED else cls
        return kind(cause, error, submitted=submitted)

    def __str__(self) -> str:
        if self.error is not None:
            if self.cause is Cause.OTHER:
                return type(reasons_of(self.error)[-1]).__name__
            if isinstance(self.error, BodyTooLarge):
                return f"{self.cause.value} of {self.error.limit} bytes"
        return self.cause.value


class ExchangeCancelled(TransportFailure, defer.CancelledError):
    """The caller cancelled the exchange. It is a ``CancelledError`` (so a
    cancel stays a cancel for callers that only pass it on) and a
    :class:`TransportFailure` (so callers that must classify it know how
    far the request got)."""
