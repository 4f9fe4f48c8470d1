"""gorge-worker settings: environment (with the reference's legacy names) and
twistd options -> one frozen value, validated before any network activity."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

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
# docs/worker.md, Local PHP executors.
DEFAULT_PHP_MAX_TASKS = 1000
DEFAULT_PHP_MAX_MEMORY_MB = 512
#: Where the executor script lies in a checkout or an install of gorge
#: (phorge/ beside the gorge package, as in /opt/gorge).
BUNDLED_EXECUTOR = Path(__file__).resolve().parents[2] / "phorge" / "scripts" / "gorge-executor.php"


def default_php_executors(cpus: int | None = None) -> int:
    """Two per core, as PHP tasks wait on MySQL about half the time; at least
    two and at most sixteen. On two cores this is Phorge's default of four
    taskmasters."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    return max(2, min(16, 2 * cpus))


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
    # An https queue URL: the CA bundle its certificate is checked against
    # (empty: the system's), and a client certificate of our own for a queue
    # that asks for one (GORGE_TLS_CLIENT_CA on the queue).
    queue_ca: str = ""
    queue_client_cert: str = ""
    queue_client_key: str = ""
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
    phorge_root: str = ""
    php_binary: str = "php"
    php_executor_script: str = str(BUNDLED_EXECUTOR)
    php_executors: int = field(default_factory=default_php_executors)
    php_max_tasks: int = DEFAULT_PHP_MAX_TASKS
    php_max_memory_mb: int = DEFAULT_PHP_MAX_MEMORY_MB
    heartbeat_sec: int = 15
    heartbeat_lease_sec: int = 60
    warnings: tuple[str, ...] = ()

    @property
    def delegates(self) -> bool:
        """Whether PHP tasks go anywhere: local executors or Conduit."""
        return bool(self.phorge_root or self.conduit_url)

    def describe(self) -> dict:
        """The effective configuration for the start-up log, without secrets."""
        return {
            "listen": self.http.listen_addr,
            "queue_url": self.queue_url,
            "queue_ca": self.queue_ca,
            "queue_client_cert": self.queue_client_cert,
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
            "phorge_root": self.phorge_root,
            "php_binary": self.php_binary,
            "php_executor_script": self.php_executor_script,
            "heartbeat_sec": self.heartbeat_sec,
            "heartbeat_lease_sec": self.heartbeat_lease_sec,
            "php_executors": self.php_executors,
            "php_max_tasks": self.php_max_tasks,
            "php_max_memory_mb": self.php_max_memory_mb,
        }


def check_phorge_root(value: str) -> str:
    """A Phorge checkout with Arcanist beside it, as Phorge's own scripts need."""
    root = Path(value).expanduser()
    if not (root / "scripts" / "init" / "init-script.php").is_file():
        raise ConfigError(
            "GORGE_WORKER_PHORGE_ROOT",
            f"{value} is not a Phorge checkout (no scripts/init/init-script.php)",
        )
    if not (root.resolve().parent / "arcanist" / "support" / "init" / "init-script.php").is_file():
        raise ConfigError(
            "GORGE_WORKER_PHORGE_ROOT",
            f"{value}: no Arcanist checkout beside it ({root.resolve().parent / 'arcanist'}); "
            "Phorge loads arcanist/ from next to phorge/",
        )
    return str(root.resolve())


def check_php(binary: str, script: str) -> tuple[str, str]:
    found = shutil.which(binary)
    if found is None:
        raise ConfigError("GORGE_WORKER_PHP_BINARY", f"no PHP command line at {binary!r}")
    if not Path(script).is_file():
        raise ConfigError(
            "GORGE_WORKER_PHP_EXECUTOR",
            f"no executor script at {script} (it ships as phorge/scripts/gorge-executor.php)",
        )
    return found, str(Path(script).resolve())


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
            f"{owner} needs GORGE_WORKER_PHORGE_ROOT (local PHP executors) or "
            f"GORGE_WORKER_CONDUIT_URL and GORGE_WORKER_CONDUIT_TOKEN (worker.execute): "
            f"{task_class} tasks then run in Phorge's PHP",
        )


