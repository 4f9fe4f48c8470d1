"""``grants.<daemon>``: each daemon's MySQL account may do what the daemon
does to Phorge's tables, and no DDL (the schema is Phorge's)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gorge.cli.doctor.grants import DDL, parse_grants
from gorge.cli.doctor.report import Check, fail, ok, warn
from gorge.cli.doctor.site import Site
from gorge.config import ConfigError, MySQLSettings

WORKER_TABLES = ("worker_activetask", "worker_archivetask", "worker_taskdata", "lisk_counter")
QUEUE_NEEDS = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE"})


def check_grants(site: Site, connect: Callable[[MySQLSettings], Any]) -> list[Check]:
    checks = []
    queue = site.daemons.get("taskqueue")
    if queue is not None:
        backend = queue.env.get("GORGE_TASKQUEUE_BACKEND") or "mysql"
        if backend != "mysql":
            checks.append(
                fail(
                    "grants.taskqueue",
                    f"GORGE_TASKQUEUE_BACKEND={backend}: stock Phorge writes its tasks to MySQL",
                    "GORGE_TASKQUEUE_BACKEND=mysql",
                )
            )
        else:
            try:
                settings = site.taskqueue_settings()
            except ConfigError as e:
                return [
                    fail(
                        "grants.taskqueue",
                        f"gorge-taskqueue's settings: {e}",
                        "correct taskqueue.env",
                    )
                ]
            assert settings is not None
            needs = {table: QUEUE_NEEDS for table in WORKER_TABLES}
            checks.append(_grants("grants.taskqueue", settings.mysql, needs, connect))
    try:
        webhook = site.webhook_settings()
    except ConfigError:
        webhook = None  # check_namespace names it
    if webhook is not None:
        hook_needs = {
            "herald_webhook": frozenset({"SELECT"}),
            "herald_webhookrequest": frozenset({"SELECT", "UPDATE"}),
        }
        checks.append(_grants("grants.webhook", webhook.mysql, hook_needs, connect))
    return checks


def _grants(name: str, mysql: MySQLSettings, needs: Mapping[str, frozenset[str]], connect) -> Check:
    account = f"{mysql.user}@{mysql.host}:{mysql.port}"
    try:
        connection = connect(mysql)
    except Exception as e:  # noqa: BLE001 - any driver error is the answer
        from gorge.db.mysql import error_reason

        return fail(
            name,
            f"{account} cannot open {mysql.database}: {error_reason(e)}",
            f"check the MySQL settings and that {mysql.database} exists (the namespace)",
        )
    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW GRANTS FOR CURRENT_USER()")
            lines = [row[0] for row in cursor.fetchall()]
    finally:
        connection.close()
    grants = parse_grants(lines)
    missing = []
    ddl: set[str] = set()
    for table, privileges in needs.items():
        held = grants.on(mysql.database, table)
        lacking = privileges - held
        if lacking:
            missing.append(f"{', '.join(sorted(lacking))} on {table}")
        ddl |= held & DDL
    if missing:
        via_roles = " (grants through roles are not followed)" if grants.roles else ""
        return fail(
            name,
            f"{account} lacks {'; '.join(missing)} in {mysql.database}{via_roles}",
            f"GRANT {', '.join(sorted(set().union(*needs.values())))} ON `{mysql.database}`.* "
            f"TO the daemon's account",
        )
    if ddl:
        return warn(
            name,
            f"{account} may also {', '.join(sorted(ddl))} in {mysql.database}",
            "the schema is Phorge's: give the daemon's account no DDL rights",
        )
    return ok(name, f"{account} has what it needs in {mysql.database}, no DDL")
