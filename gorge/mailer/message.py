"""The validated outbound message.

``parse_send_body(raw)`` turns the request body of ``POST /api/mailer/send``
into a :class:`SendRequest` or raises :class:`MessageError` (answered as 400
``ERR_BAD_REQUEST``; no backend is touched). Everything a backend receives
has passed these rules, so backends may rely on them:

* ``from_.address`` and every ``to``/``cc``/``bcc``/``reply_to`` address is
  non-empty, has one ``@`` split into a non-empty local part and domain (the
  last ``@`` separates them), and holds no control character, no whitespace
  and no ``<``/``>``. Addresses may contain non-ASCII characters.
* Display names have CR, LF and NUL removed (they may be ``""``).
* ``to`` is non-empty; ``subject`` is a non-empty string (whitespace-only
  allowed). The subject may still contain control characters: the MIME
  builder encodes it, JSON providers escape it.
* Header names are 1+ printable ASCII characters without ``:`` or space
  once CR and LF are removed; header values have CR, LF and NUL removed.
  Order is the caller's.
* Attachments have a non-empty filename (CR/LF/NUL removed), ``content``
  the decoded bytes, ``data`` the caller's base64 with ASCII whitespace
  removed (what SendGrid/Postmark pass on), and ``mime_type`` a valid
  ``type/subtype`` token pair, else ``application/octet-stream``.
* ``text_body``/``html_body`` are ``""`` when absent, already truncated to
  the configured body limit by the API before dispatch.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

DEFAULT_MIME_TYPE = "application/octet-stream"

# RFC 2045 token: any ASCII printable except SPACE and tspecials.
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_MIME_TYPE_RE = re.compile(rf"^{_TOKEN}/{_TOKEN}$")
_HEADER_NAME_RE = re.compile(r"^[!-9;-~]+$")  # printable ASCII minus ':' and space
_B64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_ASCII_WS_CHARS = " \t\n\r\f\v"
_ASCII_WS = str.maketrans("", "", _ASCII_WS_CHARS)
_CRLFNUL = str.maketrans("", "", "\r\n\x00")
_CRLF = str.maketrans("", "", "\r\n")
# RFC 5322 specials (plus the quote itself) force a quoted-string display name.
_SPECIALS = set('()<>[]:;@\\,."')
# An unbroken run in a display name longer than this is RFC 2047 encoded.
_LONGEST_WORD = 200


class MessageError(ValueError):
    """The request cannot be sent as given. ``str(e)`` says what to fix and
    never repeats caller data (it may name a field path)."""


@dataclass(frozen=True)
class Address:
    address: str
    name: str = ""


@dataclass(frozen=True)
class Header:
    name: str
    value: str


@dataclass(frozen=True)
class Attachment:
    filename: str
    mime_type: str
    data: str  # validated base64, ASCII whitespace removed

    @property
    def content(self) -> bytes:
        """The decoded bytes (computed on each access: the MIME builder
        re-wraps ``data`` and never needs them)."""
        return base64.b64decode(self.data)


@dataclass(frozen=True)
class Message:
    from_: Address
    to: tuple[Address, ...]
    subject: str
    cc: tuple[Address, ...] = ()
    bcc: tuple[Address, ...] = ()
    reply_to: Address | None = None
    text_body: str = ""
    html_body: str = ""
    headers: tuple[Header, ...] = ()
    attachments: tuple[Attachment, ...] = ()

    def recipients(self) -> list[str]:
        """Envelope recipients in order: every ``to``, then ``cc``, then ``bcc``."""
        return [a.address for a in (*self.to, *self.cc, *self.bcc)]

    def truncated(self, limit: int) -> tuple[Message, int]:
        """Bodies cut to ``limit`` UTF-8 bytes; returns the message and
        how many bodies were shortened. ``limit <= 0`` disables truncation."""
        text = truncate_utf8(self.text_body, limit)
        html = truncate_utf8(self.html_body, limit)
        count = (text != self.text_body) + (html != self.html_body)
        if not count:
            return self, 0
        return replace(self, text_body=text, html_body=html), count


@dataclass(frozen=True)
class SendRequest:
    message: Message
    #: ``None`` = any backend; otherwise the keys to narrow to (never empty).
    mailer_keys: tuple[str, ...] | None = None


def truncate_utf8(text: str, limit: int) -> str:
    """At most ``limit`` bytes of UTF-8, never splitting a code point."""
    if limit <= 0:
        return text
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", errors="ignore")


def format_address(addr: Address) -> str:
    """``addr`` bare, or ``name <addr>``: a non-ASCII name is RFC 2047
    encoded (UTF-8), a name with specials becomes an RFC 5322 quoted-string.
    Used by the MIME builder and by providers that want a "formatted" address."""
    name = addr.name
    if not name:
        return addr.address
    if (
        not name.isascii()
        or any(ord(c) < 32 or ord(c) == 127 for c in name)
        or max(len(word) for word in name.split(" ")) > _LONGEST_WORD
    ):
        # Encoded words can be folded between; a long unbroken ASCII run
        # could not, and would break the 998-octet header line limit.
        return f"{' '.join(encode_words(name))} <{addr.address}>"
    if any(c in _SPECIALS for c in name):
        quoted = name.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{quoted}" <{addr.address}>'
    return f"{name} <{addr.address}>"


def encode_words(text: str) -> list[str]:
    """RFC 2047 ``=?utf-8?b?...?=`` words, each at most 75 characters and
    never splitting a code point. Join them with a space (or a fold): a
    reader concatenates adjacent encoded words without the whitespace."""
    raw = text.encode("utf-8", "surrogatepass")
    words: list[bytes] = []
    start = 0
    while start < len(raw) or not words:
        end = min(start + 45, len(raw))  # 45 bytes -> 60 base64 characters
        while end < len(raw) and raw[end] & 0xC0 == 0x80:
            end -= 1  # never cut inside a UTF-8 sequence
        words.append(raw[start:end])
        start = end
    return ["=?utf-8?b?" + base64.b64encode(w).decode("ascii") + "?=" for w in words]


def parse_send_body(raw: bytes) -> SendRequest:
    """Decode and validate a ``POST /api/mailer/send`` body (in order)."""
    if not raw:
        raise MessageError("request body is empty; expected a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MessageError("request body is not valid UTF-8") from None
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        raise MessageError("request body is not valid JSON") from None
    if not isinstance(doc, dict):
        raise MessageError("request body must be a JSON object")
    return parse_send_request(doc)


def parse_send_request(doc: dict[str, Any]) -> SendRequest:
    """Validate an already decoded request object."""
    raw = _opt(doc, "message", dict, "message") or {}
    keys = _opt(doc, "mailerKeys", list, "mailerKeys")
    mailer_keys = None
    if keys:
        for i, k in enumerate(keys):
            _opt({"k": k}, "k", str, f"mailerKeys[{i}]")
            if k is None:
                raise MessageError(f"mailerKeys[{i}] must be a string")
        mailer_keys = tuple(keys)

    # Rule 2 first: every type mismatch anywhere is reported before the
    # semantic checks, so a client fixing types is not sent round twice.
    from_ = _address(raw, "from")
    reply_to = _address(raw, "replyTo")
    to = _addresses(raw, "to")
    cc = _addresses(raw, "cc")
    bcc = _addresses(raw, "bcc")
    subject = _opt(raw, "subject", str, "message.subject")
    text_body = _opt(raw, "textBody", str, "message.textBody") or ""
    html_body = _opt(raw, "htmlBody", str, "message.htmlBody") or ""
    headers = _headers(raw)
    attachments = _attachments(raw)

    if from_ is None or not from_[0]:
        raise MessageError("from address is required (message.from.address)")
    if not to:
        raise MessageError("at least one recipient is required (message.to)")
    if not subject:
        raise MessageError("subject is required (message.subject)")

    _check_address(from_[0], "message.from.address")
    for field, group in (("to", to), ("cc", cc), ("bcc", bcc)):
        for i, (address, _) in enumerate(group):
            _check_address(address, f"message.{field}[{i}].address")
    if reply_to is not None and reply_to[0]:
        _check_address(reply_to[0], "message.replyTo.address")

    parsed_attachments = tuple(_check_attachment(i, *a) for i, a in enumerate(attachments))
    parsed_headers = tuple(_check_header(i, n, v) for i, (n, v) in enumerate(headers))

    message = Message(
        from_=_mk_address(from_),
        to=tuple(_mk_address(a) for a in to),
        cc=tuple(_mk_address(a) for a in cc),
        bcc=tuple(_mk_address(a) for a in bcc),
        # An empty replyTo address means "no Reply-To".
        reply_to=_mk_address(reply_to) if reply_to is not None and reply_to[0] else None,
        subject=subject,
        text_body=text_body,
        html_body=html_body,
        headers=parsed_headers,
        attachments=parsed_attachments,
    )
    return SendRequest(message, mailer_keys)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_TYPE_NAMES: dict[type, str] = {dict: "an object", list: "an array", str: "a string"}


def _opt(obj: dict[str, Any], key: str, typ: type, path: str) -> Any:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, typ):
        raise MessageError(f"{path} must be {_TYPE_NAMES[typ]}")
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            # JSON can spell a lone surrogate ("\\ud800"); it has no UTF-8
            # form, so no backend could send it.
            raise MessageError(f"{path} contains invalid Unicode (a lone surrogate)") from None
    return value


def _address(obj: dict[str, Any], key: str, path: str | None = None) -> tuple[str, str] | None:
    path = path or f"message.{key}"
    raw = _opt(obj, key, dict, path)
    if raw is None:
        return None
    address = _opt(raw, "address", str, f"{path}.address") or ""
    name = _opt(raw, "name", str, f"{path}.name") or ""
    return address, name


def _objects(obj: dict[str, Any], key: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The elements of the optional array ``message.<key>`` with their paths.

    A generator, so that each element is checked to be an object only after
    the caller has read the one before it (the first error wins)."""
    items = _opt(obj, key, list, f"message.{key}") or []
    for i, item in enumerate(items):
        path = f"message.{key}[{i}]"
        if not isinstance(item, dict):
            raise MessageError(f"{path} must be an object")
        yield path, item


