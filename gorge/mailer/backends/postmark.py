"""Postmark ``/email``."""

from __future__ import annotations

from typing import Any

from gorge.mailer.backends.base import BackendEntry
from gorge.mailer.backends.http import (
    HttpBackend,
    HttpReply,
    ProviderRequest,
    classify_status,
    endpoint_url,
    error_text,
    json_body,
    json_object,
)
from gorge.mailer.message import Message, format_address
from gorge.mailer.outcome import Outcome, parse_retry_after

DEFAULT_ORIGIN = "https://api.postmarkapp.com"
PATH = "/email"

# Postmark API ErrorCodes (developer docs, "API error codes").
_MESSAGE_CODES = frozenset({406, 411})
_UNSCOPED_CODES = frozenset({300})
_BACKEND_CODES = frozenset({10, 400, 401, 405, 412, 413, 402, 403, 409})
_TRANSIENT_CODES = frozenset({100, 429})


def request_body(message: Message) -> dict[str, Any]:
    """The PascalCase document for ``message`` (pure)."""
    doc: dict[str, Any] = {
        "From": format_address(message.from_),
        "To": ", ".join(format_address(a) for a in message.to),
    }
    if message.cc:
        doc["Cc"] = ", ".join(format_address(a) for a in message.cc)
    if message.bcc:
        doc["Bcc"] = ", ".join(format_address(a) for a in message.bcc)
    if message.reply_to is not None:
        doc["ReplyTo"] = format_address(message.reply_to)
    doc["Subject"] = message.subject
    if message.text_body:
        doc["TextBody"] = message.text_body
    if message.html_body:
        doc["HtmlBody"] = message.html_body
    if message.headers:
        doc["Headers"] = [{"Name": h.name, "Value": h.value} for h in message.headers]
    if message.attachments:
        doc["Attachments"] = [
            {"Name": a.filename, "Content": a.data, "ContentType": a.mime_type}
            for a in message.attachments
        ]
    return doc


def _error_code(doc: dict[str, Any] | None) -> int | None:
    if doc is None:
        return None
    code = doc.get("ErrorCode")
    # bool is an int in Python; ``true`` is not an error code.
    if isinstance(code, bool) or not isinstance(code, int):
        return None
    return code


def classify_error_code(
    code: int, cause: str, *, on_2xx: bool, retry_after: float | None
) -> Outcome:
    """The ErrorCode table (for a 2xx with a non-zero code, or a 422)."""
    if code in _MESSAGE_CODES:
        return Outcome.rejected_message(cause)
    if code in _UNSCOPED_CODES:
        return Outcome.rejected_unscoped(cause)
    if code in _BACKEND_CODES:
        return Outcome.rejected_backend(cause)
    if code in _TRANSIENT_CODES:
        return Outcome.transient(cause, retry_after=retry_after)
    return Outcome.unknown(cause) if on_2xx else Outcome.rejected_unscoped(cause)


class PostmarkBackend(HttpBackend):
    type = "postmark"

    def __init__(self, entry: BackendEntry, *, clock: Any, client: Any) -> None:
        super().__init__(entry, clock=clock, client=client)
        self._token = entry.required("access-token")
        self.url = endpoint_url(entry, DEFAULT_ORIGIN) + PATH

    def secrets(self) -> tuple[str, ...]:
        return (self._token,)

    def build_request(self, message: Message) -> ProviderRequest:
        return ProviderRequest(
            url=self.url,
            body=json_body(request_body(message)),
            headers={
                "X-Postmark-Server-Token": self._token,
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )

    def classify(self, reply: HttpReply, now: float) -> Outcome:
        success = 200 <= reply.status < 300
        if not success and reply.status != 422:
            verdict = classify_status(self.type, reply, now, self.secrets())
            assert verdict is not None
            return verdict
        doc = json_object(reply.body)
        code = _error_code(doc)
        cause = error_text(self.type, reply, self.secrets())
        retry_after = parse_retry_after(reply.header("retry-after"), now)
        if not success:
            if code is None:
                return Outcome.rejected_unscoped(cause)
            return classify_error_code(code, cause, on_2xx=False, retry_after=retry_after)
        if code is None:
            return Outcome.unknown(f"{self.type}: HTTP {reply.status} without a readable receipt")
        if code != 0:
            return classify_error_code(code, cause, on_2xx=True, retry_after=retry_after)
        message_id = doc.get("MessageID") if doc is not None else None
        if not isinstance(message_id, str) or not message_id:
            return Outcome.unknown(f"{self.type}: HTTP {reply.status} receipt without a MessageID")
        return Outcome.accepted(message_id)


def build(entry: BackendEntry, *, reactor: Any, http_client: Any) -> PostmarkBackend:
    return PostmarkBackend(entry, clock=reactor, client=http_client)
