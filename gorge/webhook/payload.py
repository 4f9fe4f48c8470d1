"""The request document: reading ``properties``, the signed body, the write-back.

Pure functions only; the byte formats here are contracts.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _quote
from typing import Any

ERROR_TYPE_HTTP = "http"
ERROR_TYPE_TIMEOUT = "timeout"
ERROR_TYPE_HOOK = "hook"

CODE_INVALID_PROPERTIES = "invalid-properties"
CODE_NOT_FOUND = "not-found"
CODE_DISABLED = "disabled"
CODE_URI = "uri"
CODE_REQUEST_BUILD = "request-build-error"
CODE_SILENT = "silent"  # HeraldWebhookRequest::ERROR_SILENT

SIGNATURE_HEADER = "X-Phabricator-Webhook-Signature"

# Standard Webhooks (standardwebhooks.com), sent only when switched on.
STANDARD_ID_HEADER = "webhook-id"
STANDARD_TIMESTAMP_HEADER = "webhook-timestamp"
STANDARD_SIGNATURE_HEADER = "webhook-signature"
STANDARD_SECRET_PREFIX = "whsec_"

# PHP array keys that are integers encode as canonical decimal strings only.
_INT_KEY = re.compile(r"-?(?:0|[1-9][0-9]*)", re.ASCII)
_ESCAPED_DEL = re.compile(r"(\\+)u007f")


class InvalidProperties(ValueError):
    """The stored document breaks a read rule.

    ``document`` is the parsed object when the text was a JSON object that
    only failed a type rule (its keys are then preserved on write), else None.
    """

    def __init__(self, reason: str, document: dict | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.document = document


@dataclass(frozen=True)
class Properties:
    """What we read from a row's ``properties``; ``document`` is kept for the write-back."""

    document: dict
    retry_forever: bool
    transactions: Any  # list or dict as stored: its shape decides the body order
    triggers: tuple[str, ...]
    silent: bool
    secure: bool
    test: bool


def _phid_values(document: dict, key: str) -> Any:
    value = document.get(key)
    if value is None:
        return []
    if isinstance(value, dict):
        items = list(value.values())
    elif isinstance(value, list):
        items = value
    else:
        raise InvalidProperties(f"{key} is not a list or object", document)
    if not all(isinstance(item, str) for item in items):
        raise InvalidProperties(f"{key} holds a non-string element", document)
    return value


def _flag(document: dict, key: str) -> bool:
    value = document.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidProperties(f"{key} is not a boolean", document)
    return value


def parse_properties(text: str | bytes | None) -> Properties:
    """Apply the read rules; raise InvalidProperties otherwise."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    try:
        document = json.loads(text) if text is not None else None
    except (ValueError, RecursionError):
        raise InvalidProperties("not JSON") from None
    if document is None or document == []:
        document = {}
    if not isinstance(document, dict):
        raise InvalidProperties("not a JSON object")
    transactions = _phid_values(document, "transactionPHIDs")
    triggers = _phid_values(document, "triggerPHIDs")
    return Properties(
        document=document,
        retry_forever=document.get("retry") == "forever",
        transactions=transactions,
        triggers=tuple(triggers.values() if isinstance(triggers, dict) else triggers),
        silent=_flag(document, "silent"),
        secure=_flag(document, "secure"),
        test=_flag(document, "test"),
    )


def newest_first(transactions: Any) -> list[str]:
    """Transaction PHIDs in the order Phorge sends them.

    An id-keyed object (test page, ``bin/webhook call``) sorts by id,
    descending; anything else is stored oldest first, so it is reversed.
    """
    if isinstance(transactions, dict):
        keys = list(transactions)
        if keys and all(_INT_KEY.fullmatch(k) for k in keys):
            return [transactions[k] for k in sorted(keys, key=int, reverse=True)]
        return list(reversed(list(transactions.values())))
    return list(reversed(transactions))


def phid_type(phid: str) -> str:
    parts = phid.split("-")
    return parts[1] if len(parts) >= 2 else ""


def build_body(object_phid: str, date_created: int, props: Properties) -> bytes:
    """PhutilJSON::encodeFormatted() bytes of the payload, trailing newline included.

    The text is what ``json.dumps(payload, indent=2)`` gives (",", ": " and
    ``\\uXXXX`` escapes, byte-identical to PhutilJSON here except that PHP
    leaves DEL (0x7f) as it is), laid out directly: the payload's shape is
    fixed, and json's indenting encoder is pure Python, a tenth of a
    delivery's CPU. tests/webhook/test_payload.py holds the two equal.
    """
    text = (
        '{\n  "object": {\n    "type": '
        + _quote(phid_type(object_phid))
        + ',\n    "phid": '
        + _quote(object_phid)
        + '\n  },\n  "triggers": '
        + _phid_objects(props.triggers)
        + ',\n  "action": {\n    "test": '
        + _BOOLEAN[props.test]
        + ',\n    "silent": '
        + _BOOLEAN[props.silent]
        + ',\n    "secure": '
        + _BOOLEAN[props.secure]
        + ',\n    "epoch": '
        + str(int(date_created))
        + '\n  },\n  "transactions": '
        + _phid_objects(newest_first(props.transactions))
        + "\n}\n"
    )
    return _keep_del(text).encode("ascii")


_BOOLEAN = {False: "false", True: "true"}


def _phid_objects(phids: Any) -> str:
    """A list of ``{"phid": …}`` objects, at the payload's second level."""
    if not phids:
        return "[]"
    items = ",\n".join('    {\n      "phid": ' + _quote(phid) + "\n    }" for phid in phids)
    return "[\n" + items + "\n  ]"


def _keep_del(text: str) -> str:
    """Undo Python's escape of DEL (0x7f): PHP's json_encode leaves it raw."""
    if "u007f" in text:
        text = _ESCAPED_DEL.sub(_unescape_del, text)
    return text


def _unescape_del(match: re.Match) -> str:
    slashes = match.group(1)
    # An even run of backslashes is escaped backslashes followed by literal "u007f".
    return slashes[:-1] + "\x7f" if len(slashes) % 2 else match.group(0)


def sign(key: str, body: bytes) -> str:
    return hmac.new(key.encode("utf-8"), body, hashlib.sha256).hexdigest()


def standard_secret(key: str) -> str:
    """The receiver's Standard Webhooks secret for a hook: ``whsec_`` + base64 of
    the hook's key bytes, so both signatures use one and the same key."""
    return STANDARD_SECRET_PREFIX + base64.b64encode(key.encode("utf-8")).decode("ascii")


def standard_signature(key: str, message_id: str, timestamp: int, body: bytes) -> str:
    """``v1,`` + base64 HMAC-SHA256 of ``id.timestamp.body``, keyed with the
    bytes :func:`standard_secret` encodes (the hook's key as UTF-8)."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(key.encode("utf-8"), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def standard_headers(key: str, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        STANDARD_ID_HEADER: message_id,
        STANDARD_TIMESTAMP_HEADER: str(timestamp),
        STANDARD_SIGNATURE_HEADER: standard_signature(key, message_id, timestamp, body),
    }


def with_outcome(document: dict | None, error_type: str, error_code: int | str) -> str:
    """The ``properties`` column after an outcome, compact as PHP's json_encode."""
    updated = dict(document) if document is not None else {}
    # Assigning to an existing key keeps its position; new keys append.
    updated["errorType"] = error_type
    updated["errorCode"] = error_code
    text = _keep_del(json.dumps(updated, separators=(",", ":")))
    # json.dumps never emits "/" outside strings, and PHP escapes it inside them.
    return text.replace("/", "\\/")
