"""The ``/api/queue`` routes, over one TaskStore."""

from __future__ import annotations

import re
from typing import Any

from klein import Klein
from twisted.internet.defer import CancelledError
from twisted.internet.interfaces import IReactorTime
from twisted.logger import LogLevel
from twisted.web.resource import Resource

from gorge.app.inflight import InFlight
from gorge.log.logger import Logger
from gorge.taskqueue.metrics import TaskQueueMetrics
from gorge.taskqueue.model import (
    DEFAULT_LIST_LIMIT,
    MAX_FOLLOWUPS,
    MAX_LEASE_LIMIT,
    MAX_LIST_LIMIT,
    MAX_OWNER_CHARS,
    MAX_PHID_BYTES,
    MAX_REPORTS,
    MAX_TASK_CLASS_CHARS,
    PRIORITY_DEFAULT,
    REPORT_COMPLETE,
    REPORT_FAIL,
    REPORT_OUTCOMES,
    RESULT_NAMES,
    UINT32_MAX,
    YIELD_OWNER,
    ArchivedTask,
    Completion,
    EnqueueRequest,
    Followup,
    InvalidArgument,
    Report,
    Task,
)
from gorge.taskqueue.settings import TaskQueueSettings
from gorge.taskqueue.store import LeaseConflict, TaskNotFound, TaskStateError, TaskStore
from gorge.taskqueue.wakeup import MAX_WAIT, LeaseWaiters
from gorge.web.envelope import ApiError, add_error_handlers, ok, read_json_object
from gorge.web.openapi import OpenApiDocument
from gorge.web.site import Handler

log = Logger()

INT64_MAX = 2**63 - 1
_MISSING = object()


def _bad(message: str) -> ApiError:
    return ApiError(400, "ERR_BAD_REQUEST", message)


def _not_found() -> ApiError:
    return ApiError(404, "ERR_NOT_FOUND", "task not found")


LEASE_CONFLICT = "ERR_LEASE_CONFLICT"

#: A worker's routine calls, several per second per worker: their successful
#: answers are logged at debug, not info (docs/taskqueue.md, Logs).
WORKER_PATHS = frozenset(
    {
        b"/api/queue/lease",
        b"/api/queue/renew",
        b"/api/queue/report",
        b"/api/queue/complete",
        b"/api/queue/fail",
        b"/api/queue/yield",
    }
)
TASK_STATE = "ERR_TASK_STATE"


def _api_error(e: Exception) -> ApiError:
    """The answer to a store's domain error."""
    if isinstance(e, TaskNotFound):
        return _not_found()
    if isinstance(e, LeaseConflict):
        return ApiError(409, LEASE_CONFLICT, "task lease no longer belongs to this owner")
    if isinstance(e, TaskStateError):
        return ApiError(409, TASK_STATE, e.message)
    if isinstance(e, InvalidArgument):
        return _bad(e.message)
    raise TypeError(f"not a domain error: {e!r}")


def _refused(task_id: Any, e: ApiError) -> dict:
    """A batched entry's refusal: what its single call would have answered."""
    return {"taskID": task_id, "status": "refused", "code": e.code, "message": e.message}


def _is_int(value: Any) -> bool:
    # bool is an int subclass; JSON true must not pass as 1.
    return isinstance(value, int) and not isinstance(value, bool)


def _opt(body: dict, key: str) -> Any:
    value = body.get(key, _MISSING)
    return _MISSING if value is None else value


def _int_field(
    body: dict, key: str, default: Any, *, minimum: int | None = 0, maximum: int = UINT32_MAX
) -> Any:
    value = _opt(body, key)
    if value is _MISSING:
        return default
    if not _is_int(value):
        raise _bad(f"{key} must be an integer")
    if minimum is not None and value < minimum:
        raise _bad(f"{key} must be >= {minimum}")
    if value > maximum:
        raise _bad(f"{key} must be <= {maximum}")
    return value


def _str_field(body: dict, key: str, default: Any) -> Any:
    value = _opt(body, key)
    if value is _MISSING:
        return default
    if not isinstance(value, str):
        raise _bad(f"{key} must be a string")
    return value


def _task_id(body: dict) -> int:
    value = _opt(body, "taskID")
    if value is _MISSING:
        raise _bad("taskID is required")
    if not _is_int(value):
        raise _bad("taskID must be an integer")
    if value <= 0:
        raise _bad("taskID is required")
    if value > INT64_MAX:
        raise _bad("invalid task ID")
    return value


