"""gorge-mailer's service tree: HTTP listener, send drain, HTTP client pool.

``makeService`` is the twistd entry point; ``build_mailer_service`` is the
real constructor (tests and the demo call it with their own reactor).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from twisted.application.service import IService
from twisted.internet.task import deferLater
from twisted.python import usage

from gorge.app.hangup import ReloadOnHangup
from gorge.app.inflight import InFlight, StopBudget
from gorge.app.poller import Poller
from gorge.app.systemd import SystemdNotifier, watchdog_heartbeat
from gorge.app.tree import ServiceTree
from gorge.app.twistd import run_make_service
from gorge.client.agent import make_agent
from gorge.db.sqlmetrics import TransactionMetrics
from gorge.log.logger import Logger
from gorge.mailer.api import MailerApi
from gorge.mailer.backends import build_backend
from gorge.mailer.backends.base import Backend, Reloadable
from gorge.mailer.dispatcher import Dispatch, Dispatcher
from gorge.mailer.idempotency import PRUNE_INTERVAL, KeyedSends
from gorge.mailer.metrics import MailerMetrics
from gorge.mailer.sendrecords import SendRecords
from gorge.mailer.settings import IdempotencySettings, MailerSettings, load_mailer_settings
from gorge.web.listener import listener
from gorge.web.site import build_site
from gorge.web.version import About

log = Logger()

PREFIX = "/api/mailer/"
CONNECT_TIMEOUT = 5
FLUSH_WAIT = 0.05


class Options(usage.Options):
    optParameters = [
        ["listen", None, None, "listen address host:port, overrides GORGE_LISTEN_ADDR"],
        ["config", "c", None, "JSON config file, overrides GORGE_MAILER_CONFIG_FILE"],
    ]


def makeService(options: Options) -> IService:
    def build() -> IService:
        from twisted.internet import reactor  # the one place we touch it

        settings = load_mailer_settings(
            os.environ, listen=options["listen"], config_file=options["config"]
        )
        notifier = SystemdNotifier(os.environ, reactor)
        return build_mailer_service(settings, reactor, notifier=notifier)

    return run_make_service("gorge-mailer", build, options=options)


def build_mailer_service(
    settings: MailerSettings,
    reactor: Any,
    *,
    notifier: SystemdNotifier | None = None,
    listen: bool = True,
) -> ServiceTree:
    """Build every backend (a ``ConfigError`` here stops start-up) and wire
    the tree. ``listen=False`` leaves out the TCP listener (in-process use
    through ``gorge.web.site.stub_client(service.part("site"))``).

    Parts: ``site``, ``api``, ``dispatcher``, ``keyed-sends`` (None when
    ``GORGE_MAILER_IDEMPOTENCY_STORE=off``), ``metrics-registry``.
    """

    for warning in settings.warnings:
        log.warn("MAILER_CONFIG_WARNING warning={warning}", warning=warning)
    if settings.config_problem:
        log.error("MAILER_CONFIG_INVALID cause={cause}", cause=settings.config_problem)

    # One pool per service; providers share it.
    agent, pool = make_agent(reactor, max_per_host=16, connect_timeout=CONNECT_TIMEOUT)
    backends = [
        build_backend(entry, reactor=reactor, http_client=agent) for entry in settings.entries
    ]
    reloadable = [backend for backend in backends if isinstance(backend, Reloadable)]

    registry = CollectorRegistry()
    metrics = MailerMetrics(registry)
    dispatcher = Dispatcher(
        backends,
        clock=reactor,
        metrics=metrics,
        max_retries=settings.max_retries,
        retry_wait=settings.retry_wait,
        send_timeout=settings.send_timeout,
    )
    inflight = InFlight()
    running: set[Dispatch] = set()
    keyed = _keyed_sends(settings.idempotency, dispatcher, reactor, metrics, inflight, running)
    api = MailerApi(
        dispatcher,
        metrics=metrics,
        body_limit=settings.body_limit,
        inflight=inflight,
        running=running,
        keyed=keyed,
    )

    readiness = _readiness(settings, backends)

    site = build_site(
        api_resource=api.resource(),
        prefix=PREFIX,
        token=settings.http.token,
        body_limit=settings.http.body_limit,
        readiness=readiness,
        registry=registry,
        clock=reactor,
        about=About.of("gorge-mailer", "gorge.mailer", reactor),
    )

    # One budget for the stop: the listener answers the requests already
    # received (a send arrives as one), the drain step waits for sends whose
    # client has gone and cancels what outlives the budget.
    budget = StopBudget(settings.drain_budget, reactor)
    started, stopping = _ready_steps(settings, len(backends), api, budget, notifier)

    tree = ServiceTree("gorge-mailer")
    tree.add("mailer-http-pool", stop=pool.closeCachedConnections)
    if keyed is not None:
        registry.register(_StoreTransactions(keyed))
        # Before the drain, so it stops after it: the last sends record their answers.
        prune_start, prune_stop = _pruning(keyed, reactor)
        tree.add("mailer-idempotency", start=prune_start, stop=prune_stop)
    tree.add("mailer-drain", stop=_drain_step(api, budget, reactor))
    if reloadable:
        tree.add("mailer-reload", _reload_on_hangup(reloadable, reactor))
    if listen:
        tree.add(
            "listener",
            listener(
                settings.http.endpoint,
                site,
                drain_timeout=settings.drain_budget,
                clock=reactor,
                tls=settings.http.tls,
            ),
        )
    tree.add("mailer-ready", start=started, stop=stopping)
    if notifier is not None and notifier.watchdog_interval is not None:
        tree.add("mailer_watchdog", watchdog_heartbeat(notifier, reactor, "mailer_watchdog"))
    tree.keep("site", site)
    tree.keep("api", api)
    tree.keep("dispatcher", dispatcher)
    tree.keep("keyed-sends", keyed)
    tree.keep("metrics-registry", registry)
    return tree


def _keyed_sends(
    settings: IdempotencySettings,
    dispatcher: Dispatcher,
    reactor: Any,
    metrics: MailerMetrics,
    inflight: InFlight,
    running: set[Dispatch],
) -> KeyedSends | None:
    if settings.store == "off":
        return None

    def open_records() -> SendRecords:
        if settings.mysql is not None:
            return SendRecords.mysql(settings.mysql, reactor)
        return SendRecords.sqlite(settings.sqlite_path, reactor)

    return KeyedSends(
        open_records,
        dispatcher,
        clock=reactor,
        metrics=metrics,
        inflight=inflight,
        running=running,
        retention=settings.retention,
        max_entries=settings.max_entries,
    )


class _StoreTransactions(Collector):
    """The idempotency store's ``gorge_sql_*`` metrics, once it is open."""

    def __init__(self, keyed: KeyedSends) -> None:
        self._keyed = keyed

    def collect(self) -> Iterator[Metric]:
        records = self._keyed.opened
        if records is not None:
            yield from TransactionMetrics(records.db).collect()


