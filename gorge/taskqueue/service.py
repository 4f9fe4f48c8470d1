"""gorge-taskqueue: the twistd entry point and the service tree."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry
from twisted.application.service import IService
from twisted.logger import Logger
from twisted.python import usage

from gorge.service import (
    DaemonRoot,
    FunctionService,
    InFlight,
    OrderedService,
    Poller,
    StopBudget,
    SystemdNotifier,
    listener,
    run_make_service,
)
from gorge.taskqueue.api import TaskQueueApi
from gorge.taskqueue.metrics import TaskQueueMetrics
from gorge.taskqueue.settings import TaskQueueSettings, load_settings
from gorge.taskqueue.store import TaskStore
from gorge.taskqueue.wakeup import LeaseWaiters
from gorge.web import build_site

log = Logger()

SERVICE_NAME = "gorge-taskqueue"
API_PREFIX = "/api/queue/"


class Options(usage.Options):
    optParameters = [
        ["listen", None, None, "host:port to listen on, overrides GORGE_LISTEN_ADDR"],
    ]


def make_store(settings: TaskQueueSettings, reactor) -> TaskStore:
    """The configured backend, connecting lazily."""
    if settings.backend == "sqlite":
        from gorge.taskqueue.sqlite import SQLiteTaskStore

        return SQLiteTaskStore.open(settings.sqlite_path, reactor)
    if settings.backend == "redis":
        from gorge.taskqueue.redis import make_redis_task_store

        return make_redis_task_store(settings.redis, reactor,
                                     key_prefix=settings.redis_key_prefix)
    from gorge.taskqueue.mysql import MySQLTaskStore

    return MySQLTaskStore.from_settings(settings.mysql, reactor)


def effective_configuration(settings: TaskQueueSettings) -> dict[str, object]:
    """What start-up logs: every value in effect, for the
    chosen backend only; secrets appear only as whether they are set."""
    fields: dict[str, object] = {
        "backend": settings.backend,
        "listen": settings.http.listen_addr,
        "token_set": bool(settings.http.token),
        "body_limit": settings.http.body_limit,
        "lease_duration": settings.lease_duration,
        "retry_wait": settings.retry_wait,
        "drain_timeout": settings.drain_timeout,
        "stats_interval": settings.stats_interval,
        "wake_check_ms": settings.wake_check_ms,
    }
    if settings.backend == "mysql":
        m = settings.mysql
        fields.update(mysql_host=m.host, mysql_port=m.port, mysql_user=m.user,
                      mysql_database=m.database, mysql_password_set=bool(m.password),
                      mysql_max_connections=m.max_connections)
    elif settings.backend == "redis":
        r = settings.redis
        fields.update(redis_host=r.host, redis_port=r.port, redis_db=r.db,
                      redis_key_prefix=settings.redis_key_prefix,
                      redis_password_set=bool(r.password), redis_poolsize=r.poolsize)
    else:
        fields.update(sqlite_path=settings.sqlite_path)
    return fields


class TaskQueueService(DaemonRoot, OrderedService):
    """Stops in reverse: stats loop, held lease calls (answered empty at
    once), listener (which answers the requests already received), store
    calls still running, backend; one drain budget for the whole stop."""

    def __init__(self, *, settings: TaskQueueSettings, reactor, store: TaskStore,
                 notifier: SystemdNotifier | None) -> None:
        self.settings = settings
        self.store = store
        self.registry = CollectorRegistry()
        self.metrics = TaskQueueMetrics(self.registry)
        self.inflight = InFlight()
        self.notifier = notifier
        self._reactor = reactor
        self._stop_budget = StopBudget(settings.drain_timeout, reactor)
        self.waiters = LeaseWaiters(store.wake_check, reactor, settings.wake_check_ms / 1000.0)
        self.api = TaskQueueApi(store, settings, reactor, self.metrics, inflight=self.inflight,
                                waiters=self.waiters)
        self.site = build_site(
            api_resource=self.api.resource(),
            prefix=API_PREFIX,
            token=settings.http.token,
            body_limit=settings.http.body_limit,
            readiness=store.ping,
            registry=self.registry,
            clock=reactor,
            access_log=settings.http.access_log,
        )
        self.stats_loop = Poller(self._refresh_depth, settings.stats_interval, reactor,
                                 "taskqueue_stats")
        self.listening = listener(settings.http.endpoint, self.site,
                                  drain_timeout=settings.drain_timeout, clock=reactor)
        super().__init__(
            FunctionService(stop=self._close_store, name="store"),
            FunctionService(stop=self._drain, name="drain"),
            self.listening,
            FunctionService(stop=self.waiters.close, name="held-leases"),
            FunctionService(start=self._start_loop, stop=self.stats_loop.stop, name="stats"),
            name=SERVICE_NAME,
        )

    def startService(self) -> None:
        fields = effective_configuration(self.settings)
        log.info("TASKQUEUE_STARTING " + " ".join(f"{k}={{{k}}}" for k in fields), **fields)
        super().startService()

    def stopService(self):
        self._stop_budget.start()
        if self.notifier is not None:
            self.notifier.stopping()
        return super().stopService()

    def _start_loop(self) -> None:
        self.stats_loop.start()

    async def _refresh_depth(self) -> None:
        try:
            stats = await self.store.stats()
            self.metrics.observe_stats(stats)
        finally:
            # Listening and the loop has run once: ready, whatever the backend says
            # (readiness of the backend is /readyz's business).
            if self.notifier is not None:
                self.notifier.ready()
                self.notifier.progress()

    async def _drain(self) -> None:
        # Store calls whose client went away are still running; the listener's
        # wait for the answers spent part of the budget.
        if not await self.inflight.drain(self._stop_budget.remaining(), self._reactor):
            log.warn("TASKQUEUE_DRAIN_ABANDONED pending={pending}", pending=len(self.inflight))

    async def _close_store(self) -> None:
        await self.store.close()
        log.info("TASKQUEUE_STOPPED")


def build_taskqueue_service(settings: TaskQueueSettings, reactor, *, store: TaskStore | None = None,
                            notifier: SystemdNotifier | None = None) -> TaskQueueService:
    """The real constructor; ``makeService`` only wires in the reactor and environment."""
    if store is None:
        store = make_store(settings, reactor)
    return TaskQueueService(settings=settings, reactor=reactor, store=store, notifier=notifier)


def makeService(options: Options) -> IService:
    def build() -> IService:
        from twisted.internet import reactor  # the one place we touch it

        warnings: list[str] = []
        settings = load_settings(os.environ, listen=options["listen"], warnings=warnings)
        for warning in warnings:
            log.warn("CONFIG_WARNING {warning}", warning=warning)
        return build_taskqueue_service(settings, reactor,
                                       notifier=SystemdNotifier(os.environ, reactor))

    return run_make_service(SERVICE_NAME, build, options=options)
