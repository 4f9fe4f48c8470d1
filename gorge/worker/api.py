"""The worker's own API: ``GET /api/worker/stats`` and its OpenAPI document."""

from __future__ import annotations

from collections.abc import Callable

from klein import Klein

from gorge.web.envelope import add_error_handlers, ok
from gorge.web.openapi import OpenApiDocument


class WorkerApi:
    app = Klein()

    def __init__(self, stats: Callable[[], dict]) -> None:
        self._stats = stats
        self._openapi = OpenApiDocument(__package__)

    def resource(self):
        return self.app.resource()

    @app.route("/api/worker/stats", methods=["GET"])
    def stats(self, request):
        return ok(request, self._stats())

    @app.route("/api/worker/openapi.json", methods=["GET"])
    def openapi(self, request):
        return self._openapi.render(request)

    add_error_handlers(app)
