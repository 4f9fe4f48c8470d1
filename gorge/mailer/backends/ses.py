"""Amazon SES v1 Query API, ``SendRawEmail``."""

from __future__ import annotations

import base64
import re
import secrets
from collections.abc import Callable
from typing import Any
from urllib.parse import quote_plus, urlsplit
from xml.etree import ElementTree

from gorge.mailer import sigv4
from gorge.mailer.backends.base import BackendEntry
from gorge.mailer.backends.http import (
    HttpBackend,
    HttpReply,
    ProviderRequest,
    classify_status,
    endpoint_url,
    excerpt,
)
from gorge.mailer.message import Message, format_address
from gorge.mailer.mime import build_mime
from gorge.mailer.outcome import Outcome, parse_retry_after

SERVICE = "ses"
DEFAULT_REGION = "us-east-1"
CONTENT_TYPE = "application/x-www-form-urlencoded"
_REGION_RE = re.compile(r"^[a-z0-9-]+$")
_PATH_RE = re.compile(r"^[A-Za-z0-9/._~-]+$")
_DEFAULT_PORTS = {"http": 80, "https": 443}

# SES error codes (Query API <Error><Code>) whose scope we know.
TRANSIENT_CODES = frozenset({"Throttling", "ServiceUnavailable"})
BACKEND_CODES = frozenset(
    {
        "MailFromDomainNotVerified",
        "MailFromDomainNotVerifiedException",
        "ConfigurationSetDoesNotExist",
        "ConfigurationSetDoesNotExistException",
        "ConfigurationSetSendingPaused",
        "ConfigurationSetSendingPausedException",
        "AccountSendingPaused",
        "AccountSendingPausedException",
        "SignatureDoesNotMatch",
        "IncompleteSignature",
        "InvalidClientTokenId",
        "MissingAuthenticationToken",
        "AccessDenied",
        "AccessDeniedException",
        "OptInRequired",
        "RequestExpired",
        "InvalidAction",
        "MissingAction",
    }
)
UNSCOPED_CODES = frozenset(
    {"MessageRejected", "InvalidParameterValue", "InvalidParameterCombination"}
)


def form_body(message: Message, raw_message: bytes) -> bytes:
    """The urlencoded ``SendRawEmail`` form, keys sorted like the reference."""
    params = {"Action": "SendRawEmail", "Source": format_address(message.from_)}
    for n, address in enumerate(message.recipients(), start=1):
        params[f"Destinations.member.{n}"] = address
    params["RawMessage.Data"] = base64.b64encode(raw_message).decode("ascii")
    pairs = (
        f"{quote_plus(k, safe='')}={quote_plus(v, safe='')}" for k, v in sorted(params.items())
    )
    return "&".join(pairs).encode("ascii")


def signed_headers(
    credentials: sigv4.Credentials,
    *,
    region: str,
    host: str,
    path: str,
    body: bytes,
    stamp: str,
    service: str = SERVICE,
) -> dict[str, str]:
    """The request headers, ``Authorization`` included: SigV4 over exactly
    ``content-type;host;x-amz-date`` and the body bytes."""
    headers = {"Content-Type": CONTENT_TYPE, "Host": host, "X-Amz-Date": stamp}
    headers["Authorization"] = sigv4.authorization(
        credentials,
        method="POST",
        path=path or "/",
        headers=headers,
        body=body,
        region=region,
        service=service,
        stamp=stamp,
    )
    return headers


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _parse_xml(body: bytes | None) -> ElementTree.Element | None:
    if not body:
        return None
    # No document type declarations: entity expansion is the classic way a
    # small answer grows into a large one.
    if b"<!DOCTYPE" in body or b"<!ENTITY" in body:
        return None
    try:
        return ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return None


def _child(elem: ElementTree.Element | None, name: str) -> ElementTree.Element | None:
    if elem is None:
        return None
    for child in elem:
        if _local(child.tag) == name:
            return child
    return None


