"""SendGrid v3 Mail Send."""

from __future__ import annotations

from typing import Any

from gorge.mailer.backends.base import BackendEntry
from gorge.mailer.backends.http import (
    HttpBackend,
    HttpReply,
    ProviderRequest,
    classify_status,
    endpoint_url,
    json_body,
)
from gorge.mailer.message import Address, Message
from gorge.mailer.outcome import Outcome

DEFAULT_ORIGIN = "https://api.sendgrid.com"
PATH = "/v3/mail/send"

# SendGrid answers 400 for a personalization that sets any of these; dropping
# them keeps a Phorge header from turning into a failed send.
RESERVED_HEADERS = frozenset(
    {
        "to",
        "from",
        "subject",
        "reply-to",
        "cc",
        "bcc",
        "content-type",
        "content-transfer-encoding",
        "x-sg-id",
        "x-sg-eid",
        "received",
        "dkim-signature",
    }
)


def _address(addr: Address) -> dict[str, str]:
    out = {"email": addr.address}
    if addr.name:
        out["name"] = addr.name
    return out


def _headers(message: Message) -> dict[str, str]:
    # Same-name headers collapse, last value wins (a JSON object has one
    # value per name); SendGrid compares names case-insensitively.
    collapsed: dict[str, tuple[str, str]] = {}
    for header in message.headers:
        lowered = header.name.lower()
        if lowered in RESERVED_HEADERS:
            continue
        collapsed[lowered] = (header.name, header.value)
    return dict(collapsed.values())


def request_body(message: Message) -> dict[str, Any]:
    """The v3 document for ``message`` (pure)."""
    personalization: dict[str, Any] = {"to": [_address(a) for a in message.to]}
    if message.cc:
        personalization["cc"] = [_address(a) for a in message.cc]
    if message.bcc:
        personalization["bcc"] = [_address(a) for a in message.bcc]
    headers = _headers(message)
    if headers:
        personalization["headers"] = headers
    doc: dict[str, Any] = {
        "personalizations": [personalization],
        "from": _address(message.from_),
    }
    if message.reply_to is not None:
        doc["reply_to"] = _address(message.reply_to)
    doc["subject"] = message.subject
    content = []
    if message.text_body:
        content.append({"type": "text/plain", "value": message.text_body})
    if message.html_body:
        content.append({"type": "text/html", "value": message.html_body})
    if content:
        doc["content"] = content
    if message.attachments:
        doc["attachments"] = [
            {"content": a.data, "filename": a.filename, "type": a.mime_type}
            for a in message.attachments
        ]
    return doc


class SendGridBackend(HttpBackend):
    type = "sendgrid"

    def __init__(self, entry: BackendEntry, *, clock: Any, client: Any) -> None:
        super().__init__(entry, clock=clock, client=client)
        self._api_key = entry.required("api-key")
        self.url = endpoint_url(entry, DEFAULT_ORIGIN) + PATH

    def secrets(self) -> tuple[str, ...]:
        return (self._api_key,)

    def build_request(self, message: Message) -> ProviderRequest:
        return ProviderRequest(
            url=self.url,
            body=json_body(request_body(message)),
            headers={
                "Authorization": f"Bearer {self._api_key}",
                "Content-Type": "application/json",
            },
        )

    def classify(self, reply: HttpReply, now: float) -> Outcome:
        verdict = classify_status(self.type, reply, now, self.secrets())
        if verdict is not None:
            return verdict
        # Any 2xx (normally 202 with an empty body) is the acceptance; the
        # id travels in a header, so an unreadable body changes nothing.
        return Outcome.accepted((reply.header("x-message-id") or "").strip())


def build(entry: BackendEntry, *, reactor: Any, http_client: Any) -> SendGridBackend:
    return SendGridBackend(entry, clock=reactor, client=http_client)
