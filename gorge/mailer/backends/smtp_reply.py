"""What an SMTP server's reply means for a send: the enhanced status code
(RFC 3463) and the stage it answers decide the outcome."""

from __future__ import annotations

import re

from gorge.mailer.outcome import Outcome

_ENHANCED = re.compile(r"^([245])\.(\d{1,3})\.(\d{1,3})(?:\s|$)")
_BACKEND_ENHANCED = {(1, 7), (1, 8), (7, 4), (7, 8), (7, 9), (7, 10), (7, 11)}
_STAGE_NAMES = {
    "greeting": "greeting",
    "ehlo": "EHLO",
    "helo": "HELO",
    "starttls": "STARTTLS",
    "tls-ehlo": "EHLO after STARTTLS",
    "auth": "AUTH",
    "mail": "MAIL FROM",
    "rcpt": "RCPT TO",
    "data": "DATA",
    "content": "message content",
    "dot": "end of DATA",
}


def enhanced_code(text: str) -> tuple[int, int, int] | None:
    """The RFC 3463 code at the start of a reply text, if any."""
    m = _ENHANCED.match(text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def classify_reply(stage: str, code: int, text: str) -> Outcome:
    """Outcome of a non-2xx reply at ``stage`` (docs/mailer.md, first match wins).

    ``stage`` is one of greeting, ehlo, helo, starttls, tls-ehlo, auth,
    mail, rcpt, data, dot."""
    where = _STAGE_NAMES.get(stage, stage)
    cause = f"smtp: {where}: {code} {text}".rstrip()
    after_dot = stage == "dot"
    if not 400 <= code < 600:
        return (Outcome.unknown if after_dot else Outcome.transient)(
            f"smtp: {where}: unexpected reply {code}"
        )
    if code < 500:
        return Outcome.transient(cause)
    if code == 530:
        return Outcome.rejected_backend(cause)
    if stage in ("greeting", "ehlo", "helo", "starttls", "tls-ehlo", "auth"):
        return Outcome.rejected_backend(cause)
    enhanced = enhanced_code(text)
    if enhanced is not None and enhanced[0] != 5:
        enhanced = None
    sub = enhanced[1:] if enhanced is not None else None
    if stage == "mail":
        if sub == (3, 4):
            return Outcome.rejected_message(cause)
        return Outcome.rejected_backend(cause)
    if (code == 552 and sub is None and stage == "rcpt") or sub == (5, 3):
        return Outcome.transient(cause)
    if sub == (2, 2):
        return Outcome.transient(cause)
    if sub is not None:
        subject, detail = sub
        if subject == 1 and detail not in (7, 8):
            return Outcome.rejected_message(cause)
        if subject == 2 or sub == (3, 4) or subject == 6:
            return Outcome.rejected_message(cause)
        if sub in _BACKEND_ENHANCED:
            return Outcome.rejected_backend(cause)
    return Outcome.rejected_unscoped(cause)
