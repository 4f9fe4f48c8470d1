"""The webhook prerequisites: one owner of Herald's webhooks (Phorge's
worker or gorge-webhook, never both), the same outbound policy, and the same
``phabricator.silent`` on both sides."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from pathlib import Path
from typing import Any

from gorge.cli.doctor.report import Check, fail, ok
from gorge.cli.doctor.site import Site, webhook_against_phorge
from gorge.webhook import silent as webhook_silent
from gorge.webhook.settings import WebhookSettings


def check_webhook_owner(site: Site) -> list[Check]:
    name = "webhook-owner"
    worker = site.daemons.get("worker")
    if worker is None:
        return []
    stats = site.worker_stats()
    owner = stats.get("webhookOwner") if isinstance(stats, dict) else None
    source = "gorge-worker reports"
    if not isinstance(owner, str):
        owner = worker.env.get("GORGE_WORKER_WEBHOOK_OWNER", "")
        source = "worker.env says"
    deployed = "webhook" in site.daemons
    if deployed and owner != "gorge-webhook":
        return [
            fail(
                name,
                f"gorge-webhook is deployed but {source} GORGE_WORKER_WEBHOOK_OWNER={owner!r}: "
                "Phorge's HeraldWebhookWorker would deliver beside it",
                "GORGE_WORKER_WEBHOOK_OWNER=gorge-webhook in worker.env, restart gorge-worker",
            )
        ]
    if not deployed and owner == "gorge-webhook":
        return [
            fail(
                name,
                f"{source} GORGE_WORKER_WEBHOOK_OWNER=gorge-webhook but gorge-webhook is not "
                "deployed: no one delivers webhooks",
                "deploy gorge-webhook (webhook.env), or GORGE_WORKER_WEBHOOK_OWNER=phorge",
            )
        ]
    named = _daemons_setting(site)
    if named is not None and ("webhook" in named) != deployed:
        return [
            fail(
                name,
                f"gorge.daemons {'names' if 'webhook' in named else 'leaves out'} gorge-webhook, "
                f"which is {'' if deployed else 'not '}deployed: Phorge's setup check disagrees",
                "make gorge.daemons name exactly the deployed daemons "
                "(./bin/config set gorge.daemons)",
            )
        ]
    return [
        ok(
            name,
            f"{source} {owner or 'unset'}, "
            f"gorge-webhook {'deployed' if deployed else 'not deployed'}",
        )
    ]


def _daemons_setting(site: Site) -> dict | None:
    if site.phorge is None:
        return None
    value = site.setting("gorge.daemons")
    return value if isinstance(value, dict) and value else None


def _networks(items: Any) -> set | None:
    try:
        return {ipaddress.ip_network(str(item), strict=False) for item in items or ()}
    except ValueError:
        return None


def _few(items: list[str]) -> str:
    return ", ".join(items[:4]) + (" ..." if len(items) > 4 else "")


def check_outbound_policy(site: Site) -> list[Check]:
    name = "outbound-policy"
    webhook = webhook_against_phorge(site, name)
    if isinstance(webhook, list):
        return webhook
    phorge = _networks(site.setting("security.outbound-blacklist"))
    ours = set(webhook.outbound_blacklist)
    if phorge is None:
        return [fail(name, "security.outbound-blacklist is not a list of networks", "correct it")]
    if phorge == ours:
        return [ok(name, f"gorge-webhook refuses the same {len(ours)} networks as Phorge")]
    only_phorge = sorted(str(n) for n in phorge - ours)
    only_ours = sorted(str(n) for n in ours - phorge)
    parts = []
    if only_phorge:
        parts.append(f"Phorge refuses {_few(only_phorge)} and gorge-webhook does not")
    if only_ours:
        parts.append(f"gorge-webhook refuses {_few(only_ours)} and Phorge does not")
    value = ",".join(str(n) for n in sorted(phorge, key=str)) or "none"
    return [
        fail(
            name,
            "; ".join(parts),
            f"GORGE_WEBHOOK_OUTBOUND_BLACKLIST={value} in webhook.env "
            "(empty for Phorge's default), restart gorge-webhook",
        )
    ]


def read_silent(settings: WebhookSettings, connect) -> tuple[bool, str]:
    """``phabricator.silent`` where gorge-webhook reads it (gorge/webhook/silent.py)."""
    if webhook_silent.SOURCE_DATABASE in settings.silent_from:
        conn = connect(dataclasses.replace(settings.mysql, database=settings.config_database))
        try:
            with conn.cursor() as cursor:
                cursor.execute(
                    webhook_silent.SQL_SILENT.format(database=settings.config_database),
                    (webhook_silent.CONFIG_NAMESPACE, webhook_silent.KEY),
                )
                rows = cursor.fetchall()
        finally:
            conn.close()
        if rows:
            raw = rows[0][0]
            text = raw.decode() if isinstance(raw, (bytes, bytearray)) else str(raw)
            return webhook_silent.php_truthy(json.loads(text)), "database"
    if webhook_silent.SOURCE_LOCAL in settings.silent_from and settings.phorge_root:
        path = Path(settings.phorge_root) / webhook_silent.LOCAL_JSON
        if path.exists():
            document = json.loads(path.read_text())
            if isinstance(document, dict) and webhook_silent.KEY in document:
                return webhook_silent.php_truthy(document[webhook_silent.KEY]), "local"
    return False, "default"


def check_silent(site: Site, connect) -> list[Check]:
    name = "silent"
    webhook = webhook_against_phorge(site, name)
    if isinstance(webhook, list):
        return webhook
    phorge = webhook_silent.php_truthy(site.setting("phabricator.silent"))
    try:
        ours, source = read_silent(webhook, connect)
    except Exception as e:  # noqa: BLE001 - unreadable is the answer
        return [
            fail(
                name,
                f"cannot read phabricator.silent where gorge-webhook does: {e}",
                "see docs/webhook.md, Silent mode",
            )
        ]
    sources = ",".join(webhook.silent_from) or "none"
    if phorge == ours:
        return [
            ok(
                name,
                f"phabricator.silent is {str(phorge).lower()} "
                f"for Phorge and gorge-webhook ({source})",
            )
        ]
    return [
        fail(
            name,
            f"Phorge is {'silent' if phorge else 'not silent'} but gorge-webhook reads "
            f"{str(ours).lower()} ({source}; GORGE_WEBHOOK_SILENT_FROM={sources}): "
            + (
                "it would deliver webhooks Phorge keeps back"
                if phorge
                else "it would fail every webhook"
            ),
            "set phabricator.silent with ./bin/config set (local or database, where gorge-webhook "
            "reads it; GORGE_WEBHOOK_PHORGE_ROOT for local.json), not in an environment file",
        )
    ]
