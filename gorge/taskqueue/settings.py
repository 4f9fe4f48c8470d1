"""gorge-taskqueue configuration from the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from gorge.config import (
    ConfigError,
    Env,
    HttpSettings,
    MySQLSettings,
    load_http_settings,
    load_mysql_tls,
)
from gorge.db.redis import RedisSettings, parse_redis_addr
from gorge.db.topology import TopologySource
from gorge.taskqueue.model import DEFAULT_LEASE_DURATION, DEFAULT_RETRY_WAIT, UINT32_MAX

DEFAULT_LISTEN = ":8090"
BACKENDS = ("mysql", "redis", "sqlite")


@dataclass(frozen=True)
class TaskQueueSettings:
    http: HttpSettings
    backend: str = "mysql"
    mysql: MySQLSettings = MySQLSettings(database="phorge_worker")
    redis: RedisSettings = RedisSettings()
    redis_key_prefix: str = "gorge:tq:"
    sqlite_path: str = "gorge-taskqueue.sqlite3"
    lease_duration: int = DEFAULT_LEASE_DURATION
    retry_wait: int = DEFAULT_RETRY_WAIT
    drain_timeout: float = 10.0
    stats_interval: float = 15.0
    # docs/taskqueue.md, Long-poll: the shared check while lease calls wait.
    wake_check_ms: int = 15
    # GORGE_TASKQUEUE_MYSQL_TOPOLOGY_FILE: Phorge's cluster.databases, which
    # ``mysql`` was resolved from and is read again on SIGHUP.
    topology: TopologySource | None = None
    # What the daemon logs at start-up as TASKQUEUE_CONFIG_WARNING.
    warnings: tuple[str, ...] = ()


def load_taskqueue_settings(
    environ: Mapping[str, str], *, listen: str | None = None
) -> TaskQueueSettings:
    """Parse once; the first bad value raises :class:`ConfigError` naming it."""
    env = Env(environ, "gorge-taskqueue")
    http = load_http_settings(env, default_listen=DEFAULT_LISTEN, listen_override=listen)
    backend = env.choice("GORGE_TASKQUEUE_BACKEND", "mysql", BACKENDS)
    tls, tls_ca = load_mysql_tls(env, "GORGE_TASKQUEUE_MYSQL_TLS", "GORGE_TASKQUEUE_MYSQL_TLS_CA")
    mysql = MySQLSettings(
        host=env.str("GORGE_TASKQUEUE_MYSQL_HOST", "127.0.0.1"),
        port=env.int("GORGE_TASKQUEUE_MYSQL_PORT", 3306, min=1, max=65535),
        user=env.str("GORGE_TASKQUEUE_MYSQL_USER", "phorge"),
        password=env.str("GORGE_TASKQUEUE_MYSQL_PASS", ""),
        database=env.str("GORGE_TASKQUEUE_NAMESPACE", "phorge") + "_worker",
        max_connections=25,
        tls=tls,
        tls_ca=tls_ca,
    )
    topology = None
    topology_file = env.str("GORGE_TASKQUEUE_MYSQL_TOPOLOGY_FILE", "")
    if topology_file and backend == "mysql":
        # Where Phorge writes its tasks: the worker partition's master.
        topology = TopologySource(
            topology_file, "worker", "GORGE_TASKQUEUE_MYSQL_TOPOLOGY_FILE", base=mysql
        )
        mysql = topology.load()
    redis = RedisSettings()
    prefix = "gorge:tq:"
    if backend == "redis":
        addr = env.str("GORGE_TASKQUEUE_REDIS_ADDR", "127.0.0.1:6379")
        try:
            host, port = parse_redis_addr(addr)
        except ValueError as e:
            raise ConfigError("GORGE_TASKQUEUE_REDIS_ADDR", str(e)) from None
        sentinels = []
        for item in env.str("GORGE_TASKQUEUE_REDIS_SENTINELS", "").split(","):
            if item.strip():
                try:
                    sentinels.append(parse_redis_addr(item))
                except ValueError as e:
                    raise ConfigError("GORGE_TASKQUEUE_REDIS_SENTINELS", str(e)) from None
        redis_tls = env.choice("GORGE_TASKQUEUE_REDIS_TLS", "disabled", ("disabled", "verify"))
        redis_tls_ca = env.str("GORGE_TASKQUEUE_REDIS_TLS_CA", "")
        if redis_tls_ca and redis_tls == "disabled":
            raise ConfigError(
                "GORGE_TASKQUEUE_REDIS_TLS_CA", "set GORGE_TASKQUEUE_REDIS_TLS=verify"
            )
        if redis_tls_ca and not os.path.isfile(redis_tls_ca):
            raise ConfigError("GORGE_TASKQUEUE_REDIS_TLS_CA", f"no such file: {redis_tls_ca}")
        if sentinels and redis_tls != "disabled":
            # txredisapi connects to the master Sentinel names over plain TCP.
            raise ConfigError("GORGE_TASKQUEUE_REDIS_TLS", "TLS is not supported with Sentinel")
        redis = RedisSettings(
            host=host,
            port=port,
            db=env.int("GORGE_TASKQUEUE_REDIS_DB", 0, min=0),
            password=env.str("GORGE_TASKQUEUE_REDIS_PASSWORD", ""),
            poolsize=25,
            username=env.str("GORGE_TASKQUEUE_REDIS_USERNAME", ""),
            tls=redis_tls,
            tls_ca=redis_tls_ca,
            sentinels=tuple(sentinels),
            sentinel_service=env.str("GORGE_TASKQUEUE_REDIS_SENTINEL_SERVICE", "mymaster"),
        )
        prefix = env.str("GORGE_TASKQUEUE_REDIS_KEY_PREFIX", prefix)
    sqlite_path = "gorge-taskqueue.sqlite3"
    if backend == "sqlite":
        sqlite_path = env.str("GORGE_TASKQUEUE_SQLITE_PATH", sqlite_path)
    settings = TaskQueueSettings(
        http=http,
        backend=backend,
        mysql=mysql,
        redis=redis,
        redis_key_prefix=prefix,
        sqlite_path=sqlite_path,
        lease_duration=env.int(
            "GORGE_TASKQUEUE_LEASE_DURATION", DEFAULT_LEASE_DURATION, min=1, max=UINT32_MAX
        ),
        retry_wait=env.int("GORGE_TASKQUEUE_RETRY_WAIT", DEFAULT_RETRY_WAIT, min=0, max=UINT32_MAX),
        wake_check_ms=env.int("GORGE_TASKQUEUE_WAKE_CHECK_MS", 15, min=1, max=60_000),
        topology=topology,
        # Legacy names, collected by every getter above.
        warnings=tuple(env.warnings),
    )
    return settings
