"""gorge-webhook: the twistd entry point and the service tree."""

from __future__ import annotations

import os
from typing import Mapping

from prometheus_client import CollectorRegistry
from twisted.application.service import IService
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger, LogLevel
from twisted.python import usage

from gorge.config import Env
from gorge.service import DaemonRoot, Poller, SystemdNotifier, listener, run_make_service
from gorge.web import build_site
from gorge.webhook.api import PREFIX, WebhookApi
from gorge.webhook.breaker import Breaker
from gorge.webhook.deliverylog import DeliveryLog
from gorge.webhook.dispatcher import Dispatcher
from gorge.webhook.metrics import WebhookMetrics
from gorge.webhook.transport import Transport
from gorge.webhook.uripolicy import Resolver, UriPolicy, system_resolver
from gorge.webhook.settings import WebhookSettings, load_webhook_settings
from gorge.webhook.store import WebhookStore

log = Logger()

LISTENER_STOP_BUDGET = 10.0


class Options(usage.Options):
    optParameters = [
        ["listen", None, None, "listen address (host:port), overrides GORGE_LISTEN_ADDR"],
    ]


class WebhookService(DaemonRoot):
    """Start: listener, then the poll loop. Stop: listener, loop, drain, pools.

    The stop order is not the reverse of the start order, so this parent
    sequences it explicitly rather than using OrderedService.
    """

    def __init__(self, *, settings: WebhookSettings, reactor, store: WebhookStore,
                 transport: Transport, dispatcher: Dispatcher, site, http_service: IService,
                 notifier: SystemdNotifier | None, clock) -> None:
        self.setName("gorge-webhook")
        self.site = site
        self.settings = settings
        self.store = store
        self.transport = transport
        self.dispatcher = dispatcher
        self.http_service = http_service
        self._reactor = reactor
        self._clock = clock
        self._notifier = notifier
        self._first_tick_done = False
        # Deliveries are bounded by the timeout; the extra 10 s cover their writes.
        self.drain_budget = settings.shutdown_budget
        self.poller = Poller(self._tick, settings.poll_interval, clock, "webhook",
                             on_progress=notifier.progress if notifier is not None else None)
        dispatcher.set_wake(self.poller.wake)

    async def _tick(self) -> None:
        await self.dispatcher.tick()
        if not self._first_tick_done:
            self._first_tick_done = True
            if self._notifier is not None:
                self._notifier.ready()

    def privilegedStartService(self) -> None:
        super().privilegedStartService()
        self.http_service.privilegedStartService()

    def startService(self) -> None:
        super().startService()
        # A listener that cannot bind raises here, before any polling.
        if not self.http_service.running:
            self.http_service.startService()
        log.info("listening address={address}", address=self.settings.http.listen_addr)
        self.poller.start()

    def stopService(self) -> Deferred:
        super().stopService()
        return Deferred.fromCoroutine(self._stop())

    async def _stop(self) -> None:
        if self._notifier is not None:
            self._notifier.stopping()
        log.info("shutting down budget={budget}", budget=self.drain_budget)
        try:
            # Bounded by the listener itself: LISTENER_STOP_BUDGET for the
            # requests already received.
            await maybeDeferred(self.http_service.stopService)
        except Exception:
            log.failure("STOP_FAILED step=listener", level=LogLevel.error)
        # One budget for the last tick, the running deliveries and their writes.
        budget = self.drain_budget
        started = self._clock.seconds()
        try:
            await self.poller.stop().addTimeout(budget, self._clock)
        except Exception:
            log.failure("STOP_FAILED step=poller", level=LogLevel.error)
        remaining = max(budget - (self._clock.seconds() - started), 1.0)
        await self.dispatcher.drain(remaining)
        try:
            await Deferred.fromCoroutine(self.transport.close()).addTimeout(5, self._reactor)
        except Exception:
            log.failure("STOP_FAILED step=http-pool", level=LogLevel.error)
        self.store.close()
        log.info("WEBHOOK_STOPPED")


