"""Read-only diagnostics under /api/webhook/: counts, never hook details."""

from __future__ import annotations

from typing import Protocol

from klein import Klein

from gorge.web import add_error_handlers, ok
from gorge.webhook.store import Stats

PREFIX = "/api/webhook/"


class StatsSource(Protocol):
    async def stats(self) -> Stats: ...

    async def hook_total(self) -> int: ...


class WebhookApi:
    app = Klein()

    def __init__(self, store: StatsSource) -> None:
        self._store = store

    @app.route("/api/webhook/stats", methods=["GET"], strict_slashes=True)
    async def stats(self, request) -> bytes:
        # A database failure propagates to the catch-all: opaque 500, cause in the log.
        counts = await self._store.stats()
        return ok(request, {
            "queuedCount": counts.queued,
            "sentCount": counts.sent,
            "failedCount": counts.failed,
            "activeWebhooks": counts.active_hooks,
        })

    @app.route("/api/webhook/hooks", methods=["GET"], strict_slashes=True)
    async def hooks(self, request) -> bytes:
        return ok(request, {"total": await self._store.hook_total()})

    add_error_handlers(app)

    def resource(self):
        return self.app.resource()
