"""HTTP API of gorge-mailer: the Klein resource that
``gorge.web.site.build_site`` mounts under ``/api/mailer/`` behind the token gate
and the 10 MiB body limit."""

from __future__ import annotations

from klein import Klein
from twisted.python.failure import Failure

from gorge.app.inflight import InFlight
from gorge.log.logger import Logger
from gorge.mailer.dispatcher import Answer, Dispatch, Dispatcher
from gorge.mailer.idempotency import KEY_HEADER, REPLAYED_HEADER, BadKey, KeyedSends, parse_key
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
        running: set[Dispatch] | None = None,
        keyed: KeyedSends | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        #: Sends with an Idempotency-Key; None ignores the header.
        self._keyed = keyed
        self._metrics = metrics
        self._body_limit = body_limit
        self._openapi = OpenApiDocument(__package__)
        self.inflight = inflight if inflight is not None else InFlight()
        #: Running dispatches, so shutdown can cancel what outlives the drain.
        #: A send that arrives during the drain began arriving before it
        #: (the listener no longer accepts, and idle kept-alive connections
        #: are closed), so it is sent like any other.
        self.running: set[Dispatch] = running if running is not None else set()

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
            key = self._key(request)
            parsed = parse_send_body(raw)
        except (BadKey, MessageError) as e:
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
        if key is not None and self._keyed is not None:
            answer = self._dispatcher.refusal(parsed.mailer_keys)
            if answer is None:
                answer = await self._await_keyed(request, key, message, parsed.mailer_keys)
            return self._render(request, answer)
        started = self._dispatcher.start(message, parsed.mailer_keys)
        if isinstance(started, Answer):
            answer = started
        else:
            answer = await self._await_dispatch(request, started)
        return self._render(request, answer)

    def _key(self, request) -> str | None:
        if self._keyed is None:
            return None
        return parse_key(request.requestHeaders.getRawHeaders(KEY_HEADER))

    def _track_answer(self, request):
        """The Deferred that fires when the answer has been written (or the
        client went away): shutdown waits for that, not merely for the send,
        so the last answers are not cut off by the reactor closing
        connections."""
        finished = request.notifyFinish()
        self.inflight.track(finished)
        return finished

    async def _await_keyed(self, request, key: str, message, mailer_keys) -> Answer:
        # No cancellation on disconnect: a keyed send goes on to its end and
        # records its outcome, which the client's retry is then answered with.
        self._track_answer(request).addErrback(lambda failure: None)
        assert self._keyed is not None
        keyed = await self._keyed.send(key, message, mailer_keys)
        if keyed.replayed:
            request.setHeader(REPLAYED_HEADER, b"true")
        return keyed.answer

    async def _await_dispatch(self, request, dispatch: Dispatch) -> Answer:
        def disconnected(failure: Failure) -> None:
            dispatch.cancel("client disconnected")

        self._track_answer(request).addErrback(disconnected)
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
        if self._keyed is not None:
            self._keyed.stop_waiting()
        for dispatch in list(self.running):
            dispatch.cancel(reason)

    add_error_handlers(app)