def log_effective_settings(settings: WebhookSettings, dialect: str,
                           warnings: list[str]) -> None:
    log.info("WEBHOOK_CONFIG poll_ms={poll_ms} max_concurrent={max_concurrent}"
             " timeout={timeout} lease={lease} retry_backoff={retry_backoff}"
             " effective_retry={effective_retry} breaker_threshold={threshold}"
             " breaker_window={window} database={database} store={store}"
             " outbound_blacklist={blacklist} standard_headers={standard_headers}"
             " retry_after_max={retry_after_max}",
             poll_ms=int(settings.poll_interval * 1000), max_concurrent=settings.max_concurrent,
             timeout=settings.delivery_timeout, lease=settings.effective_lease,
             retry_backoff=settings.retry_backoff, effective_retry=settings.effective_retry,
             threshold=settings.breaker_threshold, window=settings.breaker_window,
             database=settings.mysql.describe(), store=dialect,
             blacklist=len(settings.outbound_blacklist),
             standard_headers=settings.standard_headers,
             retry_after_max=settings.retry_after_max)
    for warning in warnings + settings.startup_warnings():
        log.warn("WEBHOOK_CONFIG_WARNING warning={warning}", warning=warning)


def build_webhook_service(settings: WebhookSettings, reactor, *, store: WebhookStore | None = None,
                          http_client: Transport | None = None,
                          notifier: SystemdNotifier | None = None, clock=None,
                          registry: CollectorRegistry | None = None,
                          resolver: Resolver | None = None,
                          config_warnings: list[str] | None = None) -> WebhookService:
    """The real constructor; ``makeService`` only wires in the global reactor and environment.

    ``clock`` (default: the reactor) drives the loop and the breaker; tests
    pass a ``task.Clock``. ``store`` lets a demo run on SQLite.
    """
    clock = clock if clock is not None else reactor
    registry = registry if registry is not None else CollectorRegistry()
    metrics = WebhookMetrics(registry)
    store = store if store is not None else WebhookStore.mysql(settings.mysql, reactor)
    policy = UriPolicy(settings.outbound_blacklist, resolver or system_resolver(reactor),
                       reactor, settings.delivery_timeout)
    transport = http_client if http_client is not None else Transport(
        reactor, policy, settings.delivery_timeout, max_per_host=settings.max_concurrent)
    breaker = Breaker(store, threshold=settings.breaker_threshold,
                      window=settings.breaker_window, clock=clock, metrics=metrics)
    dispatcher = Dispatcher(store=store, transport=transport, policy=policy, breaker=breaker,
                            settings=settings, clock=clock, metrics=metrics)

    async def readiness() -> str | None:
        reason = await store.ping(reactor)
        return None if reason is None else f"ping database: {reason}"

    deliveries = DeliveryLog(store, metrics, breaker_threshold=settings.breaker_threshold,
                             breaker_window=settings.breaker_window)
    site = build_site(api_resource=WebhookApi(store, deliveries).resource(), prefix=PREFIX,
                      token=settings.http.token, body_limit=settings.http.body_limit,
                      readiness=readiness, registry=registry, clock=reactor)
    log_effective_settings(settings, store.dialect, config_warnings or [])
    return WebhookService(settings=settings, reactor=reactor, store=store, transport=transport,
                          dispatcher=dispatcher, site=site,
                          http_service=listener(settings.http.endpoint, site,
                                                drain_timeout=LISTENER_STOP_BUDGET,
                                                clock=reactor),
                          notifier=notifier, clock=clock)


def makeService(options: Mapping) -> IService:
    from twisted.internet import reactor  # the one place the global reactor is used

    def build() -> IService:
        env = Env(os.environ, "gorge-webhook")
        settings = load_webhook_settings(os.environ, listen=options.get("listen"), env=env)
        return build_webhook_service(settings, reactor,
                                     notifier=SystemdNotifier(os.environ, reactor),
                                     config_warnings=env.warnings)

    return run_make_service("gorge-webhook", build, options=options)
