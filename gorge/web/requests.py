"""What every inbound request carries: its id, its body limit, and the
one access-log line it leaves."""

from __future__ import annotations

import itertools
import os
import time
from io import BytesIO
from typing import Any

from twisted.logger import LogLevel
from twisted.web import server

from gorge.log.logger import Logger
from gorge.log.output import request_id_var
from gorge.log.redaction import redact_uri
from gorge.web.envelope import fail

log = Logger()


class _Discard:
    """Stands in for the body buffer once a request is over the limit."""

    def write(self, data: bytes) -> None:
        pass

    def seek(self, *args: Any) -> int:
        return 0

    def tell(self) -> int:
        return 0

    def read(self, *args: Any) -> bytes:
        return b""

    def close(self) -> None:
        pass


class RequestIds:
    """Unique 32-hex-digit request ids: a random per-process half and a counter.

    As unique as a uuid4 for our purpose (one process never repeats, two
    processes collide with probability 2**-64) at the price of a counter step.
    """

    def __init__(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._counter = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter) & 0xFFFFFFFFFFFFFFFF:016x}"


def stamp_request(request: Any, ids: RequestIds | None) -> str:
    """Give ``request`` its id and its start, which :func:`log_request` reads,
    and echo the id in ``X-Request-Id``; returns the id. The client's id is
    kept if it is fit to echo and log, else one is made from ``ids``."""
    header = request.getHeader(b"x-request-id")
    presented = header.decode("latin-1") if isinstance(header, bytes) else header
    # An id is echoed and logged: keep it short and printable.
    if presented and (len(presented) > 128 or not presented.isprintable()):
        presented = None
    request_id = presented or (ids or RequestIds()).next()
    request.request_id = request_id
    request.started = time.monotonic()
    request.setHeader(b"x-request-id", request_id.encode("latin-1", "replace"))
    return request_id


class LimitedRequest(server.Request):
    """A request that refuses bodies over ``limit`` before anything else runs.

    Also assigns the request id and writes the access log line. Subclass with
    a ``limit`` class attribute (a ``functools.partial`` would lose the
    ``INonQueuedRequestFactory`` marker).
    """

    limit: int = 2 * 1024 * 1024
    # Set per factory by build_site; a bare subclass falls back to random ids.
    request_ids: RequestIds | None = None
    # False when the log level drops the REQUEST line anyway: then it is not built.
    access_log: bool = True
    # Paths of routine traffic (a worker's lease and report calls, many a
    # second): their successful answers get the REQUEST line at debug only.
    quiet_paths: frozenset[bytes] = frozenset()
    # Whether the log level lets debug lines through.
    debug_log: bool = False

    _too_large = False
    #: The head announced a body over the limit: the channel answers at once.
    declared_too_large = False
    _received = 0
    gorge_error: str | None = None
    # Set by stamp_request() when the request is processed.
    request_id = ""
    started = 0.0

    def __init__(self, channel: Any, *args: Any, **kwargs: Any) -> None:
        # Every body is JSON: parsing it as a form (Twisted's default for POST)
        # builds an email.message per request to read the content type.
        kwargs.setdefault("parsePOSTFormSubmission", False)
        super().__init__(channel, *args, **kwargs)

    @property
    def over_limit(self) -> bool:
        """The body read so far, or the length its head declared, passed the limit."""
        return self._too_large

    def gotLength(self, length: int | None) -> None:
        if length is not None and length > self.limit:
            self._too_large = True
            self.declared_too_large = True
            self.content = _Discard()
            return
        # The limit bounds what is kept, so memory serves every body; Twisted
        # would spill one of unknown length or over 100 kB to a temporary file.
        self.content = BytesIO()

    def handleContentChunk(self, data: bytes) -> None:
        if self._too_large:
            return
        self._received += len(data)
        if self._received > self.limit:
            self._too_large = True
            try:
                if self.content is not None:
                    self.content.close()
            except Exception:
                pass
            self.content = _Discard()
            return
        super().handleContentChunk(data)

    def process(self) -> None:
        request_id = stamp_request(self, self.request_ids)
        transport = getattr(self.channel, "transport", None)
        if transport is not None and not getattr(self.channel, "_gorge_nodelay", False):
            # Small JSON answers must not wait for Nagle's algorithm.
            # Our own mark, set on whichever channel class carries the request.
            self.channel._gorge_nodelay = True  # type: ignore[attr-defined]
            try:
                transport.setTcpNoDelay(True)
            except (AttributeError, OSError):
                pass
        token = request_id_var.set(request_id)
        try:
            self.notifyFinish().addBoth(self._log_access)
            if self._too_large:
                self.setHeader(b"connection", b"close")
                body = fail(self, 413, "ERR_TOO_LARGE", "Request Entity Too Large")
                self.write(body)
                self.finish()
                return
            super().process()
        finally:
            request_id_var.reset(token)

    def _log_access(self, result: object) -> None:
        log_request(type(self), self)


def log_request(factory: type[LimitedRequest], request: Any) -> None:
    """The ``REQUEST`` line of an answered ``request`` (a :class:`LimitedRequest`
    or a :class:`~gorge.hotpath.HotRequest`, stamped by :func:`stamp_request`)
    as ``factory`` says (level, quiet paths), and ``REQUEST_FAILED`` for a 5xx."""
    status: int = request.code
    request_id: str = request.request_id
    routine = status < 400 and request.path in factory.quiet_paths
    if routine:
        # One line per lease or report would be a line per poll tick.
        access = factory.debug_log
    else:
        access = factory.access_log
    if not access and status < 500:
        return
    redacted = redact_uri(request.uri.decode("latin-1", "replace"))
    verb = request.method.decode("latin-1", "replace")
    if access:
        duration_ms = round((time.monotonic() - request.started) * 1000, 3)
        log.emit(
            LogLevel.debug if routine else LogLevel.info,
            "REQUEST method={method} uri={uri} status={status} duration_ms={duration_ms}",
            method=verb,
            uri=redacted,
            status=status,
            duration_ms=duration_ms,
            request_id=request_id,
        )
    if status >= 500:
        log.error(
            "REQUEST_FAILED method={method} uri={uri} status={status} error={error}",
            method=verb,
            uri=redacted,
            status=status,
            error=request.gorge_error or "",
            request_id=request_id,
        )


def _request_factory(
    limit: int,
    access_log: bool = True,
    quiet_paths: frozenset[bytes] = frozenset(),
    debug_log: bool = False,
) -> type[LimitedRequest]:
    return type(
        f"LimitedRequest{limit}",
        (LimitedRequest,),
        {
            "limit": limit,
            "request_ids": RequestIds(),
            "access_log": access_log,
            "quiet_paths": quiet_paths,
            "debug_log": debug_log,
        },
    )
