"""gorge-worker settings: environment (with the reference's legacy names) and
twistd options -> one frozen value, validated before any network activity."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gorge.config import ConfigError, Env, HttpSettings, load_http_settings
from gorge.worker.handlers import herald_webhook
from gorge.worker.registry import is_php_class_name, parse_class_list

DEFAULT_LISTEN = ":8170"
DEFAULT_QUEUE_URL = "http://gorge-taskqueue:8090"
DEFAULT_DRAIN_SEC = 30
# docs/worker.md, Long-poll and Batched reports.
DEFAULT_LEASE_WAIT_SEC = 20
MAX_LEASE_WAIT_SEC = 30
DEFAULT_REPORT_BATCH = 100
# Reports that finish within 2 ms share a call; the lease call the worker
# makes in the same moment then reaches the queue first, so the queue answers
# it while the worker still runs the batch before (docs/worker.md).
DEFAULT_REPORT_DELAY_MS = 2
# docs/worker.md, How work flows: a lease batch of 4 cost the queue and the
# worker three times the CPU per task of a batch of 32.
DEFAULT_LEASE_LIMIT = 32
DEFAULT_MAX_WORKERS = 32
DEFAULT_DELEGATE_CONCURRENCY = 4
_URL = re.compile(r"https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~%-]+)(:[0-9]{1,5})?(/[^\s?#]*)?")


def parse_base_url(setting: str, value: str) -> str:
    """``http(s)://host[:port][/path]`` with one trailing ``/`` removed."""
    text = value.strip()
    if not _URL.fullmatch(text):
        raise ConfigError(setting, f"not an http(s)://host[:port][/path] URL: {value!r}")
    port = re.search(r":([0-9]{1,5})(?=/|$)", text.split("://", 1)[1])
    if port is not None and not 1 <= int(port.group(1)) <= 65535:
        raise ConfigError(setting, f"port out of range: {value!r}")
    return text[:-1] if text.endswith("/") else text


@dataclass(frozen=True)
class WorkerSettings:
    http: HttpSettings
    queue_url: str = DEFAULT_QUEUE_URL
    queue_token: str = field(default="", repr=False)
    lease_limit: int = DEFAULT_LEASE_LIMIT
    poll_interval_ms: int = 1000
    max_workers: int = DEFAULT_MAX_WORKERS
    idle_timeout_sec: int = 180
    hibernate_sec: int = 0
    drain_timeout_sec: int = DEFAULT_DRAIN_SEC
    conduit_url: str = ""
    conduit_token: str = field(default="", repr=False)
    class_filter: tuple[str, ...] = ()
    delegate_classes: tuple[str, ...] = ()
    conduit_probe_sec: int = 60
    feed_policy_file: str = ""
    native_test_worker: bool = False
    webhook_owner: str = ""
    noop_classes: tuple[str, ...] = ()
    lease_wait_sec: int = DEFAULT_LEASE_WAIT_SEC
    report_batch: int = DEFAULT_REPORT_BATCH
    report_delay_ms: int = DEFAULT_REPORT_DELAY_MS
    delegate_concurrency: int = DEFAULT_DELEGATE_CONCURRENCY
    warnings: tuple[str, ...] = ()

    def describe(self) -> dict:
        """The effective configuration for the start-up log, without secrets."""
        return {
            "listen": self.http.listen_addr,
            "queue_url": self.queue_url,
            "lease_limit": self.lease_limit,
            "poll_interval_ms": self.poll_interval_ms,
            "max_workers": self.max_workers,
            "idle_timeout_sec": self.idle_timeout_sec,
            "hibernate_sec": self.hibernate_sec,
            "drain_timeout_sec": self.drain_timeout_sec,
            "conduit_url": self.conduit_url,
            "class_filter": list(self.class_filter),
            "delegate_classes": list(self.delegate_classes),
            "conduit_probe_sec": self.conduit_probe_sec,
            "feed_policy_file": self.feed_policy_file,
            "native_test_worker": self.native_test_worker,
            "webhook_owner": self.webhook_owner,
            "noop_classes": list(self.noop_classes),
            "lease_wait_sec": self.lease_wait_sec,
            "report_batch": self.report_batch,
            "report_delay_ms": self.report_delay_ms,
            "delegate_concurrency": self.delegate_concurrency,
        }


def check_webhook_owner(owner: str, conduit_url: str, delegate_classes: tuple[str, ...]) -> None:
    """Refuse the owner settings that contradict the rest of the setup.

    Whether an unset owner matters depends on what the worker would lease,
    which only the assembled registry knows: the service checks that.
    """
    task_class = herald_webhook.TASK_CLASS
    if owner == herald_webhook.OWNER_GORGE_WEBHOOK and task_class in delegate_classes:
        raise ConfigError(
            herald_webhook.SETTING,
            f"{owner} contradicts GORGE_WORKER_DELEGATE_CLASSES, which lists {task_class}: "
            f"remove {task_class} from that list (gorge-webhook delivers webhooks), or set "
            f"{herald_webhook.OWNER_PHORGE} if Phorge should deliver them",
        )
    if owner == herald_webhook.OWNER_PHORGE and not conduit_url:
        raise ConfigError(
            herald_webhook.SETTING,
            f"{owner} needs GORGE_WORKER_CONDUIT_URL (Phorge's base URI) and "
            f"GORGE_WORKER_CONDUIT_TOKEN: {task_class} tasks then run in Phorge through "
            f"worker.execute",
        )


