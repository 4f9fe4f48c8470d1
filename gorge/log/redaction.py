"""Keeping credentials out of log lines: URIs with their passwords
replaced, and known secret values scrubbed from any text."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import unquote

_CREDENTIAL_KEYS = frozenset(
    {
        "token",
        "servicetoken",
        "accesstoken",
        "refreshtoken",
        "apikey",
        "password",
        "passwd",
        "secret",
        "clientsecret",
        "authorization",
    }
)


def _is_credential_key(key: str) -> bool:
    return unquote(key).lower().replace("-", "").replace("_", "") in _CREDENTIAL_KEYS


def redact_uri(uri: str) -> str:
    """Replace credential-like query values with ``[REDACTED]``.

    Path, parameter order and encoding are kept byte for byte, so the line
    still identifies the request.
    """
    if "?" not in uri:
        return uri
    path, _, query = uri.partition("?")
    fragment = ""
    if "#" in query:
        query, _, fragment = query.partition("#")
        fragment = "#" + fragment
    parts = []
    for pair in query.split("&"):
        key, eq, _value = pair.partition("=")
        if eq and _is_credential_key(key):
            parts.append(f"{key}=[REDACTED]")
        else:
            parts.append(pair)
    return f"{path}?{'&'.join(parts)}{fragment}"


def credential_values(uri: str) -> list[str]:
    """The raw and decoded credential values of a URI, for :func:`scrub`."""
    if "?" not in uri:
        return []
    values: list[str] = []
    for pair in uri.partition("?")[2].split("#")[0].split("&"):
        key, eq, value = pair.partition("=")
        if eq and value and _is_credential_key(key):
            values.extend({value, unquote(value.replace("+", " "))})
    return values


def scrub(text: str, secrets: Iterable[str]) -> str:
    """Remove every secret from ``text``, longest first (a short secret that
    is a prefix of a longer one must not leave the longer one's tail)."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, "[REDACTED]")
    return text
