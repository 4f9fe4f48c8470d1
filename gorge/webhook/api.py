"""The HTTP API under /api/webhook/ (docs/webhook.md, "HTTP API").

Counts (``stats``, ``hooks``), the delivery log (``requests``), replays and
the hooks' breaker state, and the OpenAPI document
(``openapi.json``). Hook URIs and keys never appear in an answer.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from klein import Klein
from werkzeug.routing import BaseConverter

from gorge.web.envelope import ApiError, add_error_handlers, json_integer, ok, read_json_object
from gorge.web.openapi import OpenApiDocument
from gorge.webhook.deliverylog import DeliveryLog, NotReplayable
from gorge.webhook.observation import Stats
from gorge.webhook.rows import FAILED, QUEUED, RESULT_FAIL, RESULT_NONE, RESULT_OKAY, SENT
from gorge.webhook.sitecounts import SiteCounter

PREFIX = "/api/webhook/"

STATUSES = (QUEUED, SENT, FAILED)
RESULTS = (RESULT_NONE, RESULT_OKAY, RESULT_FAIL)
LIST_PARAMETERS = ("cursor", "hook", "limit", "result", "since", "status")
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_ID = 4294967295  # INT UNSIGNED
REPLAY_STATUSES = {"failed": (FAILED,), "sent": (SENT,), "any": (SENT, FAILED)}
RANGE_FIELDS = ("hookPHID", "since", "until", "status", "afterId", "limit")
REQUEST_STATE = "ERR_REQUEST_STATE"

_HOOK_PHID = re.compile(r"PHID-HWBH-[A-Za-z0-9]{1,54}", re.ASCII)
_REQUEST_PHID = re.compile(r"PHID-HWBR-[A-Za-z0-9]{1,54}", re.ASCII)
_DIGITS = re.compile(r"[0-9]{1,20}", re.ASCII)


class StatsSource(Protocol):
    async def stats(self) -> Stats: ...

    async def hook_total(self) -> int: ...


def _bad(message: str) -> ApiError:
    return ApiError(400, "ERR_BAD_REQUEST", message)


def _not_found(text: str) -> ApiError:
    return ApiError(404, "ERR_NOT_FOUND", f"no webhook request {text!r}")


def _integer(name: str, text: str, minimum: int, maximum: int) -> int:
    if not _DIGITS.fullmatch(text):
        raise _bad(f"{name}: not a non-negative integer: {text!r}")
    value = int(text)
    if not minimum <= value <= maximum:
        raise _bad(f"{name}: must be between {minimum} and {maximum}, got {value}")
    return value


def _hook_phid(name: str, value: Any) -> str:
    if not isinstance(value, str) or not _HOOK_PHID.fullmatch(value):
        raise _bad(f"{name}: not a hook PHID (PHID-HWBH-...): {value!r}")
    return value


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise _bad(f"{name}: must be one of {', '.join(choices)}, got {value!r}")
    return value


def _query(request) -> dict[str, str]:
    """The listing's parameters, each at most once; ``token`` is the gate's."""
    params: dict[str, str] = {}
    for key, values in request.args.items():
        name = key.decode("utf-8", "replace")
        if name == "token":
            continue
        if name not in LIST_PARAMETERS:
            raise _bad(f"unknown parameter {name!r} (accepted: {', '.join(LIST_PARAMETERS)})")
        if len(values) != 1:
            raise _bad(f"{name}: give it once")
        params[name] = values[0].decode("utf-8", "replace")
    return params


def _request_ref(text: str) -> int | str:
    """A request id (decimal) or request PHID; anything else names no request: 404."""
    if _DIGITS.fullmatch(text) and 1 <= int(text) <= MAX_ID:
        return int(text)
    if _REQUEST_PHID.fullmatch(text):
        return text
    raise _not_found(text)


def _json_int(body: dict, name: str, default: int | None, minimum: int, maximum: int) -> int:
    value = body.get(name, default)
    if value is None:
        raise _bad(f"{name}: required")
    number = json_integer(value)
    if number is None:
        raise _bad(f"{name}: must be an integer, got {value!r}")
    if not minimum <= number <= maximum:
        raise _bad(f"{name}: must be between {minimum} and {maximum}, got {number}")
    return number


class RequestRef(BaseConverter):
    """One path segment naming a request, never ``retry``: that is the range
    replay's own path, so ``GET /requests/retry`` is a wrong method (405,
    ``Allow: POST``) rather than a look-up of a request called "retry"."""

    regex = r"(?!retry$)[^/]+"


class WebhookApi:
    app = Klein()
    # Set before any route binds to the map.
    app.url_map.converters["ref"] = RequestRef

    def __init__(self, store: StatsSource, deliveries: DeliveryLog, site: SiteCounter) -> None:
        self._store = store
        self._log = deliveries
        self._site = site
        self._openapi = OpenApiDocument(__package__)

    @app.route("/api/webhook/openapi.json", methods=["GET"], strict_slashes=True)
    def openapi(self, request) -> bytes:
        return self._openapi.render(request)

    @app.route("/api/webhook/stats", methods=["GET"], strict_slashes=True)
    async def stats(self, request) -> bytes:
        # A database failure propagates to the catch-all: opaque 500, cause in the log.
        counts = await self._store.stats()
        # The site's figures beside this replica's: the top level stays what
        # it always was, so whatever reads it reads the same.
        site = await self._site.read()
        return ok(
            request,
            {
                "queuedCount": counts.queued,
                "sentCount": counts.sent,
                "failedCount": counts.failed,
                "activeWebhooks": counts.active_hooks,
                "site": {
                    "queuedCount": site.queued,
                    "sentCount": site.sent,
                    "failedCount": site.failed,
                    "activeWebhooks": site.active_hooks,
                    "asOf": site.as_of,
                    "ageSeconds": round(self._site.age(site), 3),
                },
            },
        )

    @app.route("/api/webhook/hooks", methods=["GET"], strict_slashes=True)
    async def hooks(self, request) -> bytes:
        return ok(request, {"total": await self._store.hook_total()})

    @app.route("/api/webhook/hooks/state", methods=["GET"], strict_slashes=True)
    async def hook_states(self, request) -> bytes:
        return ok(request, await self._log.hooks())

    @app.route("/api/webhook/requests", methods=["GET"], strict_slashes=True)
    async def list_requests(self, request) -> bytes:
        params = _query(request)
        limit = (
            _integer("limit", params["limit"], 1, MAX_LIMIT) if "limit" in params else DEFAULT_LIMIT
        )
        cursor = _integer("cursor", params["cursor"], 1, MAX_ID + 1) if "cursor" in params else None
        since = _integer("since", params["since"], 0, MAX_ID) if "since" in params else None
        hook = _hook_phid("hook", params["hook"]) if "hook" in params else None
        status = _choice("status", params["status"], STATUSES) if "status" in params else None
        result = _choice("result", params["result"], RESULTS) if "result" in params else None
        return ok(
            request,
            await self._log.list(
                limit=limit, cursor=cursor, hook=hook, status=status, result=result, since=since
            ),
        )

    @app.route("/api/webhook/requests/retry", methods=["POST"], strict_slashes=True)
    async def retry_range(self, request) -> bytes:
        body = read_json_object(request)
        unknown = sorted(set(body) - set(RANGE_FIELDS))
        if unknown:
            raise _bad(f"unknown field {unknown[0]!r} (accepted: {', '.join(RANGE_FIELDS)})")
        hook = _hook_phid("hookPHID", body.get("hookPHID"))
        since = _json_int(body, "since", None, 0, MAX_ID)
        until = _json_int(body, "until", MAX_ID + 1, since + 1, MAX_ID + 1)
        statuses = REPLAY_STATUSES[
            _choice("status", body.get("status", "failed"), tuple(REPLAY_STATUSES))
        ]
        after_id = _json_int(body, "afterId", 0, 0, MAX_ID)
        limit = _json_int(body, "limit", MAX_LIMIT, 1, MAX_LIMIT)
        return ok(
            request,
            await self._log.replay_range(
                hook=hook,
                since=since,
                until=until,
                statuses=statuses,
                after_id=after_id,
                limit=limit,
            ),
        )

    @app.route("/api/webhook/requests/<ref:ref>", methods=["GET"], strict_slashes=True)
    async def show_request(self, request, ref: str) -> bytes:
        found = await self._log.show(_request_ref(ref))
        if found is None:
            raise _not_found(ref)
        return ok(request, found)

    @app.route("/api/webhook/requests/<ref:ref>/retry", methods=["POST"], strict_slashes=True)
    async def retry_request(self, request, ref: str) -> bytes:
        target = _request_ref(ref)
        raw = request.content.read() if request.content is not None else b""
        if raw.strip():
            request.content.seek(0)
            if read_json_object(request):
                raise _bad("the body must be empty or {}: this call takes no fields")
        try:
            replayed = await self._log.replay(target)
        except NotReplayable as e:
            if e.row.status == QUEUED:
                message = (
                    f"request {e.row.id} is already queued: it will be delivered;"
                    " only sent or failed requests can be retried"
                )
            else:
                message = f"request {e.row.id} changed while it was replayed; try again"
            raise ApiError(409, REQUEST_STATE, message) from None
        if replayed is None:
            raise _not_found(ref)
        return ok(request, replayed)

    add_error_handlers(app)

    def resource(self):
        return self.app.resource()