def _pruning(
    keyed: KeyedSends, reactor: Any
) -> tuple[Callable[[], None], Callable[[], Awaitable[None]]]:
    """The prune loop's start and stop; the stop closes the store too."""
    poller = Poller(keyed.prune, PRUNE_INTERVAL, reactor, "mailer-idempotency-prune")

    def start() -> None:
        poller.start(now=False)

    async def stop() -> None:
        await poller.stop()
        keyed.close()

    return start, stop


def _readiness(
    settings: MailerSettings, backends: list[Backend]
) -> Callable[[], Coroutine[Any, Any, str | None]]:
    async def readiness() -> str | None:
        # Never dials out: a 200 only says an attempt can be made.
        if backends:
            return None
        return settings.config_problem or "no mailers configured"

    return readiness


def _drain_step(api: MailerApi, budget: StopBudget, reactor: Any) -> Callable[[], Awaitable[None]]:
    """The stop step that waits for sends in flight within the budget."""

    async def drain() -> None:
        if not len(api.inflight):
            return
        finished = await api.inflight.drain(budget.remaining(), reactor)
        if not finished:
            log.warn("MAILER_DRAIN_TIMEOUT cancelled={count}", count=len(api.running))
            api.cancel_all("shutdown drain budget exhausted")
            # Cancelled attempts classify themselves promptly; wait briefly
            # so their answers are written before the process goes away.
            await api.inflight.drain(5.0, reactor)
        # The last answers sit in transport buffers until the reactor's next
        # I/O pass; the reactor drops connections right after the stop, so
        # give it a moment to flush them.
        await deferLater(reactor, FLUSH_WAIT)

    return drain


def _ready_steps(
    settings: MailerSettings,
    mailers: int,
    api: MailerApi,
    budget: StopBudget,
    notifier: SystemdNotifier | None,
) -> tuple[Callable[[], None], Callable[[], None]]:
    """What the tree does once started (READY) and when its stop begins
    (the budget starts, STOPPING)."""

    def started() -> None:
        log.info(
            "MAILER_STARTED listen={listen} mailers={mailers}",
            listen=settings.http.listen_addr,
            mailers=mailers,
        )
        if notifier is not None:
            notifier.ready()

    def stopping() -> None:
        budget.start()
        if notifier is not None:
            notifier.stopping()
        if len(api.inflight):
            log.info(
                "MAILER_DRAINING sends={sends} budget={budget}",
                sends=len(api.inflight),
                budget=budget.seconds,
            )

    return started, stopping


def _reload_on_hangup(reloadable: Sequence[Reloadable], reactor: Any) -> ReloadOnHangup:
    def reload_backends() -> None:
        for backend in reloadable:
            backend.reload()

    return ReloadOnHangup(reload_backends, reactor, name="mailer-reload")
