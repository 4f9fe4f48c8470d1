"""``GET /api/<service>/version``: which daemon answers, which release, since when.

Every daemon serves it the same way, from :class:`gorge.web.site.GorgeRoot`,
behind the service token like the rest of its API. Phorge's setup check and
console compare ``apiVersion`` with the library's and show the release and
uptime; an operator asks it after an upgrade.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
from dataclasses import dataclass
from typing import Any

from twisted.internet.interfaces import IReactorTime

from gorge.web.envelope import ok

PACKAGE = "gorge"
UNKNOWN = "unknown"


def package_version() -> str:
    """The installed gorge release; "unknown" when run from a tree never installed."""
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN


def api_version(package: str) -> str:
    """``info.version`` of the package's ``openapi.json``: the API's own version."""
    raw = importlib.resources.files(package).joinpath("openapi.json").read_bytes()
    version = json.loads(raw).get("info", {}).get("version")
    if not isinstance(version, str):
        raise ValueError(f"{package}/openapi.json names no info.version")
    return version


@dataclass(frozen=True)
class About:
    """What ``/version`` answers for one daemon; ``started_at`` is when it was built."""

    service: str
    version: str
    api_version: str
    started_at: int

    @classmethod
    def of(cls, service: str, api_package: str, clock: IReactorTime) -> About:
        return cls(
            service=service,
            version=package_version(),
            api_version=api_version(api_package),
            started_at=int(clock.seconds()),
        )

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "service": self.service,
            "version": self.version,
            "apiVersion": self.api_version,
            "startedAt": self.started_at,
            "uptimeSeconds": max(int(now) - self.started_at, 0),
        }

    def render(self, request: Any, clock: IReactorTime) -> bytes:
        return ok(request, self.to_json(clock.seconds()))