QUEUE_TLS_SETTINGS = (
    "GORGE_WORKER_TASK_QUEUE_CA",
    "GORGE_WORKER_TASK_QUEUE_CLIENT_CERT",
    "GORGE_WORKER_TASK_QUEUE_CLIENT_KEY",
)


def load_queue_tls(env: Env, queue_url: str) -> tuple[str, str, str]:
    """The CA bundle and client certificate files for an https queue URL;
    only whether they can be read is checked here (what is in them, when
    the service is built)."""
    ca_name, cert_name, key_name = QUEUE_TLS_SETTINGS
    values = tuple(env.str(name) for name in QUEUE_TLS_SETTINGS)
    for name, path in zip(QUEUE_TLS_SETTINGS, values, strict=True):
        if not path:
            continue
        if not queue_url.startswith("https://"):
            raise ConfigError(name, "is only used with an https:// GORGE_WORKER_TASK_QUEUE_URL")
        if not os.path.isfile(path) or not os.access(path, os.R_OK):
            raise ConfigError(name, f"{path!r} is not a readable file")
    ca, cert, key = values
    if cert and not key:
        raise ConfigError(key_name, f"must be set with {cert_name}")
    if key and not cert:
        raise ConfigError(cert_name, f"must be set with {key_name}")
    return ca, cert, key


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
    queue_ca, queue_client_cert, queue_client_key = load_queue_tls(env, queue_url)
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
    phorge_raw = env.str("GORGE_WORKER_PHORGE_ROOT", "")
    phorge_root = check_phorge_root(phorge_raw) if phorge_raw else ""
    php_binary = env.str("GORGE_WORKER_PHP_BINARY", "php")
    php_script = env.str("GORGE_WORKER_PHP_EXECUTOR", str(BUNDLED_EXECUTOR))
    if phorge_root:
        php_binary, php_script = check_php(php_binary, php_script)
    # Either way of running PHP satisfies an owner that needs PHP.
    check_webhook_owner(webhook_owner, conduit_url or phorge_root, delegate_classes)
    noop_classes = parse_class_list(env.str("GORGE_WORKER_NOOP_CLASSES", ""))
    for name in noop_classes:
        if not is_php_class_name(name):
            raise ConfigError("GORGE_WORKER_NOOP_CLASSES", f"not a task class name: {name[:80]!r}")
    warnings = list(env.warnings)
    if delegate_classes and not conduit_url and not phorge_root:
        warnings.append(
            "GORGE_WORKER_DELEGATE_CLASSES has no effect without GORGE_WORKER_PHORGE_ROOT "
            "or GORGE_WORKER_CONDUIT_URL"
        )
    if phorge_root and conduit_url:
        warnings.append(
            "GORGE_WORKER_CONDUIT_URL is not used for PHP tasks while GORGE_WORKER_PHORGE_ROOT "
            "is set: they run in local PHP executors"
        )
    settings = WorkerSettings(
        http=http,
        queue_url=queue_url,
        queue_token=env.str(("GORGE_WORKER_TASK_QUEUE_TOKEN", "TASK_QUEUE_TOKEN"), ""),
        queue_ca=queue_ca,
        queue_client_cert=queue_client_cert,
        queue_client_key=queue_client_key,
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
        phorge_root=phorge_root,
        php_binary=php_binary,
        php_executor_script=php_script,
        php_executors=env.int(
            "GORGE_WORKER_PHP_EXECUTORS", default_php_executors(), min=1, max=256
        ),
        php_max_tasks=env.int(
            "GORGE_WORKER_PHP_MAX_TASKS", DEFAULT_PHP_MAX_TASKS, min=1, max=10_000_000
        ),
        php_max_memory_mb=env.int(
            "GORGE_WORKER_PHP_MAX_MEMORY_MB", DEFAULT_PHP_MAX_MEMORY_MB, min=16, max=65_536
        ),
        heartbeat_sec=env.int("GORGE_WORKER_HEARTBEAT_SEC", 15, min=1, max=3600),
        heartbeat_lease_sec=env.int("GORGE_WORKER_HEARTBEAT_LEASE_SEC", 60, min=5, max=86_400),
        warnings=(),
    )
    # Legacy-alias warnings are collected by every getter above.
    all_warnings = tuple(dict.fromkeys(list(env.warnings) + warnings))
    return WorkerSettings(**{**settings.__dict__, "warnings": all_warnings})