def load_worker_settings(
    environ: Mapping[str, str], *, listen_override: str | None = None
) -> WorkerSettings:
    env = Env(environ, "gorge-worker")
    http = load_http_settings(
        env, default_listen=DEFAULT_LISTEN, listen_override=listen_override, legacy_names=True
    )
    queue_url = parse_base_url(
        "GORGE_WORKER_TASK_QUEUE_URL",
        env.str(("GORGE_WORKER_TASK_QUEUE_URL", "TASK_QUEUE_URL"), DEFAULT_QUEUE_URL),
    )
    conduit_raw = env.str(("GORGE_WORKER_CONDUIT_URL", "CONDUIT_URL"), "")
    conduit_url = parse_base_url("GORGE_WORKER_CONDUIT_URL", conduit_raw) if conduit_raw else ""
    conduit_token = env.str(("GORGE_WORKER_CONDUIT_TOKEN", "CONDUIT_TOKEN"), "")
    if conduit_url and not conduit_token:
        raise ConfigError(
            "GORGE_WORKER_CONDUIT_TOKEN",
            "required when GORGE_WORKER_CONDUIT_URL is set (worker.execute must not be "
            "called unauthenticated)",
        )
    drain = env.int("GORGE_WORKER_DRAIN_TIMEOUT_SEC", DEFAULT_DRAIN_SEC, min=0, max=3600)
    delegate_classes = parse_class_list(env.str("GORGE_WORKER_DELEGATE_CLASSES", ""))
    webhook_owner = env.choice(herald_webhook.SETTING, "", herald_webhook.OWNERS)
    check_webhook_owner(webhook_owner, conduit_url, delegate_classes)
    noop_classes = parse_class_list(env.str("GORGE_WORKER_NOOP_CLASSES", ""))
    for name in noop_classes:
        if not is_php_class_name(name):
            raise ConfigError("GORGE_WORKER_NOOP_CLASSES", f"not a task class name: {name[:80]!r}")
    warnings = list(env.warnings)
    if delegate_classes and not conduit_url:
        warnings.append(
            "GORGE_WORKER_DELEGATE_CLASSES has no effect without GORGE_WORKER_CONDUIT_URL"
        )
    settings = WorkerSettings(
        http=http,
        queue_url=queue_url,
        queue_token=env.str(("GORGE_WORKER_TASK_QUEUE_TOKEN", "TASK_QUEUE_TOKEN"), ""),
        lease_limit=env.int(
            ("GORGE_WORKER_LEASE_LIMIT", "LEASE_LIMIT"), DEFAULT_LEASE_LIMIT, min=1, max=1000
        ),
        poll_interval_ms=env.int(
            ("GORGE_WORKER_POLL_INTERVAL_MS", "POLL_INTERVAL_MS"), 1000, min=1, max=86_400_000
        ),
        max_workers=env.int(
            ("GORGE_WORKER_MAX_WORKERS", "MAX_WORKERS"), DEFAULT_MAX_WORKERS, min=1, max=10_000
        ),
        idle_timeout_sec=env.int(("GORGE_WORKER_IDLE_TIMEOUT_SEC", "IDLE_TIMEOUT_SEC"), 180, min=0),
        hibernate_sec=env.int("GORGE_WORKER_HIBERNATE_SEC", 0, min=0),
        drain_timeout_sec=drain or DEFAULT_DRAIN_SEC,
        conduit_url=conduit_url,
        conduit_token=conduit_token,
        class_filter=parse_class_list(
            env.str(("GORGE_WORKER_TASK_CLASS_FILTER", "TASK_CLASS_FILTER"), "")
        ),
        delegate_classes=delegate_classes,
        conduit_probe_sec=env.int("GORGE_WORKER_CONDUIT_PROBE_SEC", 60, min=0),
        feed_policy_file=env.str("GORGE_WORKER_FEED_POLICY_FILE", ""),
        native_test_worker=env.bool("GORGE_WORKER_NATIVE_TEST_WORKER", False),
        webhook_owner=webhook_owner,
        noop_classes=noop_classes,
        lease_wait_sec=env.int(
            "GORGE_WORKER_LEASE_WAIT_SEC", DEFAULT_LEASE_WAIT_SEC, min=0, max=MAX_LEASE_WAIT_SEC
        ),
        report_batch=env.int("GORGE_WORKER_REPORT_BATCH", DEFAULT_REPORT_BATCH, min=1, max=1000),
        report_delay_ms=env.int(
            "GORGE_WORKER_REPORT_DELAY_MS", DEFAULT_REPORT_DELAY_MS, min=0, max=1000
        ),
        delegate_concurrency=env.int(
            "GORGE_WORKER_DELEGATE_CONCURRENCY", DEFAULT_DELEGATE_CONCURRENCY, min=1, max=10_000
        ),
        warnings=(),
    )
    # Legacy-alias warnings are collected by every getter above.
    all_warnings = tuple(dict.fromkeys(list(env.warnings) + warnings))
    return WorkerSettings(**{**settings.__dict__, "warnings": all_warnings})
