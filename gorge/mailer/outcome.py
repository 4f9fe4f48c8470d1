"""The outcome of one backend attempt.

Every ``Backend.send`` call ends in exactly one :class:`Outcome`. Backends
never raise for a delivery failure: they classify it. The dispatcher
decides from ``Outcome.kind`` alone whether to answer, retry, or fail over.

Two rules govern every classification:

1. If unsure, never ``REJECTED_MESSAGE``.
2. Retry or fail over only what provably was not accepted; if the whole
   message may have reached the backend and no verdict came back, the
   outcome is ``UNKNOWN``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

# Causes end up in logs and (via the API) in response messages; a provider
# that echoes a whole document back must not flood either.
CAUSE_LIMIT = 512


class Kind(enum.Enum):
    """What happened to one attempt. ``value`` is the metrics label."""

    ACCEPTED = "accepted"
    #: Permanent and about this message; another backend would say the same.
    REJECTED_MESSAGE = "rejected_message"
    #: Permanent for this backend only (credentials, unverified sender,
    #: relay denied, binary missing...). The message was not judged.
    REJECTED_BACKEND = "rejected_backend"
    #: A permanent refusal whose scope cannot be told (SMTP 5xx without an
    #: enhanced code, generic HTTP 400).
    REJECTED_UNSCOPED = "rejected_unscoped"
    #: Provably not accepted; the same backend may accept later.
    TRANSIENT = "transient"
    #: The backend may have accepted the message; never resend automatically.
    UNKNOWN = "unknown"


_SCOPES = {
    Kind.REJECTED_MESSAGE: "message",
    Kind.REJECTED_BACKEND: "backend",
    Kind.REJECTED_UNSCOPED: "unscoped",
}


@dataclass(frozen=True)
class Outcome:
    """One classified attempt.

    * ``cause`` -- short human text for logs and the error message, e.g.
      ``"smtp: RCPT 550 5.1.1 no such user"``. It MUST NOT contain
      credentials or the message body; it is capped at ``CAUSE_LIMIT``
      characters. Empty for acceptances.
    * ``message_id`` -- the provider's own id on acceptance, ``""`` when it
      reports none (SMTP, sendmail). Only meaningful for ``ACCEPTED``.
    * ``retry_after`` -- for ``TRANSIENT`` only: the number of seconds the
      provider asked us to wait (HTTP ``Retry-After`` on 429/503), already
      resolved against the injected clock (see :func:`parse_retry_after`);
      ``None`` when absent or unparseable. The dispatcher waits
      ``max(retry_wait, retry_after)`` and fails over instead when that
      would overrun the dispatch deadline.

    Build instances through the class methods; they read like the
    classification tables in docs/mailer.md.
    """

    kind: Kind
    cause: str = ""
    message_id: str = ""
    retry_after: float | None = None

    def __post_init__(self) -> None:
        if len(self.cause) > CAUSE_LIMIT:
            object.__setattr__(self, "cause", self.cause[: CAUSE_LIMIT - 3] + "...")

    @classmethod
    def accepted(cls, message_id: str = "") -> Outcome:
        return cls(Kind.ACCEPTED, message_id=message_id or "")

    @classmethod
    def rejected_message(cls, cause: str) -> Outcome:
        return cls(Kind.REJECTED_MESSAGE, cause)

    @classmethod
    def rejected_backend(cls, cause: str) -> Outcome:
        return cls(Kind.REJECTED_BACKEND, cause)

    @classmethod
    def rejected_unscoped(cls, cause: str) -> Outcome:
        return cls(Kind.REJECTED_UNSCOPED, cause)

    @classmethod
    def transient(cls, cause: str, retry_after: float | None = None) -> Outcome:
        return cls(Kind.TRANSIENT, cause, retry_after=retry_after)

    @classmethod
    def unknown(cls, cause: str) -> Outcome:
        return cls(Kind.UNKNOWN, cause)

    @property
    def is_accepted(self) -> bool:
        return self.kind is Kind.ACCEPTED

    @property
    def retryable(self) -> bool:
        """True only for ``TRANSIENT``: the same backend may be tried again."""
        return self.kind is Kind.TRANSIENT

    @property
    def scope(self) -> str | None:
        """``"message"``, ``"backend"`` or ``"unscoped"`` for the three
        rejections, ``None`` otherwise."""
        return _SCOPES.get(self.kind)

    @property
    def label(self) -> str:
        """The ``outcome`` metrics label."""
        return self.kind.value


def parse_retry_after(value: str | bytes | None, now: float) -> float | None:
    """Seconds to wait from an HTTP ``Retry-After`` header value.

    Delta-seconds (``"120"``) or an HTTP-date, which counts from ``now``
    (the injected clock's ``seconds()``). Returns ``None`` for an absent or
    unparseable value; a date in the past gives ``0.0``.
    """
    if value is None:
        return None
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    value = value.strip()
    if not value:
        return None
    if value.isdigit():
        return float(int(value))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now)
