"""HTTP API of gorge-mailer: the Klein resource that
``gorge.web.site.build_site`` mounts under ``/api/mailer/`` behind the token gate
and the 10 MiB body limit."""

from __future__ import annotations

from klein import Klein
from twisted.python.failure import Failure

from gorge.app.inflight import InFlight
from gorge.log.logger import Logger
from gorge.mailer.dispatcher import Answer, Dispatch, Dispatcher
from gorge.mailer.message import MessageError, parse_send_body
from gorge.mailer.metrics import MailerMetrics
from gorge.web.envelope import ApiError, add_error_handlers, fail, ok
from gorge.web.openapi import OpenApiDocument

log = Logger()


class MailerApi:
    app = Klein()

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        metrics: MailerMetrics,
        body_limit: int,
        inflight: InFlight | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._body_limit = body_limit
        self._openapi = OpenApiDocument(__package__)
        self.inflight = inflight if inflight is not None else InFlight()
        #: Running dispatches, so shutdown can cancel what outlives the drain.
        #: A send that arrives during the drain began arriving before it
        #: (the listener no longer accepts, and idle kept-alive connections
        #: are closed), so it is sent like any other.
        self.running: set[Dispatch] = set()

    def resource(self):
        return self.app.resource()

    @app.route("/api/mailer/mailers", methods=["GET"])
    def mailers(self, request):
        return ok(
            request,
            [
                {"key": b.key, "type": b.type, "priority": b.priority}
                for b in self._dispatcher.backends
            ],
        )

    @app.route("/api/mailer/openapi.json", methods=["GET"])
    def openapi(self, request):
        return self._openapi.render(request)

    @app.route("/api/mailer/send", methods=["POST"])
    async def send(self, request):
        raw = request.content.read() if request.content is not None else b""
        try:
            parsed = parse_send_body(raw)
        except MessageError as e:
            self._metrics.requests.labels("ERR_BAD_REQUEST").inc()
            raise ApiError(400, "ERR_BAD_REQUEST", str(e)) from None
        message, truncated = parsed.message.truncated(self._body_limit)
        if truncated:
            self._metrics.truncations.inc(truncated)
            log.info(
                "MAILER_BODY_TRUNCATED bodies={bodies} limit={limit}",
                bodies=truncated,
                limit=self._body_limit,
            )
        started = self._dispatcher.start(message, parsed.mailer_keys)
        if isinstance(started, Answer):
            answer = started
        else:
            answer = await self._await_dispatch(request, started)
        return self._render(request, answer)

    async def _await_dispatch(self, request, dispatch: Dispatch) -> Answer:
        def disconnected(failure: Failure) -> None:
            dispatch.cancel("client disconnected")

        # Fires when the answer has been written (or the client went away):
        # shutdown waits for that, not merely for the dispatch, so the last
        # answers are not cut off by the reactor closing connections.
        finished = request.notifyFinish()
        finished.addErrback(disconnected)
        self.inflight.track(finished)
        self.running.add(dispatch)
        try:
            return await dispatch.result
        finally:
            self.running.discard(dispatch)

    def _render(self, request, answer: Answer) -> bytes:
        self._metrics.requests.labels(answer.code or "OK").inc()
        if answer.code is None:
            data = {"mailerKey": answer.mailer_key}
            if answer.message_id:
                data["messageId"] = answer.message_id
            body = ok(request, data)
        else:
            body = fail(request, answer.status, answer.code, answer.message)
        # A known length spares the chunked terminator, a second small write
        # that Nagle's algorithm would hold back until the client's ACK.
        request.setHeader(b"content-length", str(len(body)).encode("ascii"))
        return body

    def cancel_all(self, reason: str) -> None:
        """Cancel every running dispatch (end of the shutdown drain)."""
        for dispatch in list(self.running):
            dispatch.cancel(reason)

    add_error_handlers(app)
