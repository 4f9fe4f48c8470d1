"""gorge-webhook: the twistd entry point and the service tree."""

from __future__ import annotations

import os
from collections.abc import Mapping

from prometheus_client import CollectorRegistry
from twisted.application.service import IService
from twisted.internet.defer import Deferred
from twisted.python import usage

from gorge.app.hangup import ReloadOnHangup
from gorge.app.inflight import StopBudget
from gorge.app.poller import Poller
from gorge.app.systemd import SystemdNotifier
from gorge.app.tree import ServiceTree
from gorge.app.twistd import run_make_service
from gorge.db.sqlmetrics import TransactionMetrics
from gorge.db.topology import MasterFollower, repoint
from gorge.log.logger import Logger
from gorge.web.listener import listener
from gorge.web.site import build_site
from gorge.web.version import About
from gorge.webhook.api import PREFIX, WebhookApi
from gorge.webhook.breaker import Breaker
from gorge.webhook.deliverylog import DeliveryLog
from gorge.webhook.dispatcher import Dispatcher
from gorge.webhook.hooklock import LOCK_SESSION_TIMEOUT, HookLocks
from gorge.webhook.metrics import BacklogAge, WebhookMetrics
from gorge.webhook.settings import WebhookSettings, load_webhook_settings
from gorge.webhook.silent import SilentMode
from gorge.webhook.sitecounts import SiteCounter
from gorge.webhook.store import WebhookStore
from gorge.webhook.transport import Transport
from gorge.webhook.uripolicy import Resolver, UriPolicy, system_resolver

log = Logger()

LISTENER_STOP_BUDGET = 10.0


class Options(usage.Options):
    optParameters = [
        ["listen", None, None, "listen address (host:port), overrides GORGE_LISTEN_ADDR"],
    ]


class PollLoop:
    """The poll loop: one dispatcher tick per interval; systemd hears "ready"
    after the first tick that completed."""

    def __init__(
        self, dispatcher: Dispatcher, interval: float, clock, notifier: SystemdNotifier | None
    ) -> None:
        self._dispatcher = dispatcher
        self._notifier = notifier
        self._first_tick_done = False
        self.poller = Poller(
            self._tick,
            interval,
            clock,
            "webhook",
            on_progress=notifier.progress if notifier is not None else None,
        )
        dispatcher.set_wake(self.poller.wake)

    async def _tick(self) -> None:
        await self._dispatcher.tick()
        if not self._first_tick_done:
            self._first_tick_done = True
            if self._notifier is not None:
                self._notifier.ready()


def webhook_tree(
    settings: WebhookSettings,
    reactor,
    clock,
    *,
    store: WebhookStore,
    transport: Transport,
    dispatcher: Dispatcher,
    site,
    notifier: SystemdNotifier | None,
    locks: HookLocks | None = None,
    follower: MasterFollower | None = None,
) -> ServiceTree:
    """Start: listener, then the poll loop. Stop: listener, loop, drain, pools.

    The stop order is not the reverse of the start order (the listener stops
    first, yet polling starts only once it is bound), so polling has a
    start step above the listener ("polling") and a stop step below it
    ("poll-drain").
    """
    loop = PollLoop(dispatcher, settings.poll_interval, clock, notifier)
    # Deliveries are bounded by the timeout; the extra 10 s cover their writes.
    # One budget for the last tick, the running deliveries and their writes,
    # counted once the listener has stopped.
    budget = StopBudget(settings.shutdown_budget, clock)

    async def close_store() -> None:
        if locks is not None:
            locks.close()
        store.close()
        log.info("WEBHOOK_STOPPED")

    async def close_pool() -> None:
        await Deferred.fromCoroutine(transport.close()).addTimeout(5, reactor)

    async def drain_deliveries() -> None:
        await dispatcher.drain(max(budget.remaining(), 1.0))

    async def stop_polling() -> None:
        budget.start()
        await loop.poller.stop().addTimeout(budget.seconds, clock)

    def start_polling() -> None:
        log.info("listening address={address}", address=settings.http.listen_addr)
        loop.poller.start()

    def announce_stop() -> None:
        if notifier is not None:
            notifier.stopping()
        log.info("shutting down budget={budget}", budget=budget.seconds)

    tree = ServiceTree("gorge-webhook")
    tree.add("store", stop=close_store, part=store)
    tree.add("transport", stop=close_pool, part=transport)
    tree.add("dispatcher", stop=drain_deliveries, part=dispatcher)
    tree.add("poll-drain", stop=stop_polling)
    # Bounded by the listener itself: LISTENER_STOP_BUDGET for the requests
    # already received. A listener that cannot bind raises when it starts,
    # before any polling.
    tree.add(
        "listener",
        listener(
            settings.http.endpoint,
            site,
            drain_timeout=LISTENER_STOP_BUDGET,
            clock=reactor,
            tls=settings.http.tls,
        ),
    )
    tree.add("polling", start=start_polling, part=loop)
    if follower is not None:
        tree.add("topology", ReloadOnHangup(follower.reload, reactor, name="mysql-topology-reload"))
        tree.keep("master-follower", follower)
    tree.add("shutdown", stop=announce_stop)
    tree.keep("site", site)
    tree.keep("settings", settings)
    tree.keep("stop-budget", budget)
    tree.keep("locks", locks)
    return tree


