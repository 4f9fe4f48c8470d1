"""The HTTP surface every gorge daemon shares.

* :func:`ok` / :func:`fail`: the compact ``{data}`` / ``{error}`` envelope.
* :func:`add_error_handlers`: Klein error handlers in the one order that works.
* :func:`build_site`: probes, metrics, the token gate for the API prefix, the
  request body limit, request ids and the access log, around a service's
  Klein resource.
* :class:`OpenApiDocument`: the daemon's OpenAPI document, read once from its
  package and served at ``/api/<service>/openapi.json``.
* ``/api/<service>/version``: the daemon's release, API version and uptime
  (gorge/web/version.py).
* :class:`GorgeSite` keeps its connections so that a stop can finish the
  requests that have already arrived (see :meth:`GorgeSite.drain`)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Coroutine
from typing import Any
from urllib.parse import unquote_to_bytes

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.defer import TimeoutError as DeferredTimeoutError
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import connectionDone
from twisted.logger import LogLevel
from twisted.python.failure import Failure
from twisted.web import http, server
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from gorge.app.inflight import InFlight
from gorge.app.private_names import klein_url_map, stub_server_factory
from gorge.log.logger import Logger
from gorge.log.output import request_id_var
from gorge.web.auth import token_refusal
from gorge.web.envelope import SERVED_METHODS, allow_value, envelope, fail, render_failure
from gorge.web.hotchannel import HotChannel, HotRequest
from gorge.web.requests import LimitedRequest, _request_factory, log_request, stamp_request
from gorge.web.version import About

#: A route's handler: the request in, the answer's body out.
Handler = Callable[[Any], Coroutine[Any, Any, bytes]]

READINESS_TIMEOUT = 5.0

_PROBE_METHODS = b"GET, HEAD"
# The tokens of a Connection field: a comma-separated list (RFC 9110, 7.6.1).
_TOKEN_SEPARATORS = re.compile(rb"[\s,]+")

log = Logger()


class GorgeRoot(Resource):
    """Probes, metrics and the authenticated API prefix, in one leaf resource.

    A leaf so that the token gate runs before Klein resolves a route: without
    a token, every path under the prefix answers 401, existing or not.
    """

    isLeaf = True

    def __init__(
        self,
        *,
        api_resource: Resource,
        prefix: str,
        token: str,
        readiness: Callable[[], Coroutine[Any, Any, str | None]],
        registry: CollectorRegistry,
        clock: IReactorTime,
        allowed_methods: Callable[[bytes], list[str]] | None = None,
        about: About | None = None,
    ) -> None:
        super().__init__()
        self._about = about
        self._version_path = prefix.encode("ascii") + b"version"
        self._api = api_resource
        self._allowed_methods = allowed_methods or (lambda path: [])
        self.prefix = prefix.encode("ascii")
        self._token = token.encode("utf-8")
        self._readiness = readiness
        self._registry = registry
        self._clock = clock

    def render(self, request: Any) -> Any:
        path = request.path
        if path.startswith(self.prefix) or path == self.prefix.rstrip(b"/"):
            refusal = token_refusal(request, self._token)
            if refusal is not None:
                return refusal
            if self._about is not None and path == self._version_path:
                if request.method not in (b"GET", b"HEAD"):
                    request.setHeader(b"allow", _PROBE_METHODS)
                    return fail(request, 405, "ERR_METHOD_NOT_ALLOWED", "Method Not Allowed")
                return self._about.render(request, self._clock)
            if request.method not in SERVED_METHODS:
                return self._refuse_method(request)
            return self._api.render(request)
        if path in (b"/", b"/healthz", b"/readyz", b"/metrics"):
            if request.method not in (b"GET", b"HEAD"):
                request.setHeader(b"allow", _PROBE_METHODS)
                return fail(request, 405, "ERR_METHOD_NOT_ALLOWED", "Method Not Allowed")
            if path == b"/metrics":
                request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode("ascii"))
                return generate_latest(self._registry)
            if path == b"/readyz":
                return self._render_readyz(request)
            return envelope(request, 200, {"status": "ok"})
        return fail(request, 404, "ERR_NOT_FOUND", "Not Found")

    def _refuse_method(self, request: Any) -> bytes:
        """A method no route takes: 405 with the path's methods, or 404 for
        a path no route has.

        Not left to Klein: werkzeug matches a method whatever its case
        (``post`` as ``POST``) where HTTP's are case-sensitive (RFC 9110,
        9.1), and it would answer OPTIONS itself."""
        allowed = self._allowed_methods(request.path)
        if not allowed:
            return fail(request, 404, "ERR_NOT_FOUND", "Not Found")
        request.setHeader(b"allow", allow_value(allowed))
        return fail(request, 405, "ERR_METHOD_NOT_ALLOWED", "Method Not Allowed")

    def _render_readyz(self, request: Any) -> Any:
        async def check() -> str | None:
            try:
                return await Deferred.fromCoroutine(self._readiness()).addTimeout(
                    READINESS_TIMEOUT, self._clock
                )
            except DeferredTimeoutError:
                return "readiness check timed out"
            except Exception as e:  # a probe answers, it never crashes
                log.error("READINESS_FAILED error={error}", error=str(e))
                return "readiness check failed"

        gone: list[bool] = []  # the client hung up before the answer
        request.notifyFinish().addErrback(lambda _: gone.append(True))

        def answer(reason: str | None) -> None:
            if request.finished or gone:
                return
            if reason is None:
                body = envelope(request, 200, {"status": "ok"})
            else:
                body = envelope(request, 503, {"status": "unavailable", "reason": reason})
            request.write(body)
            request.finish()

        d = Deferred.fromCoroutine(check())
        d.addCallback(answer)
        d.addErrback(lambda f: log.failure("READYZ_FAILED", f, level=LogLevel.error))
        return server.NOT_DONE_YET


class _KnownToSite:
    """A channel its site knows while the connection is open, so that a stop
    can drain it (:meth:`GorgeSite.drain`)."""

    site: Any
    # False for a connection a hot channel handed over, or one under a test's
    # stub client: the hot channel, or nobody, is the one the site knows.
    tracked = True

    def connectionMade(self) -> None:
        super().connectionMade()  # type: ignore[misc]
        if self.tracked:
            self.site.connection_opened(self)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        super().connectionLost(reason)  # type: ignore[misc]
        if self.tracked:
            self.site.connection_closed(self)


class GorgeChannel(_KnownToSite, http.HTTPChannel):
    """One HTTP/1.1 connection, known to its site while it is open."""

    site: GorgeSite

    def headerReceived(self, line: bytes) -> bool:
        name, colon, value = line.partition(b":")
        if colon and name.lower() == b"content-length":
            # twisted.web reads the length with int(), which refuses more
            # than 4300 digits with a ValueError out of dataReceived: pass
            # on the same number, in few enough digits.
            line = b"Content-Length: " + short_length(value.strip(b" \t"))
        return bool(super().headerReceived(line))

    def allHeadersReceived(self) -> None:
        super().allHeadersReceived()
        request = self.requests[-1]
        if getattr(request, "declared_too_large", False):
            # Answer the 413 now and close, reading none of the body: a
            # length of zero makes twisted.web process the request at once.
            self.persistent = False
            self.length = 0

    def rawDataReceived(self, data: bytes) -> None:
        super().rawDataReceived(data)
        request = self.requests[-1] if self.requests else None
        if (
            request is not None
            and self._transferDecoder is not None
            and not self._handlingRequest
            and getattr(request, "over_limit", False)
        ):
            # A chunked body has passed the limit before its end: answer the
            # 413 now and close, instead of reading (and dropping) a body
            # that may never end while the connection stays held.
            self.persistent = False
            self.allContentReceived()

    def checkPersistence(self, request: Any, version: bytes) -> bool:
        # A request whose head completes during the drain is the last one
        # on its connection.
        if self.site.draining:
            request.responseHeaders.setRawHeaders(b"connection", [b"close"])
            return False
        # twisted.web reads the first Connection field only, its tokens split
        # at spaces; a proxy reads every field, split at commas. A "close"
        # anywhere closes, as the hot channel's parser reads it.
        if version == b"HTTP/1.1" and b"close" in connection_tokens(request.requestHeaders):
            request.responseHeaders.setRawHeaders(b"connection", [b"close"])
            return False
        return bool(super().checkPersistence(request, version))

    def finish_and_close(self) -> None:
        """Close now if no request has arrived, else after its answer."""
        if not self.requests:
            self.loseConnection()
            return
        self.persistent = False
        for request in self.requests:
            if not request.startedWriting:
                request.responseHeaders.setRawHeaders(b"connection", [b"close"])


class Utf8Only(Resource):
    """Klein's resource, for the requests whose path (percent-decoded) and
    Host it can read as UTF-8: Klein answers the others with a text/html 400
    and an error in the log; here they get the envelope."""

    isLeaf = True

    def __init__(self, klein: Resource) -> None:
        super().__init__()
        self._klein = klein

    def render(self, request: Any) -> Any:
        try:
            unquote_to_bytes(request.path).decode("utf-8")
            request.getRequestHostname().decode("utf-8")
        except UnicodeDecodeError:
            return fail(request, 400, "ERR_BAD_REQUEST", "the path and Host must be UTF-8")
        return self._klein.render(request)


def short_length(value: bytes) -> bytes:
    """A Content-Length value as few digits: its leading zeros dropped, and
    a number of more than 18 digits (over any body limit) as 19 nines. Not
    digits: unchanged, for twisted.web to refuse."""
    if not value.isdigit():
        return value
    digits = value.lstrip(b"0") or b"0"
    return digits if len(digits) <= 18 else b"9" * 19


def connection_tokens(headers: Any) -> set[bytes]:
    """The lower-cased tokens of every Connection field of ``headers``."""
    return {
        token.lower()
        for value in headers.getRawHeaders(b"connection", [])
        for token in _TOKEN_SEPARATORS.split(value)
        if token
    }


class DirectRoutes(Resource):
    """Hot POST routes by exact path, every other request to the API's Klein resource.

    The twisted.web path for the hot routes (a connection the hot channel has
    handed over, or a test's stub client). Klein binds a werkzeug map and
    adapts the request for each call, a noticeable share of a queue round
    trip. Only an exact POST path is taken here, so every other path, method
    or spelling still meets Klein's strict routing and its 404 rules; answers
    and failures go through the same envelope and :func:`render_failure` as
    Klein's error handlers.
    """

    isLeaf = True

    def __init__(self, routes: dict[bytes, Handler], fallback: Resource) -> None:
        super().__init__()
        self._routes = routes
        self._fallback = fallback

    def render(self, request: Any) -> Any:
        handler = self._routes.get(request.path) if request.method == b"POST" else None
        if handler is None:
            return self._fallback.render(request)
        gone = False
        running: Deferred | None = None

        def finished(result: object) -> None:
            nonlocal gone
            gone = True
            # The client went away: stop the work, as Klein does.
            if isinstance(result, Failure) and running is not None:
                running.cancel()

        def answer(body: bytes) -> None:
            request.write(body)
            request.finish()

        request.notifyFinish().addBoth(finished)
        running = run_route(handler, request, answer, lambda: gone)
        return NOT_DONE_YET


def run_route(
    handler: Handler, request: Any, answer: Callable[[bytes], None], gone: Callable[[], bool]
) -> Deferred:
    """Run ``handler`` for ``request`` and give ``answer`` its body, or the
    envelope of its failure (:func:`render_failure`), unless ``gone()`` says
    the client has left: then nothing is answered, and a failure other than
    the cancel is logged. Cancel the Deferred returned to stop the work."""
    # One coroutine around the handler rather than callbacks on its
    # Deferred: this runs for every request, and each callback costs.
    return Deferred.fromCoroutine(_route(handler, request, answer, gone))


async def _route(
    handler: Handler, request: Any, answer: Callable[[bytes], None], gone: Callable[[], bool]
) -> None:
    failure: Failure | None = None
    try:
        body = await handler(request)
    except Exception:
        failure = Failure()
    if gone():
        if failure is not None and not failure.check(CancelledError):
            log.failure("REQUEST_ABANDONED_FAILED", failure, level=LogLevel.error)
        return
    try:
        answer(body if failure is None else render_failure(request, failure))
    except Exception:
        log.failure("RESPONSE_WRITE_FAILED", Failure(), level=LogLevel.error)


class _HttpDate:
    """The ``Date`` field's value, made once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._value = http.datetimeToString(second)
        return self._value


class HotRoutes:
    """A service's hot routes: exact POST paths under its token-gated API
    prefix, answered by :class:`GorgeHotChannel` without twisted.web's Request."""

    def __init__(self, handlers: dict[bytes, Handler], token: str) -> None:
        self.handlers = handlers
        self.token = token.encode("utf-8")
        self.date = _HttpDate()  # one for every connection of the site


class GorgeHotChannel(_KnownToSite, HotChannel):
    """A :class:`~gorge.hotpath.HotChannel` with what ``GorgeRoot`` and
    ``LimitedRequest`` do for a request on the twisted.web path: the request
    id, the token gate, the envelope for a failure, the access log, a stop's
    drain and the client's hang-up. The answer is the same to the byte, apart
    from the ``Date`` and a fresh request id."""

    requestFactory: type[LimitedRequest]

    def __init__(self) -> None:
        super().__init__()
        self._running: Deferred | None = None

    def fallback(self) -> Any:
        channel = GorgeChannel()
        channel.tracked = False
        return channel

    def connectionMade(self) -> None:
        hot: HotRoutes = self.site.hot_routes
        self._hot = hot
        self.routes = hot.handlers
        self.body_limit = self.requestFactory.limit
        super().connectionMade()

    def finish_and_close(self) -> None:
        """As :meth:`GorgeChannel.finish_and_close`."""
        if self.delegate is not None:
            self.delegate.finish_and_close()
        else:
            self.close_after_answer()

    def handed_off(self) -> None:
        # The twisted.web channel closes after what it has read if the drain
        # began before; one that began while this channel read is passed on.
        if self.tracked and self.site.draining and not self.transport.disconnecting:
            self.delegate.finish_and_close()

    def process(self, request: HotRequest) -> None:
        request_id = stamp_request(request, self.requestFactory.request_ids)
        request.setHeader(b"server", server.version)
        request.setHeader(b"date", self._hot.date.now())
        if self.tracked and self.site.draining:
            request.close = True

        def answer(body: bytes) -> None:
            self._running = None
            self._log(request)
            self.respond(request, body)

        refusal = token_refusal(request, self._hot.token)
        if refusal is not None:
            answer(refusal)
            return
        context = request_id_var.set(request_id)
        try:
            running = run_route(
                self._hot.handlers[request.path], request, answer, lambda: self.gone
            )
        finally:
            request_id_var.reset(context)
        if not running.called:
            self._running = running

    def abandon(self, request: HotRequest) -> None:
        # Logged as twisted.web's request logs one its client left.
        self._log(request)
        running, self._running = self._running, None
        if running is not None:
            # Stop the work, as Klein does.
            running.cancel()

    def _log(self, request: HotRequest) -> None:
        log_request(self.requestFactory, request)


class GorgeSite(server.Site):
    """A Site whose only access log is our structured ``REQUEST`` line, and
    which can drain: see :meth:`drain`."""

    # A plain HTTP/1.1 channel in place of Twisted's HTTP/2-negotiating wrapper.
    protocol = GorgeChannel  # type: ignore[assignment]

    #: Set by :func:`build_site` when the service has hot routes.
    hot_routes: HotRoutes | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.draining = False
        self._closed: dict[GorgeChannel, Deferred] = {}
        self._connections = InFlight()

    def log(self, request: Any) -> None:
        pass

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def connection_opened(self, channel: GorgeChannel) -> None:
        closed: Deferred = Deferred()
        self._closed[channel] = closed
        self._connections.track(closed)
        if self.draining:
            channel.finish_and_close()

    def connection_closed(self, channel: GorgeChannel) -> None:
        closed = self._closed.pop(channel, None)
        if closed is not None:
            closed.callback(None)

    def drain(self, timeout: float, clock: IReactorTime) -> Deferred:
        """Finish the requests that have already arrived, then close.

        Call it once the listener no longer accepts. A connection with no
        request in progress closes at once; one whose request has begun to
        arrive (even with most of its body still to come) is read to the end,
        answered and then closed. Fires True once every connection has
        closed, which means every answer has left the process, or False after
        ``timeout`` seconds (the reactor's shutdown then drops what is left).
        """
        self.draining = True
        for channel in list(self._closed):
            channel.finish_and_close()
        return self._connections.drain(timeout, clock)


def build_site(
    *,
    api_resource: Resource,
    prefix: str,
    token: str,
    body_limit: int,
    readiness: Callable[[], Coroutine[Any, Any, str | None]],
    registry: CollectorRegistry,
    clock: IReactorTime,
    access_log: bool = True,
    quiet_paths: frozenset[bytes] = frozenset(),
    debug_log: bool = False,
    hot_routes: dict[bytes, Handler] | None = None,
    fast: bool = True,
    about: About | None = None,
) -> server.Site:
    """The one Site a service listens with (or hands to :func:`stub_client`).

    ``access_log`` False leaves out the per-request ``REQUEST`` line (for a
    log level that would drop it); ``REQUEST_FAILED`` is always written.
    A request to one of ``quiet_paths`` answered below 400 is routine traffic:
    its ``REQUEST`` line is a debug line, written only when ``debug_log``
    says the level lets debug lines through.

    ``hot_routes`` (exact POST paths under ``prefix``, each with its handler)
    are answered by :class:`GorgeHotChannel` while a connection carries only
    plain requests to them, and by :class:`DirectRoutes` in front of
    ``api_resource`` once it carries anything else. ``fast`` False
    (``GORGE_HTTP_FAST=off``) leaves every request to twisted.web's channel:
    the hot routes are then answered by :class:`DirectRoutes` alone, with the
    same answers. ``about`` is what ``GET <prefix>version`` answers
    (gorge/web/version.py); without it the path is the API's like any other."""
    url_map = klein_url_map(api_resource)

    def allowed_methods(path: bytes) -> list[str]:
        methods: list[str] = ["POST"] if hot_routes and path in hot_routes else []
        if url_map is not None:
            methods += url_map.bind("localhost").allowed_methods(path.decode("utf-8", "replace"))
        return methods

    api_resource = Utf8Only(api_resource)
    if hot_routes:
        api_resource = DirectRoutes(hot_routes, api_resource)
    root = GorgeRoot(
        api_resource=api_resource,
        prefix=prefix,
        token=token,
        readiness=readiness,
        registry=registry,
        clock=clock,
        allowed_methods=allowed_methods,
        about=about,
    )
    site = GorgeSite(
        root, requestFactory=_request_factory(body_limit, access_log, quiet_paths, debug_log)
    )
    site.noisy = False
    site.displayTracebacks = False
    if hot_routes:
        outside = [path for path in hot_routes if not path.startswith(root.prefix)]
        if outside:
            raise ValueError(f"hot routes outside the API prefix {prefix}: {outside}")
        site.hot_routes = HotRoutes(hot_routes, token)
        if fast:
            site.protocol = GorgeHotChannel  # type: ignore[assignment]
    return site


def stub_client(site: server.Site) -> Any:
    """A StubTreq that dispatches through ``site``'s request factory.

    StubTreq builds its own Site around the resource; giving it our request
    class keeps the body limit, request ids and access log under test.
    """
    from treq.testing import StubTreq

    stub = StubTreq(site.resource)
    server_factory: Any = stub_server_factory(stub)
    server_factory.requestFactory = site.requestFactory
    server_factory.displayTracebacks = False
    hot_routes = getattr(site, "hot_routes", None)
    if hot_routes is not None and site.protocol is GorgeHotChannel:
        # The hot routes take the same path as on a real connection; treq's
        # Site knows nothing of a drain, so the channel is not tracked.
        server_factory.hot_routes = hot_routes
        server_factory.protocol = type(
            "StubHotChannel",
            (GorgeHotChannel,),
            {"tracked": False, "fallback": staticmethod(server_factory.protocol)},
        )
    return stub
