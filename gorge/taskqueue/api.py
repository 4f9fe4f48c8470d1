"""The ``/api/queue`` routes, over one TaskStore."""

from __future__ import annotations

from typing import Any

from klein import Klein
from twisted.internet.defer import CancelledError
from twisted.internet.interfaces import IReactorTime
from twisted.logger import LogLevel
from twisted.web.resource import Resource

from gorge.app.inflight import InFlight
from gorge.db import DatabaseReadOnly
from gorge.log.logger import Logger
from gorge.taskqueue.failures import FailureNotes
from gorge.taskqueue.metrics import TaskQueueMetrics
from gorge.taskqueue.model import (
    MAX_LEASE_LIMIT,
    MAX_OWNER_CHARS,
    MAX_REPORTS,
    PRIORITY_DEFAULT,
    REPORT_COMPLETE,
    REPORT_FAIL,
    UINT32_MAX,
    YIELD_OWNER,
    ArchivedTask,
    Completion,
    InvalidArgument,
    Report,
    ReportResult,
    Task,
)
from gorge.taskqueue.requests import (
    INT64_MAX,
    MISSING,
    RESULT_FILTERS,
    bad_request,
    entry_owner,
    fence_owner,
    field,
    id_list,
    int_field,
    int_list,
    lease_seconds_field,
    not_found,
    page,
    parse_enqueue,
    parse_followups,
    parse_leases,
    parse_report,
    parse_task_classes,
    parse_wait,
    path_id,
    permanent_field,
    query_flag,
    query_task_ids,
    query_text,
    str_field,
    task_id_field,
)
from gorge.taskqueue.settings import TaskQueueSettings
from gorge.taskqueue.store import LeaseConflict, TaskNotFound, TaskStateError, TaskStore
from gorge.taskqueue.wakeup import LeaseWaiters
from gorge.web.envelope import ApiError, add_error_handlers, ok, read_json_object
from gorge.web.openapi import OpenApiDocument
from gorge.web.site import Handler

log = Logger()


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
        return not_found()
    if isinstance(e, LeaseConflict):
        return ApiError(409, LEASE_CONFLICT, "task lease no longer belongs to this owner")
    if isinstance(e, TaskStateError):
        return ApiError(409, TASK_STATE, e.message)
    if isinstance(e, InvalidArgument):
        return bad_request(e.message)
    raise TypeError(f"not a domain error: {e!r}")


