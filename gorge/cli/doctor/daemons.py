"""``gorge-<daemon>`` and ``version.<daemon>``: each deployed daemon answers
``/readyz`` as ready, takes the service token from its settings file, and
speaks an API this gorge and the Phorge library can use."""

from __future__ import annotations

from gorge.cli.apiclient import Refused, ServiceUnavailable
from gorge.cli.doctor.report import GUIDE, OK, Check, fail, ok
from gorge.cli.doctor.site import TOKEN_PROBE, Daemon, Site
from gorge.cli.doctor.version import check_version


def check_daemons(site: Site) -> list[Check]:
    """Each deployed daemon ready with its token, then (when it is) the API
    version it speaks (gorge/cli/doctor/version.py)."""
    library_needs = site.phorge.gorge_api_version if site.phorge is not None else None
    checks = []
    for daemon in site.daemons.values():
        ready = _daemon(daemon, site.timeout)
        checks.append(ready)
        if ready.status == OK:
            checks.append(check_version(daemon, site.timeout, library_needs))
    for name in ("taskqueue", "worker"):
        if name not in site.daemons:
            checks.append(
                fail(
                    f"gorge-{name}",
                    "not deployed (no settings file)",
                    f"create {name}.env from conf/{name}.env.example ({GUIDE}, before you start)",
                )
            )
    return checks


def _daemon(daemon: Daemon, timeout: float) -> Check:
    name = daemon.product
    unit = f"systemctl status {name}; its log says why"
    try:
        status, body = daemon.plain_get("/readyz", timeout)
    except OSError as e:
        reason = getattr(e, "reason", e)
        return fail(
            name, f"no answer at {daemon.url} ({reason})", f"start it: systemctl start {name}"
        )
    if status != 200:
        reason = body.get("reason") if isinstance(body, dict) else None
        return fail(name, f"not ready at {daemon.url}: {reason or f'HTTP {status}'}", unit)
    try:
        daemon.api(timeout).get(TOKEN_PROBE[daemon.name])
    except ServiceUnavailable as e:
        return fail(
            name,
            str(e),
            f"GORGE_SERVICE_TOKEN in {daemon.name}.env must be the running daemon's; "
            f"restart it after changing the file",
        )
    except Refused as e:
        return fail(name, f"refused the doctor's call: {e.message}", unit)
    return ok(name, f"ready at {daemon.url}, service token accepted")
