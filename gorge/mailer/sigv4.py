"""AWS Signature Version 4 for header-signed requests (pure functions).

Only what the SES Query API needs: no query-string (presigned) signing, no
session tokens, no path normalisation beyond "empty means /".
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

ALGORITHM = "AWS4-HMAC-SHA256"


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str = field(repr=False)


def amz_date(when: datetime) -> tuple[str, str]:
    """Return (``YYYYMMDDTHHMMSSZ``, ``YYYYMMDD``) for an aware or UTC-naive time."""
    if when.tzinfo is not None:
        when = when.astimezone(UTC)
    stamp = when.strftime("%Y%m%dT%H%M%SZ")
    return stamp, stamp[:8]


def amz_date_from_posix(seconds: float) -> tuple[str, str]:
    return amz_date(datetime.fromtimestamp(int(seconds), tz=UTC))


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _canonical_value(value: str) -> str:
    # SigV4 trims and collapses runs of spaces in header values.
    return " ".join(value.strip().split())


def canonical_headers(headers: Mapping[str, str]) -> tuple[str, str]:
    """Return (canonical header block, signed header list) for ``headers``."""
    lowered: dict[str, list[str]] = {}
    for name, value in headers.items():
        lowered.setdefault(name.strip().lower(), []).append(_canonical_value(value))
    names = sorted(lowered)
    block = "".join(f"{name}:{','.join(lowered[name])}\n" for name in names)
    return block, ";".join(names)


def canonical_request(
    method: str,
    path: str,
    query: str,
    headers: Mapping[str, str],
    payload_hash: str,
) -> tuple[str, str]:
    """Return (canonical request, signed headers).

    ``path`` must already be URI-encoded the way it goes on the wire; ``query``
    must already be in canonical (sorted, encoded) form or empty.
    """
    block, signed = canonical_headers(headers)
    text = "\n".join([method.upper(), path or "/", query, block, signed, payload_hash])
    return text, signed


def credential_scope(datestamp: str, region: str, service: str) -> str:
    return f"{datestamp}/{region}/{service}/aws4_request"


def string_to_sign(stamp: str, scope: str, canonical: str) -> str:
    return "\n".join([ALGORITHM, stamp, scope, sha256_hex(canonical.encode("utf-8"))])


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode("utf-8"), hashlib.sha256).digest()


def signing_key(secret_key: str, datestamp: str, region: str, service: str) -> bytes:
    key = _hmac(("AWS4" + secret_key).encode("utf-8"), datestamp)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    return key


def signature(secret_key: str, datestamp: str, region: str, service: str, to_sign: str) -> str:
    key = signing_key(secret_key, datestamp, region, service)
    return hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()


def authorization(
    credentials: Credentials,
    *,
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes,
    region: str,
    service: str,
    stamp: str,
    query: str = "",
) -> str:
    """The ``Authorization`` header value for a request whose ``headers`` are all signed.

    ``headers`` must include ``host`` and ``x-amz-date`` (equal to ``stamp``).
    """
    datestamp = stamp[:8]
    canonical, signed = canonical_request(method, path, query, headers, sha256_hex(body))
    scope = credential_scope(datestamp, region, service)
    sig = signature(
        credentials.secret_key, datestamp, region, service, string_to_sign(stamp, scope, canonical)
    )
    return (
        f"{ALGORITHM} Credential={credentials.access_key}/{scope}, "
        f"SignedHeaders={signed}, Signature={sig}"
    )