def _addresses(obj: dict[str, Any], key: str) -> list[tuple[str, str]]:
    out = []
    for path, item in _objects(obj, key):
        parsed = _address({"a": item}, "a", path)
        assert parsed is not None
        out.append(parsed)
    return out


def _headers(obj: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for path, item in _objects(obj, "headers"):
        name = _opt(item, "name", str, f"{path}.name") or ""
        value = _opt(item, "value", str, f"{path}.value") or ""
        out.append((name, value))
    return out


def _attachments(obj: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    out = []
    for path, item in _objects(obj, "attachments"):
        filename = _opt(item, "filename", str, f"{path}.filename") or ""
        mime_type = _opt(item, "mimeType", str, f"{path}.mimeType")
        data = _opt(item, "data", str, f"{path}.data")
        if data is None:
            raise MessageError(f"{path}.data is required (base64, may be empty)")
        out.append((filename, data, mime_type))
    return out


def _check_address(address: str, path: str) -> None:
    if not address:
        raise MessageError(f"{path} is empty")
    if any(ord(c) < 32 or ord(c) == 127 for c in address):
        raise MessageError(f"{path} contains a control character")
    if any(c.isspace() for c in address):
        raise MessageError(f"{path} contains whitespace")
    if "<" in address or ">" in address:
        raise MessageError(f"{path} must be a bare address without '<' or '>'")
    local, at, domain = address.rpartition("@")
    if not at or not local or not domain:
        raise MessageError(f"{path} must look like local@domain")


def _check_header(i: int, name: str, value: str) -> Header:
    # Only CR/LF are stripped from a name; any other control
    # character, NUL included, makes it invalid rather than silently renamed.
    name = name.translate(_CRLF)
    if not _HEADER_NAME_RE.match(name):
        raise MessageError(
            f"message.headers[{i}].name must be printable ASCII without ':' or spaces"
        )
    return Header(name, value.translate(_CRLFNUL))


def _check_attachment(i: int, filename: str, data: str, mime_type: str | None) -> Attachment:
    path = f"message.attachments[{i}]"
    filename = filename.translate(_CRLFNUL)
    if not filename:
        raise MessageError(f"{path}.filename is required")
    if not data.isascii():
        raise MessageError(f"{path}.data must be standard padded base64")
    compact = data
    if any(ws in data for ws in _ASCII_WS_CHARS):
        compact = data.translate(_ASCII_WS)
    if not _is_base64(compact.encode("ascii")):
        raise MessageError(f"{path}.data must be standard padded base64")
    mime = (mime_type or "").strip()
    if not _MIME_TYPE_RE.match(mime):
        mime = DEFAULT_MIME_TYPE
    return Attachment(filename=filename, mime_type=mime, data=compact)


def _is_base64(raw: bytes) -> bool:
    """RFC 4648 standard alphabet, length a multiple of 4, at most two
    ``=`` and only at the end. Checked in C (no decode) because attachments
    run to megabytes."""
    if len(raw) % 4:
        return False
    body = raw.rstrip(b"=")
    if len(raw) - len(body) > 2:
        return False
    return not body.translate(None, _B64_ALPHABET)


def _mk_address(pair: tuple[str, str]) -> Address:
    address, name = pair
    return Address(address=address, name=name.translate(_CRLFNUL))