def _id_list(body: dict, key: str, maximum: int = MAX_LEASE_LIMIT) -> list[int]:
    """A required, non-empty list of at most ``maximum`` integer task ids."""
    ids = _opt(body, key)
    if ids is _MISSING or ids == []:
        raise _bad(f"{key} is required")
    if not isinstance(ids, list) or not all(_is_int(i) for i in ids):
        raise _bad(f"{key} must be a list of integers")
    if len(ids) > maximum:
        raise _bad(f"{key} must have at most {maximum} ids")
    return ids


def _phid(body: dict, key: str) -> str | None:
    value = _str_field(body, key, "")
    if len(value.encode("utf-8")) > MAX_PHID_BYTES:
        raise _bad(f"{key} must be at most {MAX_PHID_BYTES} bytes")
    return value or None


def parse_enqueue(body: dict) -> EnqueueRequest:
    task_class = _str_field(body, "taskClass", "")
    if task_class == "":
        raise _bad("taskClass is required")
    if len(task_class) > MAX_TASK_CLASS_CHARS:
        raise _bad(f"taskClass must be at most {MAX_TASK_CLASS_CHARS} characters")
    data = _str_field(body, "data", "")
    priority = _int_field(body, "priority", PRIORITY_DEFAULT)
    object_phid = _phid(body, "objectPHID")
    container_phid = _phid(body, "containerPHID")
    delay = _int_field(body, "delayUntil", 0)
    return EnqueueRequest(
        task_class=task_class,
        data=data,
        priority=priority,
        object_phid=object_phid,
        container_phid=container_phid,
        delay_until=delay if delay > 0 else None,
    )


def parse_followups(body: dict) -> tuple[Followup, ...]:
    """A success report's follow-up tasks (docs/taskqueue.md, Follow-up
    tasks): each entry validated exactly as an enqueue, a bad one answered
    with its index, so nothing is archived for a list that cannot be stored."""
    items = _opt(body, "followups")
    if items is _MISSING:
        return ()
    if not isinstance(items, list):
        raise _bad("followups must be a list of objects")
    if len(items) > MAX_FOLLOWUPS:
        raise _bad(f"followups must have at most {MAX_FOLLOWUPS} entries, got {len(items)}")
    followups = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise _bad(f"followups[{index}] must be an object")
        try:
            request = parse_enqueue(item)
        except ApiError as e:
            raise _bad(f"followups[{index}]: {e.message}") from None
        # No priority (or null): the parent's, which only the store reads.
        inherits = _opt(item, "priority") is _MISSING
        followups.append(Followup(request, inherits_priority=inherits))
    return tuple(followups)


def _permanent(body: dict) -> bool:
    permanent = _opt(body, "permanent")
    if permanent is _MISSING:
        return False
    if not isinstance(permanent, bool):
        raise _bad("permanent must be a boolean")
    return permanent


def parse_report(item: Any, retry_wait: int) -> Report:
    """One entry of a batched report: the fields its single call takes."""
    if not isinstance(item, dict):
        raise _bad("each report must be an object")
    task_id = _task_id(item)
    outcome = _opt(item, "outcome")
    if outcome not in REPORT_OUTCOMES:
        raise _bad("outcome must be one of " + ", ".join(REPORT_OUTCOMES))
    if outcome == REPORT_COMPLETE:
        duration = _int_field(item, "duration", 0, maximum=INT64_MAX)
        return Report(task_id, outcome, duration=duration, followups=parse_followups(item))
    if outcome == REPORT_FAIL:
        permanent = _permanent(item)
        wait = _int_field(item, "retryWait", retry_wait)
        _str_field(item, "message", "")
        return Report(task_id, outcome, permanent=permanent, retry_wait=wait)
    return Report(task_id, outcome, duration=_int_field(item, "duration", 0, minimum=None))


def parse_wait(body: dict) -> float:
    """Seconds a lease call may be held while nothing is runnable (0: answer at once)."""
    value = _opt(body, "wait")
    if value is _MISSING:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad("wait must be a number of seconds")
    if not 0 <= value <= MAX_WAIT:
        raise _bad(f"wait must be between 0 and {MAX_WAIT} seconds")
    return float(value)


def parse_task_classes(body: dict) -> list[str] | None:
    value = _opt(body, "taskClasses")
    if value is _MISSING:
        return None
    if not isinstance(value, list):
        raise _bad("taskClasses must be a list of strings")
    for item in value:
        if not isinstance(item, str):
            raise _bad("taskClasses must be a list of strings")
    return value or None


