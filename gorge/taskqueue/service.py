"""gorge-taskqueue: the twistd entry point and the service tree."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry
from twisted.application.service import IService
from twisted.internet.defer import Deferred
from twisted.python import usage

from gorge.app.hangup import ReloadOnHangup
from gorge.app.inflight import InFlight, StopBudget
from gorge.app.poller import Poller
from gorge.app.systemd import SystemdNotifier
from gorge.app.tree import ServiceTree
from gorge.app.twistd import run_make_service
from gorge.db.sqlmetrics import TransactionMetrics
from gorge.db.topology import MasterFollower, repoint
from gorge.log.logger import Logger
from gorge.taskqueue.api import WORKER_PATHS, TaskQueueApi
from gorge.taskqueue.metrics import TaskQueueMetrics
from gorge.taskqueue.settings import TaskQueueSettings, load_taskqueue_settings
from gorge.taskqueue.sqlstore import SqlTaskStore
from gorge.taskqueue.store import TaskStore
from gorge.taskqueue.wakeup import LeaseWaiters
from gorge.web.listener import listener
from gorge.web.site import build_site
from gorge.web.version import About

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

        return make_redis_task_store(settings.redis, reactor, key_prefix=settings.redis_key_prefix)
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
        fields.update(
            mysql_host=m.host,
            mysql_port=m.port,
            mysql_user=m.user,
            mysql_database=m.database,
            mysql_password_set=bool(m.password),
            mysql_max_connections=m.max_connections,
        )
    elif settings.backend == "redis":
        r = settings.redis
        fields.update(
            redis_host=r.host,
            redis_port=r.port,
            redis_db=r.db,
            redis_key_prefix=settings.redis_key_prefix,
            redis_password_set=bool(r.password),
            redis_poolsize=r.poolsize,
        )
    else:
        fields.update(sqlite_path=settings.sqlite_path)
    return fields


class QueueDepth:
    """The stats loop: every interval the queue's counts go into the depth
    gauges and the heads of the queue into the age gauge, and systemd hears
    that the daemon is up and making progress."""

    def __init__(
        self,
        store: TaskStore,
        metrics: TaskQueueMetrics,
        notifier: SystemdNotifier | None,
        interval: float,
        clock,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._notifier = notifier
        self._poller = Poller(self.refresh, interval, clock, "taskqueue_stats")

    def start(self) -> None:
        self._poller.start()

    def stop(self) -> Deferred:
        return self._poller.stop()

    async def refresh(self) -> None:
        try:
            stats = await self._store.stats()
            self._metrics.observe_stats(stats)
            self._metrics.observe_waiting(await self._store.oldest_waiting())
        finally:
            # Listening and the loop has run once: ready, whatever the backend says
            # (readiness of the backend is /readyz's business).
            if self._notifier is not None:
                self._notifier.ready()
                self._notifier.progress()


def build_taskqueue_service(
    settings: TaskQueueSettings,
    reactor,
    *,
    store: TaskStore | None = None,
    notifier: SystemdNotifier | None = None,
) -> ServiceTree:
    """The real constructor; ``makeService`` only wires in the reactor and environment.

    Stops in reverse: stats loop, held lease calls (answered empty at once),
    listener (which answers the requests already received), store calls still
    running, backend; one drain budget for the whole stop. Parts: ``store``,
    ``api``, ``site``, ``listener``,
    ``stats``, ``metrics-registry``, ``settings``.
    """
    if store is None:
        store = make_store(settings, reactor)
    registry = CollectorRegistry()
    metrics = TaskQueueMetrics(registry)
    if isinstance(store, SqlTaskStore):
        registry.register(TransactionMetrics(store.db))
    inflight = InFlight()
    budget = StopBudget(settings.drain_timeout, reactor)
    waiters = LeaseWaiters(
        store.wake_check, reactor, settings.wake_check_ms / 1000.0, now=store.time
    )
    api = TaskQueueApi(store, settings, reactor, metrics, inflight=inflight, waiters=waiters)
    site = build_site(
        api_resource=api.resource(),
        prefix=API_PREFIX,
        token=settings.http.token,
        body_limit=settings.http.body_limit,
        readiness=store.ping,
        registry=registry,
        clock=reactor,
        access_log=settings.http.access_log,
        quiet_paths=WORKER_PATHS,
        debug_log=settings.http.debug_log,
        hot_routes=api.hot_routes(),
        fast=settings.http.fast,
        about=About.of(SERVICE_NAME, "gorge.taskqueue", reactor),
    )
    depth = QueueDepth(store, metrics, notifier, settings.stats_interval, reactor)

    def starting() -> None:
        fields = effective_configuration(settings)
        log.info("TASKQUEUE_STARTING " + " ".join(f"{k}={{{k}}}" for k in fields), **fields)

    def stopping() -> None:
        budget.start()
        if notifier is not None:
            notifier.stopping()

    async def drain() -> None:
        # Store calls whose client went away are still running; the listener's
        # wait for the answers spent part of the budget.
        if not await inflight.drain(budget.remaining(), reactor):
            log.warn("TASKQUEUE_DRAIN_ABANDONED pending={pending}", pending=len(inflight))

    async def close_store() -> None:
        await store.close()
        log.info("TASKQUEUE_STOPPED")

    tree = ServiceTree(SERVICE_NAME)
    # The configuration is announced before anything starts.
    tree.add("store", start=starting, stop=close_store, part=store)
    tree.add("drain", stop=drain)
    tree.add(
        "listener",
        listener(
            settings.http.endpoint,
            site,
            drain_timeout=settings.drain_timeout,
            clock=reactor,
            tls=settings.http.tls,
        ),
    )
    tree.add("held-leases", stop=waiters.close, part=waiters)
    tree.add("stats", start=depth.start, stop=depth.stop, part=depth)
    if settings.topology is not None and isinstance(store, SqlTaskStore):
        db = store.db
        follower = MasterFollower(
            settings.topology,
            settings.mysql,
            [lambda moved: repoint(db, moved, reactor)],
            name="taskqueue",
        )
        tree.add("topology", ReloadOnHangup(follower.reload, reactor, name="mysql-topology-reload"))
        tree.keep("master-follower", follower)
    # First to stop: the budget's clock starts with the stop.
    tree.add("stopping", stop=stopping)
    tree.keep("api", api)
    tree.keep("site", site)
    tree.keep("metrics-registry", registry)
    tree.keep("settings", settings)
    return tree


def makeService(options: Options) -> IService:
    def build() -> IService:
        from twisted.internet import reactor  # the one place we touch it

        settings = load_taskqueue_settings(os.environ, listen=options["listen"])
        for warning in settings.warnings:
            log.warn("TASKQUEUE_CONFIG_WARNING warning={warning}", warning=warning)
        return build_taskqueue_service(
            settings, reactor, notifier=SystemdNotifier(os.environ, reactor)
        )

    return run_make_service(SERVICE_NAME, build, options=options)
