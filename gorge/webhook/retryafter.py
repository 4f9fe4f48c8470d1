"""What a receiver's ``Retry-After`` asks for (docs/webhook.md, "Retry-After and 410 Gone")."""

from __future__ import annotations

import re

from twisted.web.http import stringToDatetime

# Only these answers say "come back later" with Retry-After; on another
# status the header is not about this request's next attempt.
STATUSES = frozenset({429, 503})
GONE = 410

_DELAY_SECONDS = re.compile(r"[0-9]+", re.ASCII)


def retry_after_seconds(value: bytes | str | None, now: float) -> float | None:
    """Seconds from ``now`` that the header value asks for; None when absent or unreadable.

    RFC 9110: either a number of seconds or an HTTP date (the three date
    formats HTTP allows); a date in the past means "now" (0).
    """
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    if _DELAY_SECONDS.fullmatch(text):
        return float(int(text))
    try:
        moment = stringToDatetime(text.encode("latin-1"))
    except (ValueError, IndexError, OverflowError, UnicodeEncodeError, KeyError):
        return None
    return max(float(moment) - now, 0.0)