def _header(request, name: bytes) -> str:
    raw = request.getHeader(name)
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else (raw or "")


def fence_owner(request, body: dict) -> str | None:
    """The lease owner a result report is fenced by, or None (unfenced, r4).

    Given as the ``X-Lease-Owner`` header (as on lease) or the ``leaseOwner``
    body field; empty counts as absent.  Both given and different is a
    client bug worth a 400 rather than a guess.
    """
    header = _header(request, b"x-lease-owner")
    field = _str_field(body, "leaseOwner", "")
    if header and field and header != field:
        raise _bad("leaseOwner and X-Lease-Owner name different owners")
    owner = field or header
    if len(owner) > MAX_OWNER_CHARS:
        raise _bad(f"leaseOwner must be at most {MAX_OWNER_CHARS} characters")
    return owner or None


_DECIMAL = re.compile(rb"[+-]?[0-9]+")


def _query_int(request, name: bytes) -> int | None:
    """An optional sign and ASCII digits, as the reference's Atoi reads them;
    anything else (``1_0``, surrounding spaces) is unparsable."""
    values = request.args.get(name)
    if not values or not _DECIMAL.fullmatch(values[0]):
        return None
    return int(values[0], 10)


# Result names and Phorge's numbers alike.
_RESULTS = {**RESULT_NAMES, **{str(v): v for v in RESULT_NAMES.values()}}


def _query_text(request, name: bytes) -> str | None:
    values = request.args.get(name)
    if not values:
        return None
    try:
        return values[0].decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(f"{name.decode()} must be UTF-8") from None


def _page(request) -> tuple[int, int]:
    """``limit`` (absent/unparsable/<= 0: 100, at most 1000) and ``offset``
    (absent/unparsable/negative: 0) of a list endpoint."""
    limit = _query_int(request, b"limit")
    if limit is None or limit <= 0:
        limit = DEFAULT_LIST_LIMIT
    limit = min(limit, MAX_LIST_LIMIT)
    offset = _query_int(request, b"offset")
    offset = 0 if offset is None or offset < 0 else min(offset, INT64_MAX)
    return limit, offset