def receipt_message_id(body: bytes | None) -> str:
    """``SendRawEmailResponse/SendRawEmailResult/MessageId``, or ``""``."""
    root = _parse_xml(body)
    if root is None or _local(root.tag) != "SendRawEmailResponse":
        return ""
    node = _child(_child(root, "SendRawEmailResult"), "MessageId")
    return (node.text or "").strip() if node is not None else ""


def error_code(body: bytes | None) -> tuple[str, str] | None:
    """(Code, Message) of the first ``<Error>`` in an error document."""
    root = _parse_xml(body)
    if root is None:
        return None
    errors = (
        [root]
        if _local(root.tag) == "Error"
        else [e for e in root.iter() if _local(e.tag) == "Error"]
    )
    for err in errors:
        code = _child(err, "Code")
        if code is not None and (code.text or "").strip():
            text = _child(err, "Message")
            return (code.text or "").strip(), (text.text or "").strip() if text is not None else ""
    return None


class SesBackend(HttpBackend):
    type = "ses"

    def __init__(
        self,
        entry: BackendEntry,
        *,
        clock: Any,
        client: Any,
        token_hex: Callable[[int], str] = secrets.token_hex,
    ) -> None:
        super().__init__(entry, clock=clock, client=client)
        # Not validated: SES may sit behind an endpoint that authenticates
        # otherwise.
        self._credentials = sigv4.Credentials(entry.str("access-key"), entry.str("secret-key"))
        self.region = entry.str("region", DEFAULT_REGION).strip()
        if not _REGION_RE.match(self.region):
            raise entry.error("region", "must look like us-east-1")
        self.url = endpoint_url(entry, f"https://email.{self.region}.amazonaws.com", bare_host=True)
        parts = urlsplit(self.url)
        netloc = parts.netloc
        if parts.port is not None and parts.port == _DEFAULT_PORTS[parts.scheme.lower()]:
            netloc = netloc.rpartition(":")[0]
        # Signed exactly as sent: the Host header is passed explicitly.
        self.host = netloc
        self.path = parts.path or "/"
        # Signed as sent; characters that SigV4 would re-encode are refused
        # here rather than producing SignatureDoesNotMatch at send time.
        if not _PATH_RE.match(self.path):
            raise entry.error("endpoint", "path may only contain letters, digits and / . _ ~ -")
        self._token_hex = token_hex

    def secrets(self) -> tuple[str, ...]:
        return (self._credentials.secret_key,)

    def build_request(self, message: Message) -> ProviderRequest:
        now = self._clock.seconds()
        raw = build_mime(message, now=now, token_hex=self._token_hex)
        body = form_body(message, raw)
        stamp, _ = sigv4.amz_date_from_posix(now)
        headers = signed_headers(
            self._credentials,
            region=self.region,
            host=self.host,
            path=self.path,
            body=body,
            stamp=stamp,
        )
        return ProviderRequest(url=self.url, body=body, headers=headers)

    def classify(self, reply: HttpReply, now: float) -> Outcome:
        if 200 <= reply.status < 300:
            # Any 2xx is the acceptance, readable receipt or not.
            return Outcome.accepted(receipt_message_id(reply.body))
        parsed = error_code(reply.body)
        if parsed is not None:
            code, text = parsed
            cause = f"{self.type}: HTTP {reply.status}: {code}"
            detail = excerpt(text.encode("utf-8"), self.secrets())
            if detail:
                cause += f": {detail}"
            if code in TRANSIENT_CODES:
                return Outcome.transient(
                    cause, retry_after=parse_retry_after(reply.header("retry-after"), now)
                )
            if code in BACKEND_CODES:
                return Outcome.rejected_backend(cause)
            if code in UNSCOPED_CODES and 400 <= reply.status < 500:
                return Outcome.rejected_unscoped(cause)
            verdict = classify_status(self.type, reply, now, self.secrets())
            assert verdict is not None
            return type(verdict)(verdict.kind, cause, retry_after=verdict.retry_after)
        verdict = classify_status(self.type, reply, now, self.secrets())
        assert verdict is not None
        return verdict


def build(entry: BackendEntry, *, reactor: Any, http_client: Any) -> SesBackend:
    return SesBackend(entry, clock=reactor, client=http_client)
