"""The JSON envelope every API answer has, the errors that become one,
and reading a request's JSON body."""

from __future__ import annotations

import json
import re
from typing import Any, Protocol

from klein import Klein
from twisted.logger import LogLevel
from twisted.python.failure import Failure
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound

from gorge.log.logger import Logger
from gorge.log.redaction import redact_uri

log = Logger()

#: The methods gorge answers anywhere; every route takes one of them.
SERVED_METHODS = (b"GET", b"HEAD", b"POST")


class ApiError(Exception):
    """An expected failure, answered with its status and error code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class PlainRequest(Protocol):
    """What gorge's request handling reads and writes of a request, whichever
    channel parsed it: twisted.web's ``Request`` (``LimitedRequest``) or the
    hot channel's ``HotRequest``. The envelope, the token check, the request
    id and the access line take this, so both kinds go through one code."""

    method: bytes
    uri: bytes
    content: Any
    code: int

    def getHeader(self, key: bytes) -> bytes | str | None: ...

    def setHeader(self, name: bytes, value: bytes) -> None: ...

    def setResponseCode(self, code: int) -> None: ...


# One encoder for every answer: json.dumps would build one per call for these options.
_encoder = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _dump(body: Any) -> bytes:
    return _encoder.encode(body).encode("utf-8")


def envelope(request: PlainRequest, status: int, body: Any) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"content-type", b"application/json")
    encoded = _dump(body)
    # A known length lets the answer go out in one write instead of chunks.
    request.setHeader(b"content-length", str(len(encoded)).encode("ascii"))
    return encoded


def ok(request: PlainRequest, data: Any) -> bytes:
    return envelope(request, 200, {"data": data})


def fail(request: PlainRequest, status: int, code: str, message: str) -> bytes:
    return envelope(request, status, {"error": {"code": code, "message": message}})


def _handler_args(args: tuple) -> tuple[Any, Any]:
    # Klein passes the bound instance first when the app is a class attribute.
    return args[-2], args[-1]


def render_failure(request: PlainRequest, failure: Failure) -> bytes:
    """The envelope for a handler's failure, as the Klein error handlers answer it.

    Shared with routes dispatched in front of Klein, so both paths answer and
    log a failure identically.
    """
    e = failure.value
    if isinstance(e, ApiError):
        return fail(request, e.status, e.code, e.message)
    if isinstance(e, MethodNotAllowed):
        request.setHeader(b"allow", allow_value(e.valid_methods or []))
        return fail(request, 405, "ERR_METHOD_NOT_ALLOWED", "Method Not Allowed")
    if isinstance(e, NotFound):
        return fail(request, 404, "ERR_NOT_FOUND", "Not Found")
    if isinstance(e, HTTPException):
        code = getattr(e, "code", 500) or 500
        if code >= 500:
            return fail(request, 500, "ERR_INTERNAL", "internal server error")
        if code == 413:
            return fail(request, 413, "ERR_TOO_LARGE", "Request Entity Too Large")
        return fail(request, 400, "ERR_BAD_REQUEST", e.description or "bad request")
    uri = redact_uri(request.uri.decode("latin-1"))
    log.failure(
        "PANIC_RECOVERED method={method} uri={uri} error={error}",
        failure,
        level=LogLevel.error,
        method=request.method.decode("latin-1"),
        uri=uri,
        error=failure.getErrorMessage(),
    )
    request.gorge_error = failure.getErrorMessage()  # type: ignore[attr-defined]  # read by the access line
    return fail(request, 500, "ERR_INTERNAL", "internal server error")


def allow_value(methods: Any) -> bytes:
    """The ``Allow`` field for a route's methods (werkzeug's names, which
    add OPTIONS): the ones gorge answers, in a fixed order."""
    named = {m.encode("ascii") if isinstance(m, str) else m for m in methods}
    return b", ".join(m for m in SERVED_METHODS if m in named)


def add_error_handlers(app: Klein) -> None:
    """Register the envelope error handler on ``app``; call it once, after
    every route.

    One catch-all is enough because :func:`render_failure` tells the
    failures apart itself, most specific first; separate Klein handlers
    would depend on registration order instead.
    """

    @app.handle_errors(Exception)  # type: ignore[arg-type]  # Klein's stubs miss *args
    def _failure(*args: Any) -> bytes:
        request, failure = _handler_args(args)
        return render_failure(request, failure)


def json_integer(value: Any) -> int | None:
    """A JSON number that is an integer, as JSON Schema counts one: ``7`` and
    ``7.0`` alike (JSON does not tell them apart, and a client's encoder may
    write either); None for anything else (a fraction, a bool, a string).
    The documents type these fields ``integer``, so the server must take what
    that type admits."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def read_json_object(request: PlainRequest) -> dict:
    """The request body as a JSON object, or a 400 that says what is wrong."""
    raw = request.content.read() if request.content is not None else b""
    if not raw.strip():
        raise ApiError(400, "ERR_BAD_REQUEST", "request body must be a JSON object")
    try:
        if _PLAIN_UTF8.match(raw) and not raw.startswith(_UTF8_BOM):
            # What json.loads would detect for these bytes, without the
            # detection (a noticeable share of a small request).
            body = json.loads(raw.decode("utf-8", "surrogatepass"))
        else:
            body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, "ERR_BAD_REQUEST", f"request body is not valid JSON: {e}") from None
    except RecursionError:
        raise ApiError(400, "ERR_BAD_REQUEST", "request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise ApiError(400, "ERR_BAD_REQUEST", "request body must be a JSON object")
    if _MAYBE_SURROGATE.search(raw) or not _PLAIN_UTF8.match(raw):
        try:
            body = _replace_surrogates(body)
        except RecursionError:
            raise ApiError(400, "ERR_BAD_REQUEST", "request body is nested too deeply") from None
    return body


# A lone UTF-16 surrogate (an unpaired ``\ud800`` escape, or its raw UTF-8
# bytes) decodes to a str no backend can store, so a client value would end as
# a 500. It becomes U+FFFD, as the reference's JSON decoder does. The raw scan
# keeps the walk off the common path; UTF-16/32 bodies are always walked.
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_PLAIN_UTF8 = re.compile(rb"(?!\xff\xfe|\xfe\xff)[^\x00]{2}")
_UTF8_BOM = b"\xef\xbb\xbf"
_SURROGATE = re.compile("[\ud800-\udfff]")


def _replace_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_replace_surrogates(k): _replace_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_surrogates(item) for item in value]
    return value