def _path_id(text: str) -> int:
    """A task id in a path: base-10 64-bit with an optional sign, as the
    reference's ParseInt reads it (400 otherwise); ids no column can hold are
    simply not found."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not (digits.isascii() and digits.isdigit()):
        raise _bad("invalid task ID")
    parsed = int(text, 10)
    if not -(2**63) <= parsed <= INT64_MAX:
        raise _bad("invalid task ID")
    if not 0 < parsed <= UINT32_MAX:
        raise _not_found()
    return parsed


class TaskQueueApi:
    """Routes under ``/api/queue``; auth, body limit and probes are the Site's."""

    app = Klein()
    # Paths match exactly: werkzeug would otherwise answer a doubled
    # slash with a redirect. Set before any route binds to the map.
    app.url_map.merge_slashes = False

    def __init__(
        self,
        store: TaskStore,
        settings: TaskQueueSettings,
        clock: IReactorTime,
        metrics: TaskQueueMetrics,
        *,
        inflight: InFlight | None = None,
        waiters: LeaseWaiters | None = None,
    ) -> None:
        self._store = store
        self._settings = settings
        self._clock = clock
        self._metrics = metrics
        self._inflight = inflight if inflight is not None else InFlight()
        self._openapi = OpenApiDocument(__package__)
        self._waiters = waiters if waiters is not None else LeaseWaiters(None, clock)

    def hot_routes(self) -> dict[bytes, Handler]:
        """A worker's calls and enqueue by exact path, for the site to take
        before Klein (:func:`gorge.web.site.build_site`)."""
        return {
            b"/api/queue/enqueue": self.enqueue,
            b"/api/queue/lease": self.lease,
            b"/api/queue/complete": self.complete,
            b"/api/queue/fail": self.fail,
            b"/api/queue/yield": self.yield_,
            b"/api/queue/cancel": self.cancel,
            b"/api/queue/report": self.report,
            b"/api/queue/awaken": self.awaken,
        }

    def resource(self) -> Resource:
        return self.app.resource()

    async def _call(self, operation: str, coro) -> Any:
        """Run a store call: domain errors become 4xx, backend failures the opaque 500."""
        # Tracked so that shutdown waits for store calls already under way.
        # Awaited in place: a Deferred of its own would cost every request
        # a second coroutine runner.
        finished = self._inflight.begin()
        try:
            return await coro
        except (TaskNotFound, LeaseConflict, TaskStateError, InvalidArgument) as e:
            raise _api_error(e) from None
        except (ApiError, CancelledError):
            # Cancelled: the client went away and took its request with it;
            # nothing broke in the backend.
            raise
        except Exception as e:
            log.failure(
                "TASKQUEUE_BACKEND_FAILED operation={operation} error={error}",
                operation=operation,
                error=type(e).__name__,
                level=LogLevel.error,
            )
            raise ApiError(500, "ERR_INTERNAL", "internal server error") from None
        finally:
            finished.callback(None)

    def _enqueued(self, children: tuple[Task, ...]) -> None:
        """Count and announce the follow-ups a complete inserted."""
        for task in children:
            self._metrics.enqueued.labels(task.task_class).inc()
            self._runnable(task)

    def _runnable(self, task: Task) -> None:
        """Wake held lease calls if ``task`` can be leased now."""
        expires = task.lease_expires
        if expires is None or expires < int(self._clock.seconds()):
            self._waiters.notify(task.task_class)

    @app.route("/api/queue/enqueue", methods=["POST"])
    async def enqueue(self, request):
        enqueue = parse_enqueue(read_json_object(request))
        task: Task = await self._call("enqueue", self._store.enqueue(enqueue))
        self._metrics.enqueued.labels(task.task_class).inc()
        self._runnable(task)
        return ok(request, task.to_json())

    @app.route("/api/queue/lease", methods=["POST"])
    async def lease(self, request):
        body = read_json_object(request)
        limit = _int_field(body, "limit", 1, minimum=None, maximum=2**63)
        limit = min(max(limit, 1), MAX_LEASE_LIMIT)
        classes = parse_task_classes(body)
        wait = parse_wait(body)
        owner = self._owner(request)
        deadline = self._clock.seconds() + wait
        while True:
            # Taken before the lease: a wake-up during it means lease again.
            seen = self._waiters.generation
            tasks = await self._lease_once(owner, limit, classes)
            left = deadline - self._clock.seconds()
            if tasks or left <= 0 or not await self._waiters.wait(classes, left, seen):
                break
        return ok(request, [task.to_json() for task in tasks])

    async def _lease_once(self, owner: str, limit: int, classes: list[str] | None) -> list[Task]:
        started = self._clock.seconds()
        tasks: list[Task] = await self._call(
            "lease", self._store.lease(owner, limit, self._settings.lease_duration, classes)
        )
        self._metrics.lease_seconds.observe(max(0.0, self._clock.seconds() - started))
        for task in tasks:
            self._metrics.leased.labels(task.task_class).inc()
        return tasks

    def _owner(self, request) -> str:
        owner = _header(request, b"x-lease-owner")
        if owner == "":
            host = getattr(request.getClientAddress(), "host", "") or "unknown"
            owner = f"{host}:gorge-taskqueue"
        # The column is VARCHAR(64): refuse rather than let the database cut it,
        # which would strand the claimed rows.
        if len(owner) > MAX_OWNER_CHARS:
            raise _bad(f"leaseOwner must be at most {MAX_OWNER_CHARS} characters")
        return owner

    @app.route("/api/queue/complete", methods=["POST"])
    async def complete(self, request):
        body = read_json_object(request)
        task_id = _task_id(body)
        # The column is BIGINT UNSIGNED, but SQLite integers are signed 64-bit:
        # one limit for every backend keeps them answering alike.
        duration = _int_field(body, "duration", 0, maximum=INT64_MAX)
        followups = parse_followups(body)
        owner = fence_owner(request, body)
        done: Completion = await self._call(
            "complete", self._store.complete_with_followups(task_id, duration, followups, owner)
        )
        self._metrics.completed.labels(done.archived.task_class).inc()
        self._enqueued(done.children)
        # A replay answers the same row, so a worker sending again learns
        # nothing new and nothing is inserted twice.
        return ok(request, done.archived.to_json())

    @app.route("/api/queue/fail", methods=["POST"])
    async def fail(self, request):
        body = read_json_object(request)
        task_id = _task_id(body)
        permanent = _permanent(body)
        retry_wait = _int_field(body, "retryWait", self._settings.retry_wait)
        _str_field(body, "message", "")
        owner = fence_owner(request, body)
        result = await self._call("fail", self._store.fail(task_id, permanent, retry_wait, owner))
        task_class = getattr(result, "task_class", "")
        self._metrics.failed.labels(task_class, "true" if permanent else "false").inc()
        return ok(request, {"status": "ok"})

    @app.route("/api/queue/yield", methods=["POST"])
    async def yield_(self, request):
        body = read_json_object(request)
        task_id = _task_id(body)
        # Below the 5 s minimum (negative included) is raised to it by the store.
        duration = _int_field(body, "duration", 0, minimum=None)
        owner = fence_owner(request, body)
        await self._call("yield", self._store.yield_(task_id, duration, owner))
        return ok(request, {"status": "ok"})

    @app.route("/api/queue/report", methods=["POST"])
    async def report(self, request):
        """Many result reports in one call and one transaction (docs/taskqueue.md,
        Batched reports); each answered as its single call would be."""
        body = read_json_object(request)
        items = _opt(body, "reports")
        if items is _MISSING or items == []:
            raise _bad("reports is required")
        if not isinstance(items, list):
            raise _bad("reports must be a list")
        if len(items) > MAX_REPORTS:
            raise _bad(f"reports must have at most {MAX_REPORTS} entries")
        owner = fence_owner(request, body)
        answer: list[dict | None] = [None] * len(items)
        reports: list[Report] = []
        positions: list[int] = []
        for position, item in enumerate(items):
            try:
                reports.append(parse_report(item, self._settings.retry_wait))
            except ApiError as e:
                task_id = item.get("taskID") if isinstance(item, dict) else None
                answer[position] = _refused(task_id, e)
                continue
            positions.append(position)
        results = await self._call("report", self._store.report(reports, owner)) if reports else []
        for position, report, result in zip(positions, reports, results, strict=True):
            if result.error is not None:
                answer[position] = _refused(report.task_id, _api_error(result.error))
                continue
            answer[position] = {"taskID": report.task_id, "status": "reported"}
            if report.outcome == REPORT_COMPLETE:
                self._metrics.completed.labels(result.task_class).inc()
                self._enqueued(result.children)
            elif report.outcome == REPORT_FAIL:
                self._metrics.failed.labels(
                    result.task_class, "true" if report.permanent else "false"
                ).inc()
        return ok(request, answer)

    @app.route("/api/queue/renew", methods=["POST"])
    async def renew(self, request):
        body = read_json_object(request)
        ids = _id_list(body, "taskIDs")
        owner = fence_owner(request, body)
        if owner is None:
            raise _bad("leaseOwner is required (X-Lease-Owner header or leaseOwner field)")
        if owner == YIELD_OWNER:
            raise _bad(f"leaseOwner {YIELD_OWNER} holds no lease")
        limit = self._settings.lease_duration
        duration = _int_field(body, "duration", limit, minimum=1, maximum=limit)
        # Ids outside the column's range cannot name a task: lost, like unknown ones.
        valid = [i for i in ids if 0 < i <= UINT32_MAX]
        renewed = (
            await self._call("renew", self._store.renew(owner, valid, duration)) if valid else {}
        )
        answer = []
        for task_id in dict.fromkeys(ids):
            expires = renewed.get(task_id)
            if expires is None:
                answer.append({"taskID": task_id, "status": "lost"})
            else:
                answer.append({"taskID": task_id, "status": "renewed", "leaseExpires": expires})
            self._metrics.renewals.labels("lost" if expires is None else "renewed").inc()
        return ok(request, answer)

    @app.route("/api/queue/cancel", methods=["POST"])
    async def cancel(self, request):
        task_id = _task_id(read_json_object(request))
        archived: ArchivedTask = await self._call("cancel", self._store.cancel(task_id))
        self._metrics.cancelled.labels(archived.task_class).inc()
        return ok(request, archived.to_json())

    @app.route("/api/queue/awaken", methods=["POST"])
    async def awaken(self, request):
        body = read_json_object(request)
        ids = _opt(body, "taskIDs")
        if ids is _MISSING or ids == []:
            raise _bad("taskIDs is required")
        if not isinstance(ids, list) or not all(_is_int(i) for i in ids):
            raise _bad("taskIDs must be a list of integers")
        # Ids outside the column's range cannot name a task; drop them here.
        ids = [i for i in ids if 0 < i <= UINT32_MAX]
        count = await self._call("awaken", self._store.awaken(ids)) if ids else 0
        if count:
            self._waiters.notify()
        return ok(request, {"awakened": count})

    @app.route("/api/queue/openapi.json", methods=["GET"])
    def openapi(self, request):
        return self._openapi.render(request)

    @app.route("/api/queue/stats", methods=["GET"])
    async def stats(self, request):
        stats = await self._call("stats", self._store.stats())
        self._metrics.observe_stats(stats)
        return ok(request, stats.to_json())

    @app.route("/api/queue/tasks", methods=["GET"])
    async def list_tasks(self, request):
        limit, offset = _page(request)
        tasks = await self._call("list", self._store.list_tasks(limit, offset))
        return ok(request, [task.without_data().to_json() for task in tasks])

    @app.route("/api/queue/tasks/<string:task_id>", methods=["GET"])
    async def get_task(self, request, task_id: str):
        task = await self._call("get", self._store.get_task(_path_id(task_id)))
        return ok(request, task.to_json())

    # -- operator verbs (docs/taskqueue.md, Operator verbs) ----------------------

    async def _operated(self, verb: str, coro) -> Any:
        task: Task = await self._call(verb, coro)
        log.info(
            "TASK_" + verb.upper() + " task_id={task_id} task_class={task_class}",
            task_id=task.id,
            task_class=task.task_class,
        )
        if task.lease_owner is None:
            self._runnable(task)
        return task.to_json()

    @app.route("/api/queue/delay", methods=["POST"])
    async def delay(self, request):
        body = read_json_object(request)
        task_id = _task_id(body)
        if _opt(body, "until") is _MISSING:
            raise _bad("until is required")
        until = _int_field(body, "until", 0)
        return ok(request, await self._operated("delayed", self._store.delay(task_id, until)))

    @app.route("/api/queue/priority", methods=["POST"])
    async def priority(self, request):
        body = read_json_object(request)
        task_id = _task_id(body)
        if _opt(body, "priority") is _MISSING:
            raise _bad("priority is required")
        priority = _int_field(body, "priority", PRIORITY_DEFAULT)
        return ok(
            request,
            await self._operated("reprioritized", self._store.set_priority(task_id, priority)),
        )

    @app.route("/api/queue/free", methods=["POST"])
    async def free(self, request):
        task_id = _task_id(read_json_object(request))
        return ok(request, await self._operated("freed", self._store.free(task_id)))

    @app.route("/api/queue/retry", methods=["POST"])
    async def retry(self, request):
        body = read_json_object(request)
        task_id = _task_id(body)
        repeat = _opt(body, "repeat")
        if repeat is _MISSING:
            repeat = False
        elif not isinstance(repeat, bool):
            raise _bad("repeat must be a boolean")
        return ok(request, await self._operated("retried", self._store.retry(task_id, repeat)))

    # -- dead tasks (docs/taskqueue.md, Dead tasks) -----------------------------

    @app.route("/api/queue/archived", methods=["GET"])
    async def list_archived(self, request):
        limit, offset = _page(request)
        name = _query_text(request, b"result")
        if name and name not in _RESULTS:
            raise _bad("result must be success, failure or cancelled")
        result = _RESULTS[name] if name else None
        task_class = _query_text(request, b"class") or None
        rows = await self._call(
            "archived", self._store.list_archived(result, task_class, limit, offset)
        )
        return ok(request, [row.to_json() for row in rows])

    @app.route("/api/queue/archived/<string:task_id>", methods=["GET"])
    async def get_archived(self, request, task_id: str):
        row = await self._call("archived", self._store.get_archived(_path_id(task_id)))
        if row is None:
            raise _not_found()
        return ok(request, row.to_json())

    @app.route("/api/queue/requeue", methods=["POST"])
    async def requeue(self, request):
        ids = _id_list(read_json_object(request), "taskIDs")
        answer = []
        for task_id in dict.fromkeys(ids):
            try:
                if not 0 < task_id <= UINT32_MAX:
                    raise _not_found()
                task = await self._call("requeue", self._store.requeue(task_id))
            except ApiError as e:
                if e.status >= 500:
                    raise
                answer.append(
                    {"taskID": task_id, "status": "refused", "code": e.code, "message": e.message}
                )
                continue
            self._metrics.requeued.labels(task.task_class).inc()
            self._runnable(task)
            log.info(
                "TASK_REQUEUED task_id={task_id} new_task_id={new_task_id} task_class={task_class}",
                task_id=task_id,
                new_task_id=task.id,
                task_class=task.task_class,
            )
            answer.append({"taskID": task_id, "status": "requeued", "task": task.to_json()})
        return ok(request, answer)

    add_error_handlers(app)
