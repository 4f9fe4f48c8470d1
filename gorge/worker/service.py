"""gorge-worker: the service tree and the twistd entry point.

Start order: HTTP pool, listener, Conduit probe, consume loop. Stop runs in
reverse: the loop stops leasing and drains first (while /readyz says
"shutting down" and the listener still answers), then the probe, then the
listener, and the HTTP connection pool is closed last .
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from twisted.application import service as tservice
from twisted.internet.defer import Deferred, TimeoutError
from twisted.internet.interfaces import IDelayedCall
from twisted.python import usage

from gorge.app.hangup import ReloadOnHangup
from gorge.app.poller import Poller
from gorge.app.tree import ServiceTree
from gorge.app.twistd import run_make_service
from gorge.client.agent import make_agent
from gorge.client.tls import ClientCertificate, client_tls
from gorge.config import ConfigError
from gorge.log.logger import Logger
from gorge.web.listener import listener
from gorge.web.site import build_site
from gorge.web.version import About
from gorge.worker.api import WorkerApi
from gorge.worker.conduit import ConduitClient, DelegationPause
from gorge.worker.consumer import Consumer, DelegationGate, LoopSettings
from gorge.worker.executor.pool import (
    ExecutorGate,
    ExecutorPool,
    PoolSettings,
    check_phorge_loads,
)
from gorge.worker.handlers import feed_http, herald_webhook, test_worker
from gorge.worker.handlers.conduit import ConduitDelegate
from gorge.worker.handlers.feed_http import FeedHttpHandler, FeedPolicy
from gorge.worker.handlers.herald_webhook import LeftToGorgeWebhook
from gorge.worker.handlers.noop import noop
from gorge.worker.handlers.php_executor import PhpExecutorDelegate
from gorge.worker.handlers.test_worker import TestWorker
from gorge.worker.metrics import WorkerMetrics
from gorge.worker.queueclient import QueueClient, QueueEndpoint, lease_owner
from gorge.worker.queuewire import QueueWire
from gorge.worker.registry import Handler, LeasePlan, Registry
from gorge.worker.settings import QUEUE_TLS_SETTINGS, WorkerSettings, load_worker_settings

log = Logger()

# Classes the reference delegates by name when Conduit is set.
DELEGATED_BY_DEFAULT = (
    "PhabricatorSearchWorker",
    "PhabricatorMetaMTAWorker",
    "PhabricatorApplicationTransactionPublishWorker",
    "HeraldWebhookWorker",
)
API_PREFIX = "/api/worker/"


class Options(usage.Options):
    optParameters = [
        ["listen", None, None, "host:port to listen on, overrides GORGE_LISTEN_ADDR"],
    ]


#: The first retry of a failed Conduit probe, in seconds; each further
#: failure doubles it, up to the probe period.
PROBE_RETRY_SEC = 2.0
#: The longest wait between retries while the probe does not reach PHP at all
#: (nothing answers, or a proxy's 502/503/504): such a probe costs Phorge
#: nothing, and delegated classes wait for one to pass (docs/worker.md).
PROBE_UNREACHED_RETRY_SEC = 5.0


class ConduitProbe:
    """The periodic delegation readiness probe.

    A failed probe is tried again sooner than the period (after
    :data:`PROBE_RETRY_SEC`, doubling), so one passing hiccup in Phorge
    does not keep the worker unready for a whole period. ``pause`` hears
    every result: delegated classes wait from a failed probe, or a task's
    call that did not reach PHP, until a probe passes.
    """

    def __init__(
        self, client: ConduitClient, clock, period: float, pause: DelegationPause | None = None
    ) -> None:
        self._client = client
        self._clock = clock
        self._period = period
        # Told every result; it asks for a quick retry when a task's call
        # did not reach PHP.
        self.pause = pause
        if pause is not None:
            pause.recheck_with(self.retry_soon)
        self.completed = False
        self.reason: str | None = None
        self._poller = Poller(self._tick, period, clock, "conduit-probe")
        self._retry: IDelayedCall | None = None
        self._retry_delay = PROBE_RETRY_SEC

    async def _tick(self) -> None:
        self._cancel_retry()
        result = await self._client.check()
        reason = result.reason
        if reason != self.reason or not self.completed:
            if reason is None:
                log.info("WORKER_CONDUIT_PROBE_PASSED")
            else:
                log.warn("WORKER_CONDUIT_PROBE_FAILED reason={reason}", reason=reason)
        self.reason = reason
        self.completed = True
        if self.pause is not None:
            self.pause.probed(reason)
        if reason is None:
            self._retry_delay = PROBE_RETRY_SEC
        elif self._poller.running and self._retry_delay < self._period:
            self._cancel_retry()  # one a task asked for while this probe ran
            self._retry = self._clock.callLater(self._retry_delay, self._poller.wake)
            self._retry_delay = self._next_delay(result.reached)

    def _next_delay(self, reached: bool) -> float:
        longest = self._period if reached else min(self._period, PROBE_UNREACHED_RETRY_SEC)
        return min(self._retry_delay * 2, longest)

    def retry_soon(self) -> None:
        """A task's call did not reach PHP: probe again after the quick
        retry's delay instead of at the next period (unless a retry is
        already due)."""
        if not self._poller.running or (self._retry is not None and self._retry.active()):
            return
        self._retry = self._clock.callLater(self._retry_delay, self._poller.wake)
        self._retry_delay = self._next_delay(reached=False)

    def _cancel_retry(self) -> None:
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None

    def start(self) -> None:
        self._poller.start(now=True)

    def stop(self) -> Deferred:
        self._cancel_retry()
        return self._poller.stop()

    def readiness_reason(self) -> str | None:
        if self.pause is not None and self.pause.paused:
            return self.pause.readiness_reason()
        if not self.completed:
            return "conduit: no probe has completed yet"
        if self.reason is not None:
            return f"conduit: {self.reason}"
        return None


def build_registry(
    settings: WorkerSettings,
    http_client,
    clock,
    metrics: WorkerMetrics,
    feed_policy: FeedPolicy | None = None,
    executors: ExecutorPool | None = None,
) -> tuple[Registry, ConduitClient | None]:
    """The handlers by class. PHP tasks go to ``executors`` (local PHP
    executors, with GORGE_WORKER_PHORGE_ROOT) when given, else to Conduit."""
    registry = Registry()
    conduit = None
    delegate: Handler | None = None
    if executors is not None:
        delegate = PhpExecutorDelegate(executors, metrics)
    elif settings.conduit_url:
        conduit = ConduitClient(
            http_client,
            clock,
            settings.conduit_url,
            settings.conduit_token,
            concurrency=settings.delegate_concurrency,
        )
        delegate = ConduitDelegate(conduit, metrics)
    allow = settings.delegate_classes
    feed_delegate = (
        delegate if delegate is not None and (not allow or feed_http.TASK_CLASS in allow) else None
    )
    registry.register(
        feed_http.TASK_CLASS,
        FeedHttpHandler(http_client, clock, delegate=feed_delegate, policy=feed_policy),
    )
    if settings.native_test_worker:
        registry.register(test_worker.TASK_CLASS, TestWorker(clock))
    if settings.webhook_owner == herald_webhook.OWNER_GORGE_WEBHOOK:
        # Registered before any delegation, which never replaces a native
        # handler: this class must never reach Conduit.
        registry.register(herald_webhook.TASK_CLASS, LeftToGorgeWebhook(metrics))
    for name in settings.noop_classes:
        if name in registry.registered():
            raise ConfigError(
                "GORGE_WORKER_NOOP_CLASSES",
                f"{name} already runs natively; it cannot also be a no-op",
            )
        registry.register(name, noop(name, log_each=settings.http.access_log))
    if delegate is not None:
        native = set(registry.registered())
        for name in allow or DELEGATED_BY_DEFAULT:
            if name not in native:
                registry.register(name, delegate)
        if not allow:
            registry.set_fallback(delegate)
        if settings.webhook_owner == herald_webhook.OWNER_PHORGE:
            # The owner setting decides, also when the allow list omits it.
            registry.register(herald_webhook.TASK_CLASS, delegate)
    return registry, conduit


def check_webhook_owner_needed(
    settings: WorkerSettings, registry: Registry, plan: LeasePlan
) -> None:
    """Refuse to start when this worker would run webhook tasks through PHP
    without being told who delivers webhooks: guessing could deliver each
    one twice (gorge-webhook and PHP) or never."""
    task_class = herald_webhook.TASK_CLASS
    if (
        not settings.webhook_owner
        and plan.runnable(task_class)
        and isinstance(registry.get(task_class), ConduitDelegate | PhpExecutorDelegate)
    ):
        raise ConfigError(
            herald_webhook.SETTING,
            f"must be set, because this worker would run {task_class} tasks: "
            f"{herald_webhook.CHOICES_EXPLAINED}",
        )


def build_worker_service(
    settings: WorkerSettings,
    reactor,
    *,
    http_client=None,
    notifier=None,
    extra_handlers: Mapping[str, Handler] | None = None,
) -> ServiceTree:
    """The real constructor; ``extra_handlers`` lets a demo or benchmark add
    native handlers by class name.

    Parts: ``consumer``, ``registry``, ``plan``, ``site``,
    ``metrics-registry`` and, with delegation, ``conduit-probe``.
    """
    clock = reactor
    tree = ServiceTree("gorge-worker")
    injected_client = http_client is not None
    if http_client is None:
        # The handlers' own calls (Conduit, feeds): one connection per slot,
        # and the same two spare as the queue's connections below.
        http_client, pool = make_agent(
            reactor, max_per_host=settings.max_workers + 2, connect_timeout=10
        )
        tree.add("http-pool", stop=lambda: close_pool(pool, clock))
    metrics_registry = CollectorRegistry()
    metrics = WorkerMetrics(metrics_registry)
    # Read once here and again on SIGHUP, never per task (docs/worker.md).
    feed_policy = FeedPolicy(settings.feed_policy_file) if settings.feed_policy_file else None
    executors = None
    if settings.phorge_root:
        executors = ExecutorPool(executor_pool_settings(settings, os.environ), reactor, metrics)
    registry, conduit = build_registry(
        settings, http_client, clock, metrics, feed_policy, executors=executors
    )
    for task_class, handler in (extra_handlers or {}).items():
        registry.register(task_class, handler)
    plan = lease_plan(settings, registry)
    started = int(clock.seconds())
    owner = lease_owner(None, os.getpid(), started)
    wire = None
    if not injected_client:
        # One connection per slot plus the lease call, so reports never queue
        # behind each other for a connection.
        wire = QueueWire(
            reactor,
            settings.queue_url,
            connect_timeout=10,
            max_idle=settings.max_workers + 2,
            tls=queue_tls(settings),
        )
        tree.add("queue-connections", stop=wire.close)
    queue = QueueClient(
        http_client,
        clock,
        QueueEndpoint(settings.queue_url, settings.queue_token, queue_trust(settings)),
        owner,
        report_batch=settings.report_batch,
        report_delay=settings.report_delay_ms / 1000.0,
        wire=wire,
        lease_seconds=settings.heartbeat_lease_sec,
    )
    probe: ConduitProbe | None = None
    pause: DelegationPause | None = None
    if conduit is not None and settings.conduit_probe_sec > 0:
        # Only a probe can tell that Phorge's web server is back, so only
        # with one do delegated classes pause (docs/worker.md).
        pause = DelegationPause(clock, lambda name: isinstance(registry.get(name), ConduitDelegate))
        probe = ConduitProbe(conduit, clock, float(settings.conduit_probe_sec), pause=pause)
    gate: DelegationGate | None = pause
    if executors is not None:
        gate = ExecutorGate(
            executors, lambda name: isinstance(registry.get(name), PhpExecutorDelegate)
        )
    consumer = Consumer(
        queue=queue,
        registry=registry,
        plan=plan,
        clock=clock,
        metrics=metrics,
        settings=LoopSettings(
            lease_limit=settings.lease_limit,
            max_workers=settings.max_workers,
            poll_interval=settings.poll_interval_ms / 1000.0,
            idle_timeout=float(settings.idle_timeout_sec),
            hibernate=float(settings.hibernate_sec),
            drain_timeout=float(settings.drain_timeout_sec),
            lease_wait=float(settings.lease_wait_sec),
            log_debug=settings.http.debug_log,
            heartbeat=float(settings.heartbeat_sec),
            heartbeat_lease=settings.heartbeat_lease_sec,
        ),
        on_progress=notifier.progress if notifier is not None else None,
        delegation=gate,
    )
    site = build_site(
        api_resource=WorkerApi(
            stats_of(consumer, registry, started, owner, settings.webhook_owner)
        ).resource(),
        prefix=API_PREFIX,
        token=settings.http.token,
        body_limit=settings.http.body_limit,
        readiness=readiness_of(consumer, probe, executors),
        registry=metrics_registry,
        clock=clock,
        access_log=settings.http.access_log,
        about=About.of("gorge-worker", "gorge.worker", clock),
    )
    # Stopped bottom-up: the consume loop stops leasing and drains first,
    # while /readyz says "shutting down" and the listener still answers; the
    # connection pool closes last.
    tree.add("listener", listener(settings.http.endpoint, site, clock=clock, tls=settings.http.tls))
    if feed_policy is not None:
        tree.add(
            "feed-policy-reload",
            ReloadOnHangup(feed_policy.reload, reactor, name="feed-policy-reload"),
        )
    if probe is not None:
        tree.add("conduit-probe", start=probe.start, stop=probe.stop, part=probe)
    if executors is not None:
        # Started before the loop, stopped after it has drained.
        tree.add("php-executors", start=executors.start, stop=executors.stop, part=executors)
    loop = ConsumeLoop(consumer, settings, plan, registry, owner, notifier)
    tree.add("consumer", start=loop.start, stop=loop.stop, part=consumer)
    tree.keep("registry", registry)
    tree.keep("plan", plan)
    tree.keep("site", site)
    tree.keep("metrics-registry", metrics_registry)
    return tree


def queue_tls(settings: WorkerSettings) -> Any:
    """The TLS connection creator for an https queue URL with a private CA or
    a client certificate; None for the system's CAs (or plain http). A file
    that cannot be used stops the build with its setting named."""
    if not (settings.queue_ca or settings.queue_client_cert):
        return None
    ca_name, cert_name, key_name = QUEUE_TLS_SETTINGS
    client = None
    if settings.queue_client_cert:
        client = ClientCertificate(
            cert_name, settings.queue_client_cert, key_name, settings.queue_client_key
        )
    host = urlsplit(settings.queue_url).hostname or ""
    return client_tls(host, ca_setting=ca_name, ca=settings.queue_ca, client_certificate=client)


def queue_trust(settings: WorkerSettings) -> str:
    if settings.queue_ca:
        return f"the CAs in {QUEUE_TLS_SETTINGS[0]}={settings.queue_ca}"
    return f"the system's CAs, {QUEUE_TLS_SETTINGS[0]} being unset"


def executor_pool_settings(settings: WorkerSettings, environ: Mapping[str, str]) -> PoolSettings:
    """The executors' command and environment. They get the worker's
    environment (PHABRICATOR_ENV, PATH, ...) without gorge's own settings,
    whose tokens a PHP task has no business reading."""
    env = {k: v for k, v in environ.items() if not k.startswith("GORGE_")}
    return PoolSettings(
        argv=(settings.php_binary, settings.php_executor_script, settings.phorge_root),
        env=env,
        size=settings.php_executors,
        max_tasks=settings.php_max_tasks,
        max_memory=settings.php_max_memory_mb * 1024 * 1024,
    )


def lease_plan(settings: WorkerSettings, registry: Registry) -> LeasePlan:
    """What this worker leases; refuses a configuration that leases nothing
    or would run webhook tasks through PHP without an owner."""
    plan = LeasePlan(registry, settings.class_filter)
    check_webhook_owner_needed(settings, registry, plan)
    if plan.empty:
        raise ConfigError(
            "GORGE_WORKER_TASK_CLASS_FILTER",
            "leaves no task class this worker can run "
            f"(runnable: {', '.join(registry.supported_classes()) or 'none'})",
        )
    return plan


def readiness_of(
    consumer: Consumer, probe: ConduitProbe | None, executors: ExecutorPool | None = None
):
    async def readiness() -> str | None:
        reason = consumer.readiness_reason()
        if reason is None and probe is not None:
            reason = probe.readiness_reason()
        if reason is None and executors is not None:
            reason = executors.readiness_reason()
        return reason

    return readiness


def stats_of(
    consumer: Consumer, registry: Registry, started: int, owner: str, webhook_owner: str = ""
):
    def stats() -> dict:
        c = consumer.counters
        return {
            "processed": c.processed,
            "failed": c.failed,
            "active": consumer.active,
            "supported": registry.supported_classes(),
            "yielded": c.yielded,
            "unreported": c.unreported,
            "idle": consumer.idle,
            "startedAt": started,
            "leaseOwner": owner,
            # Phorge's setup check and gorge doctor compare it with whether
            # gorge-webhook is deployed ("" = not set: no PHP configured).
            "webhookOwner": webhook_owner,
        }

    return stats


class ConsumeLoop:
    """Starting and stopping the consume loop, with its log lines and the
    systemd notifications."""

    def __init__(
        self,
        consumer: Consumer,
        settings: WorkerSettings,
        plan: LeasePlan,
        registry: Registry,
        owner: str,
        notifier,
    ) -> None:
        self._consumer = consumer
        self._settings = settings
        self._plan = plan
        self._registry = registry
        self._owner = owner
        self._notifier = notifier

    def start(self) -> None:
        settings, plan = self._settings, self._plan
        for warning in settings.warnings:
            log.warn("WORKER_CONFIG_WARNING warning={warning}", warning=warning)
        for name in plan.unrunnable_filter_entries:
            log.warn("WORKER_FILTER_CLASS_NOT_RUNNABLE task_class={task_class}", task_class=name)
        log.info(
            "WORKER_STARTING owner={owner} supported={supported} "
            "task_classes={task_classes} config={config}",
            owner=self._owner,
            supported=self._registry.supported_classes(),
            task_classes=plan.task_classes,
            config=settings.describe(),
        )
        if self._notifier is not None:
            notifier = self._notifier
            self._consumer.first_lease_done.addCallback(lambda _: notifier.ready())
        self._consumer.start()

    async def stop(self) -> None:
        consumer = self._consumer
        if self._notifier is not None:
            self._notifier.stopping()
        log.info("WORKER_STOPPING active={active}", active=consumer.active)
        await consumer.stop()
        log.info(
            "WORKER_STOPPED processed={processed} failed={failed} unreported={unreported}",
            processed=consumer.counters.processed,
            failed=consumer.counters.failed,
            unreported=consumer.counters.unreported,
        )


async def close_pool(pool, clock) -> None:
    try:
        await pool.closeCachedConnections().addTimeout(5, clock)
    except TimeoutError:
        log.warn("WORKER_HTTP_POOL_CLOSE_TIMED_OUT")


def makeService(options) -> tservice.IService:
    def build() -> tservice.IService:
        from twisted.internet import reactor

        from gorge.app.systemd import SystemdNotifier

        settings = load_worker_settings(os.environ, listen_override=options["listen"])
        if settings.phorge_root:
            # A Phorge that does not load stops the daemon here, in one line.
            check_phorge_loads(executor_pool_settings(settings, os.environ))
        return build_worker_service(
            settings, reactor, notifier=SystemdNotifier(os.environ, reactor)
        )

    return run_make_service("gorge-worker", build, options=options)
