"""``version.<daemon>``: does each daemon speak the API this gorge and the
Phorge library were written against?

Each daemon answers ``GET /api/<service>/version`` (gorge/web/version.py)
with its release and ``apiVersion``, the ``info.version`` of its OpenAPI
document. The rule is the library's (GorgeDaemonHealth::isCompatibleVersion):
the same major version, and no older than what the reader needs. Two readers
need it here: this gorge's own copy of the API (its installed
``gorge/<service>/openapi.json``, what ``gorge queue`` and the other commands
call) and the Phorge library's ``GorgeDaemon::REQUIRED_API_VERSION``, which
Phorge's setup check holds the daemon to.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gorge.cli.apiclient import Refused, ServiceUnavailable
from gorge.cli.doctor.report import Check, fail, ok, warn
from gorge.cli.doctor.site import Daemon
from gorge.web.version import api_version, package_version

_VERSION = re.compile(r"([0-9]+)\.([0-9]+)(?:\.([0-9]+))?")


def parse_version(text: object) -> tuple[int, int, int] | None:
    """``major.minor[.patch]`` as numbers; None for anything else."""
    if not isinstance(text, str):
        return None
    match = _VERSION.fullmatch(text.strip())
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def compatible(actual: str, required: str) -> bool:
    """The library's rule: same major version, and ``actual`` >= ``required``."""
    have, need = parse_version(actual), parse_version(required)
    if have is None or need is None:
        return False
    return have[0] == need[0] and have >= need


def expected_api_version(daemon_name: str) -> str:
    """The API version this gorge's own copy of the daemon's API says."""
    return api_version(f"gorge.{daemon_name}")


def check_version(daemon: Daemon, timeout: float, library_needs: str | None) -> Check:
    """One daemon's ``version.<name>`` line: fail on another major version,
    on one older than the Phorge library needs, or on no answer; warn when
    it is older than this gorge's (it runs an older release: restart it)."""
    name = f"version.{daemon.name}"
    product = daemon.product
    ours = expected_api_version(daemon.name)
    upgrade = f"install the same gorge release on its host and restart {product}"
    try:
        about = daemon.api(timeout).get("version")
    except Refused as e:
        return fail(
            name,
            f"{product} has no version route (HTTP {e.status} {e.code}): "
            "it runs a release older than this gorge",
            upgrade,
        )
    except ServiceUnavailable as e:
        return fail(name, str(e), f"systemctl status {product}; its log says why")
    about = about if isinstance(about, Mapping) else {}
    theirs = about.get("apiVersion")
    have = parse_version(theirs)
    if have is None:
        return fail(name, f"{product} names no API version ({theirs!r})", upgrade)
    seen = f"{product} {about.get('version') or 'unknown'}, API {theirs}"
    needed = parse_version(library_needs)
    if library_needs is not None and not compatible(str(theirs), library_needs):
        major = needed[0] if needed is not None else "?"
        return fail(
            name,
            f"{seen}; the Phorge library needs API {library_needs} or a later {major}.x",
            upgrade,
        )
    mine = parse_version(ours)
    if mine is not None and have[0] != mine[0]:
        return fail(
            name,
            f"{seen}; this gorge ({package_version()}) speaks API {ours}, another major version",
            upgrade,
        )
    if not compatible(str(theirs), ours):
        return warn(
            name,
            f"{seen}, older than this gorge's API {ours} ({package_version()}); "
            "commands that need the newer API may be refused",
            upgrade,
        )
    needs = f", the library needs {library_needs}" if library_needs is not None else ""
    return ok(name, f"{seen} (this gorge speaks {ours}{needs})")