def _refused(task_id: Any, e: ApiError) -> dict:
    """A batched entry's refusal: what its single call would have answered."""
    return {"taskID": task_id, "status": "refused", "code": e.code, "message": e.message}


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
        failures: FailureNotes | None = None,
    ) -> None:
        self._store = store
        # Each failing task's last error text (Phorge's tables keep none).
        self._failures = failures if failures is not None else FailureNotes(clock)
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
        except DatabaseReadOnly:
            # A demoted master: the call is worth making again once a writable
            # one is back (the database logs the transition, not each call).
            raise ApiError(
                503, "ERR_READ_ONLY", "the database is read-only now; retry later"
            ) from None
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
        limit = int_field(body, "limit", 1, minimum=None, maximum=2**63)
        limit = min(max(limit, 1), MAX_LEASE_LIMIT)
        classes = parse_task_classes(body)
        wait = parse_wait(body)
        seconds = lease_seconds_field(body, self._settings.lease_duration)
        owner = self._owner(request, body)
        deadline = self._clock.seconds() + wait
        while True:
            # Taken before the lease: a wake-up during it means lease again.
            seen = self._waiters.generation
            tasks = await self._lease_once(owner, limit, classes, seconds)
            left = deadline - self._clock.seconds()
            if tasks or left <= 0 or not await self._waiters.wait(classes, left, seen):
                break
        # leaseSeconds: the lease as a duration from the store's now, so a
        # worker keeps its deadline on its own clock, whatever the hosts'
        # clocks say (docs/taskqueue.md, Clocks).
        return ok(request, [{**task.to_json(), "leaseSeconds": seconds} for task in tasks])

    async def _lease_once(
        self, owner: str, limit: int, classes: list[str] | None, seconds: int
    ) -> list[Task]:
        started = self._clock.seconds()
        tasks: list[Task] = await self._call(
            "lease", self._store.lease(owner, limit, seconds, classes)
        )
        self._metrics.lease_seconds.observe(max(0.0, self._clock.seconds() - started))
        for task in tasks:
            self._metrics.leased.labels(task.task_class).inc()
        return tasks

    def _owner(self, request, body: dict) -> str:
        # The header, or the body's leaseOwner (a worker names each lease).
        owner = fence_owner(request, body) or ""
        if owner == "":
            host = getattr(request.getClientAddress(), "host", "") or "unknown"
            owner = f"{host}:gorge-taskqueue"
        # The column is VARCHAR(64): refuse rather than let the database cut it,
        # which would strand the claimed rows.
        if len(owner) > MAX_OWNER_CHARS:
            raise bad_request(f"leaseOwner must be at most {MAX_OWNER_CHARS} characters")
        return owner

    @app.route("/api/queue/complete", methods=["POST"])
    async def complete(self, request):
        body = read_json_object(request)
        task_id = task_id_field(body)
        # The column is BIGINT UNSIGNED, but SQLite integers are signed 64-bit:
        # one limit for every backend keeps them answering alike.
        duration = int_field(body, "duration", 0, maximum=INT64_MAX)
        followups = parse_followups(body)
        owner = fence_owner(request, body)
        done: Completion = await self._call(
            "complete", self._store.complete_with_followups(task_id, duration, followups, owner)
        )
        self._metrics.completed.labels(done.archived.task_class).inc()
        self._enqueued(done.children)
        self._failures.forget(task_id)
        # A replay answers the same row, so a worker sending again learns
        # nothing new and nothing is inserted twice.
        return ok(request, done.archived.to_json())

    @app.route("/api/queue/fail", methods=["POST"])
    async def fail(self, request):
        body = read_json_object(request)
        task_id = task_id_field(body)
        permanent = permanent_field(body)
        retry_wait = int_field(body, "retryWait", self._settings.retry_wait)
        message = str_field(body, "message", "")
        owner = fence_owner(request, body)
        result = await self._call("fail", self._store.fail(task_id, permanent, retry_wait, owner))
        task_class = getattr(result, "task_class", "")
        self._metrics.failed.labels(task_class, "true" if permanent else "false").inc()
        self._failures.note(task_id, task_class, message, permanent)
        return ok(request, {"status": "ok"})

    @app.route("/api/queue/yield", methods=["POST"])
    async def yield_(self, request):
        body = read_json_object(request)
        task_id = task_id_field(body)
        # Below the 5 s minimum (negative included) is raised to it by the store.
        duration = int_field(body, "duration", 0, minimum=None)
        owner = fence_owner(request, body)
        await self._call("yield", self._store.yield_(task_id, duration, owner))
        return ok(request, {"status": "ok"})

    @app.route("/api/queue/report", methods=["POST"])
    async def report(self, request):
        """Many result reports in one call and one transaction (docs/taskqueue.md,
        Batched reports); each answered as its single call would be."""
        body = read_json_object(request)
        items = field(body, "reports")
        if items is MISSING or items == []:
            raise bad_request("reports is required")
        if not isinstance(items, list):
            raise bad_request("reports must be a list")
        if len(items) > MAX_REPORTS:
            raise bad_request(f"reports must have at most {MAX_REPORTS} entries")
        owner = fence_owner(request, body)
        answer: list[dict | None] = [None] * len(items)
        reports: list[Report] = []
        positions: list[int] = []
        owners: list[str | None] = []
        for position, item in enumerate(items):
            try:
                report = parse_report(item, self._settings.retry_wait)
                report_owner = entry_owner(item, owner)
            except ApiError as e:
                task_id = item.get("taskID") if isinstance(item, dict) else None
                answer[position] = _refused(task_id, e)
                continue
            reports.append(report)
            owners.append(report_owner)
            positions.append(position)
        results = await self._report_by_owner(reports, owners)
        for position, report, result in zip(positions, reports, results, strict=True):
            if result.error is not None:
                answer[position] = _refused(report.task_id, _api_error(result.error))
                continue
            answer[position] = {"taskID": report.task_id, "status": "reported"}
            if report.outcome == REPORT_COMPLETE:
                self._metrics.completed.labels(result.task_class).inc()
                self._enqueued(result.children)
                self._failures.forget(report.task_id)
            elif report.outcome == REPORT_FAIL:
                self._metrics.failed.labels(
                    result.task_class, "true" if report.permanent else "false"
                ).inc()
                self._failures.note(
                    report.task_id, result.task_class, report.message, report.permanent
                )
        return ok(request, answer)

    async def _report_by_owner(
        self, reports: list[Report], owners: list[str | None]
    ) -> list[ReportResult]:
        """The store's report, one call per lease owner the entries name (a
        batch carries the tasks of several leases), answered in entry order."""
        groups: dict[str | None, list[int]] = {}
        for index, owner in enumerate(owners):
            groups.setdefault(owner, []).append(index)
        results: list[ReportResult | None] = [None] * len(reports)
        for owner, indexes in groups.items():
            batch = [reports[i] for i in indexes]
            answers = await self._call("report", self._store.report(batch, owner))
            for index, result in zip(indexes, answers, strict=True):
                results[index] = result
        return [result for result in results if result is not None]

    @app.route("/api/queue/renew", methods=["POST"])
    async def renew(self, request):
        body = read_json_object(request)
        # Without an owner (or an empty one), the one a lease call without
        # one was given: a caller that leased without naming itself renews
        # what it leased, as the same call always means the same owner.
        pairs = parse_leases(body, self._owner(request, body))
        for _, owner in pairs:
            if owner == YIELD_OWNER:
                raise bad_request(f"leaseOwner {YIELD_OWNER} holds no lease")
        limit = self._settings.lease_duration
        # Capped like a lease's leaseDuration, not refused: a worker's
        # heartbeat extension works against a queue with a shorter lease.
        duration = min(int_field(body, "duration", limit, minimum=1, maximum=INT64_MAX), limit)
        # Ids outside the column's range cannot name a task: lost, like unknown ones.
        by_owner: dict[str, list[int]] = {}
        for task_id, owner in pairs:
            if 0 < task_id <= UINT32_MAX and owner is not None:
                by_owner.setdefault(owner, []).append(task_id)
        renewed: dict[tuple[int, str], int | None] = {}
        for owner, ids in by_owner.items():
            got = await self._call("renew", self._store.renew(owner, ids, duration))
            for task_id in ids:
                renewed[(task_id, owner)] = got.get(task_id)
        answer = []
        for task_id, owner in dict.fromkeys(pairs):
            expires = renewed.get((task_id, owner)) if owner is not None else None
            entry: dict[str, Any] = {"taskID": task_id}
            if "leases" in body:
                entry["leaseOwner"] = owner
            if expires is None:
                entry["status"] = "lost"
            else:
                # leaseSeconds: as on lease, the renewed lease as a duration.
                entry.update(status="renewed", leaseExpires=expires, leaseSeconds=duration)
            answer.append(entry)
            self._metrics.renewals.labels("lost" if expires is None else "renewed").inc()
        return ok(request, answer)

    @app.route("/api/queue/cancel", methods=["POST"])
    async def cancel(self, request):
        task_id = task_id_field(read_json_object(request))
        archived: ArchivedTask = await self._call("cancel", self._store.cancel(task_id))
        self._metrics.cancelled.labels(archived.task_class).inc()
        return ok(request, archived.to_json())

    @app.route("/api/queue/awaken", methods=["POST"])
    async def awaken(self, request):
        body = read_json_object(request)
        ids = field(body, "taskIDs")
        if ids is MISSING or ids == []:
            raise bad_request("taskIDs is required")
        numbers = int_list(ids)
        if numbers is None:
            raise bad_request("taskIDs must be a list of integers")
        # Ids outside the column's range cannot name a task; drop them here.
        ids = [i for i in numbers if 0 < i <= UINT32_MAX]
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
        # Read live as the counts are: a few index probes (gorge/taskqueue/waiting.py).
        waiting = await self._call("stats", self._store.oldest_waiting())
        self._metrics.observe_waiting(waiting)
        return ok(
            request,
            {**stats.to_json(), "oldestWaiting": waiting.to_json(), "oldestWaitingAt": waiting.now},
        )

    @app.route("/api/queue/tasks", methods=["GET"])
    async def list_tasks(self, request):
        limit, offset = page(request)
        tasks = await self._call("list", self._store.list_tasks(limit, offset))
        return ok(request, [task.without_data().to_json() for task in tasks])

    @app.route("/api/queue/tasks/<string:task_id>", methods=["GET"])
    async def get_task(self, request, task_id: str):
        task = await self._call("get", self._store.get_task(path_id(task_id)))
        return ok(request, task.to_json())

    @app.route("/api/queue/failures", methods=["GET"])
    async def list_failures(self, request):
        """The last error of each task that failed, newest first
        (docs/taskqueue.md, Last errors)."""
        limit, _ = page(request)
        notes = self._failures.recent(
            limit,
            task_ids=query_task_ids(request, b"taskIDs"),
            permanent=query_flag(request, b"permanent"),
        )
        return ok(request, [note.to_json() for note in notes])

    # -- operator verbs (docs/taskqueue.md, Operator verbs) ----------------------

    async def _operated(self, verb: str, coro) -> Any:
        task: Task = await self._call(verb, coro)
        log.info(
            "TASKQUEUE_TASK_" + verb.upper() + " task_id={task_id} task_class={task_class}",
            task_id=task.id,
            task_class=task.task_class,
        )
        if task.lease_owner is None:
            self._runnable(task)
        return task.to_json()

    @app.route("/api/queue/delay", methods=["POST"])
    async def delay(self, request):
        body = read_json_object(request)
        task_id = task_id_field(body)
        if field(body, "until") is MISSING:
            raise bad_request("until is required")
        until = int_field(body, "until", 0)
        return ok(request, await self._operated("delayed", self._store.delay(task_id, until)))

    @app.route("/api/queue/priority", methods=["POST"])
    async def priority(self, request):
        body = read_json_object(request)
        task_id = task_id_field(body)
        if field(body, "priority") is MISSING:
            raise bad_request("priority is required")
        priority = int_field(body, "priority", PRIORITY_DEFAULT)
        return ok(
            request,
            await self._operated("reprioritized", self._store.set_priority(task_id, priority)),
        )

    @app.route("/api/queue/free", methods=["POST"])
    async def free(self, request):
        task_id = task_id_field(read_json_object(request))
        return ok(request, await self._operated("freed", self._store.free(task_id)))

    @app.route("/api/queue/retry", methods=["POST"])
    async def retry(self, request):
        body = read_json_object(request)
        task_id = task_id_field(body)
        repeat = field(body, "repeat")
        if repeat is MISSING:
            repeat = False
        elif not isinstance(repeat, bool):
            raise bad_request("repeat must be a boolean")
        return ok(request, await self._operated("retried", self._store.retry(task_id, repeat)))

    # -- dead tasks (docs/taskqueue.md, Dead tasks) -----------------------------

    @app.route("/api/queue/archived", methods=["GET"])
    async def list_archived(self, request):
        limit, offset = page(request)
        name = query_text(request, b"result")
        if name and name not in RESULT_FILTERS:
            raise bad_request("result must be success, failure or cancelled")
        result = RESULT_FILTERS[name] if name else None
        task_class = query_text(request, b"class") or None
        rows = await self._call(
            "archived", self._store.list_archived(result, task_class, limit, offset)
        )
        return ok(request, [row.to_json() for row in rows])

    @app.route("/api/queue/archived/<string:task_id>", methods=["GET"])
    async def get_archived(self, request, task_id: str):
        row = await self._call("archived", self._store.get_archived(path_id(task_id)))
        if row is None:
            raise not_found()
        return ok(request, row.to_json())

    @app.route("/api/queue/requeue", methods=["POST"])
    async def requeue(self, request):
        ids = id_list(read_json_object(request), "taskIDs")
        answer = []
        for task_id in dict.fromkeys(ids):
            try:
                if not 0 < task_id <= UINT32_MAX:
                    raise not_found()
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
                "TASKQUEUE_TASK_REQUEUED task_id={task_id} new_task_id={new_task_id} "
                "task_class={task_class}",
                task_id=task_id,
                new_task_id=task.id,
                task_class=task.task_class,
            )
            answer.append({"taskID": task_id, "status": "requeued", "task": task.to_json()})
        return ok(request, answer)

    add_error_handlers(app)
