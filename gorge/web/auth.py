"""The service token check of the API routes."""

from __future__ import annotations

import hmac
from urllib.parse import parse_qs

from gorge.web.envelope import PlainRequest, fail

TOKEN_FAILURE_MESSAGE = "missing or invalid service token"


def _presented_token(request: PlainRequest) -> bytes:
    header = request.getHeader(b"x-service-token")
    if header:
        return header.encode("utf-8", "surrogateescape") if isinstance(header, str) else header
    query = request.uri.partition(b"?")[2]
    values = parse_qs(query.decode("latin-1"), keep_blank_values=True).get("token")
    return values[0].encode("latin-1") if values else b""


def token_refusal(request: PlainRequest, token: bytes) -> bytes | None:
    """The 401 answer for a request without the service token, or None when
    it has it (or ``token`` is empty: no gate)."""
    if token and not hmac.compare_digest(_presented_token(request), token):
        return fail(request, 401, "ERR_UNAUTHORIZED", TOKEN_FAILURE_MESSAGE)
    return None
