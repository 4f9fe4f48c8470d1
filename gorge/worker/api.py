"""The worker's own API: ``GET /api/worker/stats``."""

from __future__ import annotations

from typing import Callable

from klein import Klein

from gorge.web import add_error_handlers, ok


class WorkerApi:
    app = Klein()

    def __init__(self, stats: Callable[[], dict]) -> None:
        self._stats = stats

    def resource(self):
        return self.app.resource()

    @app.route("/api/worker/stats", methods=["GET"])
    def stats(self, request):
        return ok(request, self._stats())

    add_error_handlers(app)
