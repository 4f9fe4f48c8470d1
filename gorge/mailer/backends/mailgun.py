"""Mailgun ``messages`` API."""

from __future__ import annotations

import base64
import re
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from gorge.mailer.backends.base import BackendEntry
from gorge.mailer.backends.http import (
    HttpBackend,
    HttpReply,
    ProviderRequest,
    classify_status,
    endpoint_url,
    json_object,
)
from gorge.mailer.message import Message, format_address
from gorge.mailer.outcome import Outcome

DEFAULT_API_HOSTNAME = "api.mailgun.net"
_HOSTNAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]{1,5})?$")

#: (field name, value, filename or None, content type or None)
Field = tuple[str, bytes, "str | None", "str | None"]


def form_fields(message: Message) -> list[Field]:
    """The form fields in the order Mailgun documents them (pure)."""
    fields: list[Field] = []

    def text(name: str, value: str) -> None:
        fields.append((name, value.encode("utf-8"), None, None))

    text("from", format_address(message.from_))
    for addr in message.to:
        text("to", format_address(addr))
    for addr in message.cc:
        text("cc", format_address(addr))
    for addr in message.bcc:
        text("bcc", format_address(addr))
    if message.reply_to is not None:
        text("h:Reply-To", format_address(message.reply_to))
    text("subject", message.subject)
    if message.text_body:
        text("text", message.text_body)
    if message.html_body:
        text("html", message.html_body)
    for header in message.headers:
        text(f"h:{header.name}", header.value)
    for attachment in message.attachments:
        # The one provider that wants the decoded bytes, not base64.
        fields.append(("attachment", attachment.content, attachment.filename, attachment.mime_type))
    return fields


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _part(
    boundary: bytes, name: str, value: bytes, filename: str | None, ctype: str | None
) -> bytes:
    disposition = f'Content-Disposition: form-data; name="{_quoted(name)}"'
    if filename is not None:
        disposition += f'; filename="{_quoted(filename)}"'
    lines = [disposition]
    if ctype is not None:
        lines.append(f"Content-Type: {ctype}")
    head = "\r\n".join(lines).encode("utf-8")
    return b"--" + boundary + b"\r\n" + head + b"\r\n\r\n" + value + b"\r\n"


def multipart_body(
    fields: list[Field], token_hex: Callable[[int], str] = secrets.token_hex
) -> tuple[bytes, str]:
    """``multipart/form-data`` bytes and the boundary used (pure but for the
    random boundary; pass ``token_hex`` for determinism)."""
    while True:
        boundary = token_hex(16).encode("ascii")
        if not any(boundary in value for _, value, _, _ in fields):
            break
    parts = [_part(boundary, *f) for f in fields]
    return b"".join(parts) + b"--" + boundary + b"--\r\n", boundary.decode("ascii")


def _receipt_id(body: bytes | None) -> str | None:
    doc = json_object(body)
    if doc is None:
        return None
    ident = doc.get("id")
    return ident if isinstance(ident, str) and ident else None


class MailgunBackend(HttpBackend):
    type = "mailgun"

    def __init__(
        self,
        entry: BackendEntry,
        *,
        clock: Any,
        client: Any,
        token_hex: Callable[[int], str] = secrets.token_hex,
    ) -> None:
        super().__init__(entry, clock=clock, client=client)
        self._api_key = entry.required("api-key")
        domain = entry.required("domain").strip()
        hostname = entry.str("api-hostname", DEFAULT_API_HOSTNAME).strip()
        if not _HOSTNAME_RE.match(hostname):
            raise entry.error("api-hostname", "must be a host name such as api.eu.mailgun.net")
        origin = endpoint_url(entry, f"https://{hostname}")
        self.url = f"{origin}/v2/{quote(domain, safe='')}/messages"
        self._token_hex = token_hex

    def secrets(self) -> tuple[str, ...]:
        return (self._api_key,)

    def build_request(self, message: Message) -> ProviderRequest:
        body, boundary = multipart_body(form_fields(message), self._token_hex)
        basic = base64.b64encode(f"api:{self._api_key}".encode()).decode("ascii")
        return ProviderRequest(
            url=self.url,
            body=body,
            headers={
                "Authorization": f"Basic {basic}",
                "Content-Type": f"multipart/form-data; boundary={boundary}",
            },
        )

    def classify(self, reply: HttpReply, now: float) -> Outcome:
        verdict = classify_status(self.type, reply, now, self.secrets())
        if verdict is not None:
            return verdict
        ident = _receipt_id(reply.body)
        if ident is None:
            # Queued or not: a 2xx without its receipt cannot be told apart.
            return Outcome.unknown(
                f"{self.type}: HTTP {reply.status} without a readable receipt id"
            )
        return Outcome.accepted(ident)


def build(entry: BackendEntry, *, reactor: Any, http_client: Any) -> MailgunBackend:
    return MailgunBackend(entry, clock=reactor, client=http_client)