def log_effective_settings(settings: WebhookSettings, engine: str) -> None:
    log.info(
        "WEBHOOK_CONFIG poll_ms={poll_ms} max_concurrent={max_concurrent}"
        " timeout={timeout} lease={lease} retry_backoff={retry_backoff}"
        " effective_retry={effective_retry} breaker_threshold={threshold}"
        " breaker_window={window} database={database} store={store}"
        " outbound_blacklist={blacklist} standard_headers={standard_headers}"
        " retry_after_max={retry_after_max} silent_from={silent_from}"
        " silent_recheck={silent_recheck} hook_lock={hook_lock}"
        " site_stats_max_age={site_stats_max_age}",
        poll_ms=int(settings.poll_interval * 1000),
        max_concurrent=settings.max_concurrent,
        timeout=settings.delivery_timeout,
        lease=settings.effective_lease,
        retry_backoff=settings.retry_backoff,
        effective_retry=settings.effective_retry,
        threshold=settings.breaker_threshold,
        window=settings.breaker_window,
        database=settings.mysql.describe(),
        store=engine,
        blacklist=len(settings.outbound_blacklist),
        standard_headers=settings.standard_headers,
        retry_after_max=settings.retry_after_max,
        silent_from=",".join(settings.silent_from) or "none",
        silent_recheck=settings.silent_recheck,
        hook_lock=settings.hook_lock,
        site_stats_max_age=settings.site_stats_max_age,
    )
    # The loader's warnings; the combination remarks again for settings built
    # another way (a demo, a test), once each.
    for warning in dict.fromkeys([*settings.warnings, *settings.startup_warnings()]):
        log.warn("WEBHOOK_CONFIG_WARNING warning={warning}", warning=warning)


def build_webhook_service(
    settings: WebhookSettings,
    reactor,
    *,
    store: WebhookStore | None = None,
    http_client: Transport | None = None,
    notifier: SystemdNotifier | None = None,
    clock=None,
    registry: CollectorRegistry | None = None,
    resolver: Resolver | None = None,
) -> ServiceTree:
    """The real constructor; ``makeService`` only wires in the global reactor and environment.

    ``clock`` (default: the reactor) drives the loop and the breaker; tests
    pass a ``task.Clock``. ``store`` lets a demo run on SQLite. Parts:
    ``store``, ``transport``, ``dispatcher``, ``polling``, ``site``,
    ``settings``, ``stop-budget``.
    """
    clock = clock if clock is not None else reactor
    registry = registry if registry is not None else CollectorRegistry()
    metrics = WebhookMetrics(registry)
    store = store if store is not None else WebhookStore.mysql(settings.mysql, reactor)
    registry.register(TransactionMetrics(store.db))
    registry.register(BacklogAge(store.observation.view.oldest_queued))
    policy = UriPolicy(
        settings.outbound_blacklist,
        resolver or system_resolver(reactor),
        reactor,
        settings.delivery_timeout,
    )
    transport = (
        http_client
        if http_client is not None
        else Transport(
            reactor, policy, settings.delivery_timeout, max_per_host=settings.max_concurrent
        )
    )
    breaker = Breaker(
        store.observation,
        threshold=settings.breaker_threshold,
        window=settings.breaker_window,
        clock=clock,
        metrics=metrics,
    )
    silent = SilentMode(
        # The demo's SQLite store has no Phorge configuration next to it.
        sources=tuple(
            source
            for source in settings.silent_from
            if source != "database" or store.db.engine.name == "mysql"
        ),
        interval=settings.silent_recheck,
        clock=clock,
        db=store.db,
        config_database=settings.config_database,
        phorge_root=settings.phorge_root,
    )
    # Phorge's per-hook lock is MySQL's; the demo's SQLite store has no other writer.
    locks = (
        HookLocks(
            settings.mysql,
            settings.lock_namespace,
            reactor,
            slots=settings.max_concurrent,
            clock=clock,
            park_for=settings.poll_interval,
            session_timeout=LOCK_SESSION_TIMEOUT,
        )
        if settings.hook_lock and store.db.engine.name == "mysql"
        else None
    )
    follower = None
    if settings.topology is not None and store.db.engine.name == "mysql":
        moves = [lambda moved: repoint(store.db, moved, reactor)]
        if locks is not None:
            moves.append(locks.repoint)
        follower = MasterFollower(settings.topology, settings.mysql, moves, name="webhook")
    dispatcher = Dispatcher(
        store=store,
        transport=transport,
        policy=policy,
        breaker=breaker,
        settings=settings,
        clock=clock,
        metrics=metrics,
        batch_clock=reactor,
        silent=silent,
        locks=locks,
    )

    deliveries = DeliveryLog(
        store,
        metrics,
        breaker_threshold=settings.breaker_threshold,
        breaker_window=settings.breaker_window,
    )
    site = build_site(
        api_resource=WebhookApi(
            store.observation,
            deliveries,
            SiteCounter(store.db, clock, max_age=settings.site_stats_max_age),
        ).resource(),
        prefix=PREFIX,
        token=settings.http.token,
        body_limit=settings.http.body_limit,
        readiness=store.ping,
        registry=registry,
        clock=reactor,
        about=About.of("gorge-webhook", "gorge.webhook", reactor),
    )
    log_effective_settings(settings, store.db.engine.name)
    return webhook_tree(
        settings,
        reactor,
        clock,
        store=store,
        transport=transport,
        dispatcher=dispatcher,
        site=site,
        notifier=notifier,
        locks=locks,
        follower=follower,
    )


def makeService(options: Mapping) -> IService:
    from twisted.internet import reactor  # the one place the global reactor is used

    def build() -> IService:
        settings = load_webhook_settings(os.environ, listen=options.get("listen"))
        return build_webhook_service(
            settings, reactor, notifier=SystemdNotifier(os.environ, reactor)
        )

    return run_make_service("gorge-webhook", build, options=options)
