"""Raw RFC 5322/MIME message for the smtp, sendmail and ses backends.

``build_mime(message, now=clock.seconds())`` returns the whole message as
bytes with CRLF line endings, not dot-stuffed (the SMTP client stuffs,
sendmail runs with ``-oi``). Written by hand rather than with
``email.message`` so header order, folding and the verbatim Message-ID are
exactly what docs/mailer.md says about the raw message; only RFC 2047
encoding is borrowed from the stdlib.
"""

from __future__ import annotations

import base64
import secrets
import struct
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import format_datetime
from urllib.parse import quote

from gorge.log.logger import Logger
from gorge.mailer.message import Attachment, Message, encode_words, format_address

log = Logger()

CRLF = b"\r\n"
# Headers the builder owns; a caller's copy would duplicate or contradict it.
RESERVED_HEADERS = frozenset(
    {
        "from",
        "to",
        "cc",
        "bcc",
        "reply-to",
        "subject",
        "mime-version",
        "content-type",
        "content-transfer-encoding",
    }
)
_FOLD_AT = 78
# A filename parameter longer than this goes out as RFC 2231 continuations
# of _PARAM_CHUNK characters (each well under the 998-octet line limit).
_PARAM_LINE = 900
_PARAM_CHUNK = 64
_BLOCK = struct.Struct("76s" * 256)  # 256 base64 lines per unpack


def build_mime(
    message: Message,
    *,
    now: float,
    token_hex: Callable[[int], str] = secrets.token_hex,
) -> bytes:
    """The complete message. ``now`` is the injected clock's
    ``seconds()`` (used for ``Date`` unless the caller supplied one);
    ``token_hex`` makes boundaries and generated Message-IDs deterministic
    in tests."""
    date = None
    message_id = None
    custom: list[tuple[str, str]] = []
    for header in message.headers:
        lowered = header.name.lower()
        if lowered == "date":
            date = date if date is not None else header.value
        elif lowered == "message-id":
            message_id = message_id if message_id is not None else header.value
        elif lowered in RESERVED_HEADERS:
            log.warn("MAILER_HEADER_DROPPED header={header}", header=header.name)
        else:
            custom.append((header.name, header.value))

    lines: list[str] = [_fold("From", format_address(message.from_))]
    if message.to:
        lines.append(_fold("To", ", ".join(format_address(a) for a in message.to)))
    if message.cc:
        lines.append(_fold("Cc", ", ".join(format_address(a) for a in message.cc)))
    if message.reply_to is not None:
        lines.append(_fold("Reply-To", format_address(message.reply_to)))
    lines.append(_text_header("Subject", message.subject))
    if date is None:
        date = format_datetime(datetime.fromtimestamp(now, UTC))
    lines.append(_fold("Date", date))
    if message_id is None:
        domain = message.from_.address.rpartition("@")[2]
        message_id = f"<{token_hex(16)}@{domain}>"
    lines.append(_fold("Message-ID", message_id))
    for name, value in custom:
        lines.append(_text_header(name, value))
    lines.append("MIME-Version: 1.0")

    boundary = "----=_PhorgeMailer_" + token_hex(16)
    body_headers, body = _body(message, boundary + "_alt")
    if message.attachments:
        lines.append(f'Content-Type: multipart/mixed; boundary="{boundary}"')
        parts = [_part(body_headers, body)]
        parts.extend(_attachment(a) for a in message.attachments)
        payload = _multipart(boundary, parts)
    else:
        lines.extend(body_headers)
        payload = body
    head = "\r\n".join(lines).encode("utf-8")
    # One join at the end: a 1 MiB attachment is copied once, not per level.
    return b"".join([head, CRLF, CRLF, *payload])


def _body(message: Message, alt_boundary: str) -> tuple[list[str], list[bytes]]:
    text_headers = ["Content-Type: text/plain; charset=utf-8", "Content-Transfer-Encoding: base64"]
    text_body = _b64(message.text_body.encode("utf-8"))
    if not message.html_body:
        return text_headers, text_body
    text = _part(text_headers, text_body)
    html = _part(
        ["Content-Type: text/html; charset=utf-8", "Content-Transfer-Encoding: base64"],
        _b64(message.html_body.encode("utf-8")),
    )
    headers = [f'Content-Type: multipart/alternative; boundary="{alt_boundary}"']
    return headers, _multipart(alt_boundary, [text, html])


