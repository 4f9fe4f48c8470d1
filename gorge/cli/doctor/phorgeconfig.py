"""The prerequisites read from Phorge's configuration: the gorge library
loaded, Phorge's own taskmasters stopped, and one namespace for Phorge and
the daemons."""

from __future__ import annotations

import json
from typing import Any

from gorge.cli.doctor.report import Check, fail, ok, skip
from gorge.cli.doctor.site import LIBRARY, Site, needs_phorge
from gorge.config import ConfigError


def check_library(site: Site) -> list[Check]:
    name = "library"
    if (skipped := needs_phorge(site, name)) is not None:
        return [skipped]
    assert site.phorge is not None
    libraries = site.setting("load-libraries") or []
    fix = (
        f"./bin/config set load-libraries '{json.dumps([*_as_list(libraries), str(LIBRARY)])}'"
        " (keep the entries already there)"
    )
    if not site.phorge.gorge_loaded:
        return [
            fail(name, f"Phorge does not load the gorge library (load-libraries: {libraries})", fix)
        ]
    if not (site.phorge.worker_execute and site.phorge.gorge_mailer):
        return [
            fail(name, "the gorge library loaded without worker.execute or the mail adapter", fix)
        ]
    return [ok(name, "Phorge loads the gorge library (worker.execute, the gorge mailer)")]


def _as_list(value: Any) -> list:
    if isinstance(value, dict):
        return list(value.values())
    return list(value) if isinstance(value, list) else []


def check_taskmasters(site: Site) -> list[Check]:
    name = "taskmasters"
    if (skipped := needs_phorge(site, name)) is not None:
        return [skipped]
    assert site.phorge is not None
    count = site.setting("phd.taskmasters")
    if count != 0:
        return [
            fail(
                name,
                f"phd.taskmasters is {count}: Phorge's taskmasters run tasks beside gorge-worker",
                "./bin/config set phd.taskmasters 0; ./bin/phd stop; ./bin/phd start --keep-leases",
            )
        ]
    running = site.phorge.running_taskmasters
    if running:
        return [
            fail(
                name,
                f"phd.taskmasters is 0 but {running} taskmaster daemon(s) still run",
                "./bin/phd stop; ./bin/phd start --keep-leases",
            )
        ]
    return [ok(name, "phd.taskmasters is 0 and no taskmaster runs")]


def check_namespace(site: Site) -> list[Check]:
    name = "namespace"
    ours: dict[str, str] = {}
    queue = site.daemons.get("taskqueue")
    if queue is not None:
        ours["GORGE_TASKQUEUE_NAMESPACE"] = queue.env.get("GORGE_TASKQUEUE_NAMESPACE") or "phorge"
    try:
        webhook = site.webhook_settings()
    except ConfigError as e:
        return [fail(name, f"gorge-webhook's settings: {e}", "correct webhook.env")]
    if webhook is not None:
        ours["GORGE_WEBHOOK_NAMESPACE"] = webhook.namespace
    if site.phorge is None:
        values = set(ours.values())
        if len(values) > 1:
            return [
                fail(name, f"the daemons disagree: {ours}", "set both to storage.default-namespace")
            ]
        return [skip(name, f"Phorge's configuration not read ({site.phorge_problem})")]
    phorge = site.setting("storage.default-namespace")
    wrong = {k: v for k, v in ours.items() if v != phorge}
    if wrong:
        settings = ", ".join(f"{k}={v}" for k, v in wrong.items())
        return [
            fail(
                name,
                f"storage.default-namespace is {phorge!r} but {settings}",
                f"set {' and '.join(wrong)} to {phorge} and restart the daemon(s)",
            )
        ]
    return [ok(name, f"{phorge!r} everywhere")]
