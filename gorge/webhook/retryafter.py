"""What a receiver's ``Retry-After`` asks for (docs/webhook.md, "Retry-After and 410 Gone")."""

from __future__ import annotations

import math
import re
from decimal import Decimal

from twisted.web.http import stringToDatetime

# Only these answers say "come back later" with Retry-After; on another
# status the header is not about this request's next attempt.
STATUSES = frozenset({429, 503})
GONE = 410

_DELAY_SECONDS = re.compile(r"[0-9]+", re.ASCII)
MICROSECOND = Decimal("0.000001")  # the precision of the database's clock (NOW(6))


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


def wait_seconds(value: bytes | str | None, arrived: float, cap: float) -> float | None:
    """How long after the answer's arrival (``arrived``, this host's clock) the next
    attempt waits: what the header asks for, at most ``cap``; None when unreadable."""
    asked = retry_after_seconds(value, arrived)
    return None if asked is None else min(asked, float(cap))


def held_second(arrival: Decimal, wait: float) -> int:
    """The first whole database second at or after ``arrival`` (the database's
    clock, to the microsecond) plus ``wait``.

    Rows are offered, and other replicas' leases judged, in the database's whole
    seconds (``UNIX_TIMESTAMP()``): a row held until this second is attempted
    no earlier than the moment asked for, and at most a second later. Rounded
    to the microsecond first, so that a date read as ``date - arrival`` in
    floating point lands on the date's own second.
    """
    moment = (arrival + Decimal(repr(wait))).quantize(MICROSECOND)
    return math.ceil(moment)