def _name_params(key: str, name: str) -> str:
    """The ``key`` parameter for a filename, as one or more folded lines.

    A printable ASCII name is a quoted-string. Otherwise (and for any name
    too long for one line) RFC 2231: percent-encoded UTF-8, which also
    neutralises any control character a hostile filename might carry, cut
    into numbered continuations so no line nears the 998-octet limit."""
    if name.isascii() and all(32 <= ord(c) < 127 for c in name):
        escaped = name.replace("\\", "\\\\").replace('"', '\\"')
        if len(escaped) <= _PARAM_LINE:
            return f'{key}="{escaped}"'
    encoded = quote(name.encode("utf-8"), safe="")
    if len(encoded) <= _PARAM_LINE:
        return f"{key}*=utf-8''{encoded}"
    pieces: list[str] = []
    start = 0
    while start < len(encoded):
        end = min(start + _PARAM_CHUNK, len(encoded))
        # Never cut a %XX escape in two.
        if encoded[end - 1 : end] == "%":
            end -= 1
        elif encoded[end - 2 : end - 1] == "%":
            end -= 2
        pieces.append(encoded[start:end])
        start = end
    first = f"{key}*0*=utf-8''{pieces[0]}"
    rest = [f"{key}*{i}*={piece}" for i, piece in enumerate(pieces[1:], start=1)]
    return ";\r\n ".join([first, *rest])


def _attachment(attachment: Attachment) -> list[bytes]:
    name = attachment.filename
    headers = [
        f"Content-Type: {attachment.mime_type};\r\n {_name_params('name', name)}",
        f"Content-Disposition: attachment;\r\n {_name_params('filename', name)}",
        "Content-Transfer-Encoding: base64",
    ]
    # The caller's base64 (validated, whitespace removed) decodes to the same
    # bytes; re-wrapping it spares an encode of the whole attachment.
    return _part(headers, _wrap(attachment.data.encode("ascii")))


def _part(headers: list[str], body: list[bytes]) -> list[bytes]:
    return ["\r\n".join(headers).encode("utf-8"), CRLF, CRLF, *body]


def _multipart(boundary: str, parts: list[list[bytes]]) -> list[bytes]:
    delimiter = b"--" + boundary.encode("ascii")
    out: list[bytes] = []
    for part in parts:
        out.append(delimiter + CRLF)
        out.extend(part)
        out.append(CRLF)
    out.append(delimiter + b"--" + CRLF)
    return out


def _b64(data: bytes) -> list[bytes]:
    """Base64 wrapped at 76 characters per line (RFC 2045), CRLF-terminated."""
    return _wrap(base64.b64encode(data))


def _wrap(encoded: bytes) -> list[bytes]:
    """76-column lines; whole blocks of lines are cut by one C call each
    (a MiB of base64 is 18,000 lines, too many for a Python-level loop to
    be cheap)."""
    if not encoded:
        return []
    size = len(encoded)
    whole = size - size % _BLOCK.size
    lines: list[bytes] = []
    for offset in range(0, whole, _BLOCK.size):
        lines.extend(_BLOCK.unpack_from(encoded, offset))
    lines.extend([encoded[i : i + 76] for i in range(whole, size, 76)])
    return [CRLF.join(lines), CRLF]


def _needs_encoding(value: str) -> bool:
    return not value.isascii() or any(ord(c) < 32 and c != "\t" or ord(c) == 127 for c in value)


def _text_header(name: str, value: str) -> str:
    """An unstructured header: RFC 2047 (UTF-8) when non-ASCII or control
    characters are present, else verbatim and folded at whitespace."""
    if not _needs_encoding(value):
        folded = _fold(name, value)
        if max(len(line) for line in folded.split("\r\n")) <= 998:
            return folded
    return _fold(name, " ".join(encode_words(value)))


def _fold(name: str, value: str) -> str:
    """``Name: value`` folded before whitespace so lines stay near 78
    octets (unfolding restores the value exactly); a run without whitespace
    is never split, so a Message-ID or other token stays intact."""
    line = f"{name}: {value}"
    if len(line) <= _FOLD_AT:
        return line
    out: list[str] = []
    current = f"{name}:"
    for index, word in enumerate(value.split(" ")):
        candidate = f"{current} {word}"
        if word and index and len(candidate) > _FOLD_AT and current.strip(" "):
            out.append(current)
            current = " " + word
        else:
            current = candidate
    out.append(current)
    return "\r\n".join(out)
