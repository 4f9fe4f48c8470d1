"""What ``gorge doctor`` found: one :class:`Check` per prerequisite or
canary, printed one line each (or as JSON), and the exit status."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TextIO

OK, FAIL, WARN, SKIP = "ok", "fail", "warn", "skip"
STATUSES = (OK, FAIL, WARN, SKIP)
# How a status is shown: FAIL stands out; the others stay short.
LABELS = {OK: "ok", FAIL: "FAIL", WARN: "warn", SKIP: "skip"}

EXIT_PASSED, EXIT_FAILED = 0, 1
# Where the fixes send the operator: the switch-over guide.
GUIDE = "docs/phorge.md"


@dataclass(frozen=True)
class Check:
    """One check's outcome. ``detail`` says what was seen; ``fix`` (with a
    failure or warning) what to do about it."""

    name: str
    status: str
    detail: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")

    def line(self) -> str:
        text = f"{LABELS[self.status]:<4} {self.name}: {self.detail}"
        if self.fix and self.status in (FAIL, WARN):
            text += f"; fix: {self.fix}"
        return text


def ok(name: str, detail: str) -> Check:
    return Check(name, OK, detail)


def fail(name: str, detail: str, fix: str) -> Check:
    return Check(name, FAIL, detail, fix)


def warn(name: str, detail: str, fix: str) -> Check:
    return Check(name, WARN, detail, fix)


def skip(name: str, why: str) -> Check:
    return Check(name, SKIP, why)


def failed(checks: Sequence[Check]) -> list[Check]:
    return [c for c in checks if c.status == FAIL]


def exit_status(checks: Sequence[Check]) -> int:
    """0 when nothing failed (warnings and skips included), else 1."""
    return EXIT_FAILED if failed(checks) else EXIT_PASSED


def write_lines(checks: Sequence[Check], out: TextIO) -> None:
    for check in checks:
        out.write(check.line() + "\n")
    broken = failed(checks)
    if broken:
        names = ", ".join(c.name for c in broken)
        out.write(f"{len(broken)} of {len(checks)} checks failed: {names}\n")
    else:
        out.write(f"all {len(checks)} checks passed\n")


def write_json(checks: Sequence[Check], out: TextIO) -> None:
    document = {
        "ok": not failed(checks),
        "failed": [c.name for c in failed(checks)],
        "checks": [asdict(c) for c in checks],
    }
    out.write(json.dumps(document, ensure_ascii=False, indent=2) + "\n")
