"""gorge-webhook settings: environment -> one frozen dataclass."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gorge.config import (
    ConfigError,
    Env,
    HttpSettings,
    MySQLSettings,
    load_http_settings,
    load_mysql_tls,
)
from gorge.db.topology import TopologySource

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Phorge's default security.outbound-blacklist, in its order.
DEFAULT_OUTBOUND_BLACKLIST = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "255.255.255.255/32",
    "::/128",
    "::1/128",
    "::ffff:0:0/96",
    "100::/64",
    "64:ff9b::/96",
    "2001::/32",
    "2001:10::/28",
    "2001:20::/28",
    "2001:db8::/32",
    "2002::/16",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
)

BLACKLIST_VAR = "GORGE_WEBHOOK_OUTBOUND_BLACKLIST"


def parse_blacklist(text: str | None) -> tuple[IPNetwork, ...]:
    """CIDR list; None (unset or empty) is Phorge's default, ``none`` is empty.

    A value with no items at all (blank, or only commas as a badly
    interpolated "${A},${B}" gives) also means the default: only the explicit
    ``none`` may switch the guard off.
    """
    if text is not None and text.strip().lower() == "none":
        return ()
    items = [item.strip() for item in (text or "").split(",") if item.strip()]
    if not items:
        items = list(DEFAULT_OUTBOUND_BLACKLIST)
    networks = []
    for item in items:
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ConfigError(BLACKLIST_VAR, f"not a network: {item!r}") from None
    return tuple(networks)


SILENT_FROM_VAR = "GORGE_WEBHOOK_SILENT_FROM"
PHORGE_ROOT_VAR = "GORGE_WEBHOOK_PHORGE_ROOT"
SILENT_SOURCES = ("database", "local")
_NAMESPACE = re.compile(r"[A-Za-z0-9_]+\Z")


def parse_silent_from(text: str | None, phorge_root: str) -> tuple[str, ...]:
    """Where ``phabricator.silent`` is read: ``database``, ``local`` (both by
    default when the Phorge root is known, else the database), or ``none``."""
    if text is None or not text.strip():
        return ("database", "local") if phorge_root else ("database",)
    if text.strip().lower() == "none":
        return ()
    sources = []
    for item in (part.strip().lower() for part in text.split(",")):
        if item not in SILENT_SOURCES:
            raise ConfigError(
                SILENT_FROM_VAR, f"{item!r}: expected database, local (comma-separated) or none"
            )
        if item not in sources:
            sources.append(item)
    if "local" in sources and not phorge_root:
        raise ConfigError(SILENT_FROM_VAR, f"local needs {PHORGE_ROOT_VAR} (where Phorge lives)")
    return tuple(sources)


# Deliveries in progress per process. 8 left a daemon waiting on round trips
# with CPU to spare: bench/webhook.py (2,000 rows over 50 hooks) delivered
# 470-510/s at 8 and 700-920/s at 16. A hook still has at most one.
DEFAULT_MAX_CONCURRENT = 16
# A count by status reads Phorge's whole delivery history (sitecounts.py).
DEFAULT_SITE_STATS_MAX_AGE = 30


@dataclass(frozen=True)
class WebhookSettings:
    http: HttpSettings
    mysql: MySQLSettings
    poll_interval: float = 1.0
    delivery_timeout: int = 15
    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    breaker_window: int = 300
    breaker_threshold: int = 10
    retry_backoff: int = 60
    claim_lease: int = 30
    outbound_blacklist: tuple[IPNetwork, ...] = field(default=(), repr=False)
    # Standard Webhooks headers (webhook-id, -timestamp, -signature) next to Phorge's.
    standard_headers: bool = False
    # The longest wait a receiver's Retry-After may impose on one request.
    retry_after_max: int = 3600
    # Phorge's silent mode (gorge/webhook/silent.py): where it is read, how
    # often, and from which database / Phorge root. Built directly (tests, the
    # demo) it is not read; the environment's loader reads the database.
    silent_from: tuple[str, ...] = ()
    silent_recheck: int = 10
    config_database: str = ""
    phorge_root: str = ""
    # Phorge's storage.default-namespace ("" = the herald database's name
    # without "_herald"), and whether the per-hook lock is taken (hooklock.py).
    namespace: str = ""
    hook_lock: bool = True
    # The longest a site-wide count in ``stats`` is reused (sitecounts.py).
    site_stats_max_age: int = DEFAULT_SITE_STATS_MAX_AGE
    # GORGE_WEBHOOK_MYSQL_TOPOLOGY_FILE: Phorge's cluster.databases, which
    # ``mysql`` was resolved from and is read again on SIGHUP.
    topology: TopologySource | None = None
    # What the daemon logs at start-up as WEBHOOK_CONFIG_WARNING.
    warnings: tuple[str, ...] = ()

    @property
    def lock_namespace(self) -> str:
        """The namespace Phorge digests into its lock names."""
        if self.namespace:
            return self.namespace
        database = self.mysql.database
        return database[: -len("_herald")] if database.endswith("_herald") else database

    @property
    def effective_lease(self) -> int:
        """A lease shorter than one delivery would let a poller re-claim a row in flight."""
        return max(self.claim_lease, self.delivery_timeout)

    @property
    def effective_retry(self) -> int:
        """A failure write refreshes both the lease and the backoff clock."""
        return max(self.effective_lease, self.retry_backoff)

    @property
    def shutdown_budget(self) -> float:
        return self.delivery_timeout + 10.0

    def startup_warnings(self) -> list[str]:
        warnings = []
        if self.claim_lease < self.delivery_timeout:
            warnings.append(
                f"GORGE_WEBHOOK_CLAIM_LEASE_SEC={self.claim_lease} raised to the delivery "
                f"timeout: the effective lease is {self.effective_lease}s"
            )
        if self.retry_backoff < self.effective_lease:
            warnings.append(
                f"GORGE_WEBHOOK_RETRY_BACKOFF_SEC={self.retry_backoff} is below the lease: "
                f"failed requests are retried every {self.effective_retry}s"
            )
        if self.effective_lease < self.delivery_timeout + 2:
            warnings.append(
                f"effective lease {self.effective_lease}s leaves under 2s of margin over the "
                f"delivery timeout {self.delivery_timeout}s"
            )
        return warnings


def load_webhook_settings(
    environ: Mapping[str, str], *, listen: str | None = None, env: Env | None = None
) -> WebhookSettings:
    env = env if env is not None else Env(environ, "gorge-webhook")

    def name(setting: str) -> tuple[str, str]:
        return (f"GORGE_WEBHOOK_{setting}", setting)

    http = load_http_settings(
        env, default_listen=":8160", listen_override=listen, legacy_names=True
    )
    namespace = env.str(("GORGE_WEBHOOK_NAMESPACE", "STORAGE_NAMESPACE"), "phorge")
    if not _NAMESPACE.match(namespace):
        raise ConfigError("GORGE_WEBHOOK_NAMESPACE", f"{namespace!r}: letters, digits and _ only")
    phorge_root = env.str(PHORGE_ROOT_VAR, "")
    if phorge_root and not os.path.isdir(phorge_root):
        raise ConfigError(PHORGE_ROOT_VAR, f"{phorge_root!r} is not a directory")
    tls, tls_ca = load_mysql_tls(env, "GORGE_WEBHOOK_MYSQL_TLS", "GORGE_WEBHOOK_MYSQL_TLS_CA")
    mysql = MySQLSettings(
        host=env.str(name("MYSQL_HOST"), "127.0.0.1"),
        port=env.int(name("MYSQL_PORT"), 3306, min=1, max=65535),
        user=env.str(name("MYSQL_USER"), "phorge"),
        password=env.str(name("MYSQL_PASS"), ""),
        database=f"{namespace}_herald",
        tls=tls,
        tls_ca=tls_ca,
    )
    topology = None
    topology_file = env.str("GORGE_WEBHOOK_MYSQL_TOPOLOGY_FILE", "")
    if topology_file:
        # Where Phorge writes the herald rows: that partition's master.
        topology = TopologySource(
            topology_file, "herald", "GORGE_WEBHOOK_MYSQL_TOPOLOGY_FILE", base=mysql
        )
        mysql = topology.load()
    settings = WebhookSettings(
        http=http,
        mysql=mysql,
        poll_interval=env.int(name("POLL_INTERVAL_MS"), 1000, min=1) / 1000.0,
        delivery_timeout=env.int(name("DELIVERY_TIMEOUT"), 15, min=1),
        max_concurrent=env.int(name("MAX_CONCURRENT"), DEFAULT_MAX_CONCURRENT, min=1),
        breaker_window=env.int(name("ERROR_BACKOFF_SEC"), 300, min=0),
        breaker_threshold=env.int(name("ERROR_THRESHOLD"), 10, min=1),
        retry_backoff=env.int("GORGE_WEBHOOK_RETRY_BACKOFF_SEC", 60, min=0),
        claim_lease=env.int("GORGE_WEBHOOK_CLAIM_LEASE_SEC", 30, min=0),
        outbound_blacklist=parse_blacklist(env.raw(BLACKLIST_VAR)),
        standard_headers=env.bool("GORGE_WEBHOOK_STANDARD_HEADERS", False),
        retry_after_max=env.int("GORGE_WEBHOOK_RETRY_AFTER_MAX_SEC", 3600, min=0),
        silent_from=parse_silent_from(env.raw(SILENT_FROM_VAR), phorge_root),
        silent_recheck=env.int("GORGE_WEBHOOK_SILENT_RECHECK_SEC", 10, min=1),
        config_database=f"{namespace}_config",
        phorge_root=phorge_root,
        namespace=namespace,
        hook_lock=env.bool("GORGE_WEBHOOK_HOOK_LOCK", True),
        site_stats_max_age=env.int(
            "GORGE_WEBHOOK_SITE_STATS_MAX_AGE_SEC", DEFAULT_SITE_STATS_MAX_AGE, min=1
        ),
        topology=topology,
    )
    # Legacy names (collected by every getter above), then the combinations
    # that work but not as one might expect.
    warnings = tuple(dict.fromkeys([*env.warnings, *settings.startup_warnings()]))
    return dataclasses.replace(settings, warnings=warnings)
