"""``mailer``: Phorge tries the gorge mailer first, at gorge-mailer's
address and with its token."""

from __future__ import annotations

from gorge.cli.doctor.report import GUIDE, Check, fail, ok
from gorge.cli.doctor.site import Site, needs_phorge


def mailer_order(mailers: list) -> list[dict]:
    """Outbound mailers in the order Phorge tries them (PhabricatorMetaMTAMail::newMailers):
    by ``priority``, highest first; without one, -1, -2, ... in list order. Mailers of one
    priority are shuffled, so the order is a list of groups flattened."""
    next_priority = -1
    ranked = []
    for spec in mailers:
        if not isinstance(spec, dict):
            continue
        priority = spec.get("priority")
        if not priority:
            priority = next_priority
            next_priority -= 1
        if spec.get("outbound", True):
            ranked.append({**spec, "_priority": priority})
    return sorted(ranked, key=lambda s: -s["_priority"])


def check_mailer(site: Site) -> list[Check]:
    name = "mailer"
    if "mailer" not in site.daemons:
        return []
    if (skipped := needs_phorge(site, name)) is not None:
        return [skipped]
    mailer = site.daemons["mailer"]
    mailers = site.setting("cluster.mailers") or []
    ordered = mailer_order(mailers if isinstance(mailers, list) else [])
    ours = [s for s in ordered if s.get("type") == "gorge"]
    entry_fix = f"add an entry of type gorge first in cluster.mailers ({GUIDE}, step 3)"
    if not ours:
        return [
            fail(
                name,
                "cluster.mailers has no entry of type gorge: Phorge sends mail itself",
                entry_fix,
            )
        ]
    first = ours[0]
    if ordered[0] is not first and ordered[0]["_priority"] >= first["_priority"]:
        tied = ordered[0]["_priority"] == first["_priority"]
        return [
            fail(
                name,
                f"Phorge tries {ordered[0].get('key')!r} "
                f"{'as often as' if tied else 'before'} the gorge entry",
                "put the gorge entry first (or give it the highest priority)",
            )
        ]
    options = first.get("options") or {}
    uri = str(options.get("uri", "")).rstrip("/")
    if uri != mailer.url:
        return [
            fail(
                name,
                f"the gorge entry's uri is {uri!r}, gorge-mailer listens at {mailer.url}",
                f"set its uri to {mailer.url}",
            )
        ]
    if str(options.get("token", "")) != mailer.token:
        return [
            fail(
                name,
                "the gorge entry's token is not gorge-mailer's GORGE_SERVICE_TOKEN",
                "copy mailer.env's GORGE_SERVICE_TOKEN into the entry's options.token",
            )
        ]
    return [
        ok(
            name,
            f"{first.get('key')!r} (type gorge, {mailer.url}) is the first mailer Phorge tries",
        )
    ]
