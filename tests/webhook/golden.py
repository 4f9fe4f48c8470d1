"""The captured webhook deliveries (tests/fixtures/webhook), loaded once per case."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.support.paths import FIXTURES_DIR

WEBHOOK_GOLDEN = FIXTURES_DIR / "webhook"


@dataclass(frozen=True)
class Case:
    name: str
    path: Path
    info: dict
    request_before: dict
    request_after: dict
    hook_before: dict
    body: bytes | None

    @property
    def made_request(self) -> bool:
        return self.body is not None


def _json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def load_case(name: str) -> Case:
    path = WEBHOOK_GOLDEN / name
    body_path = path / "body.bin"
    return Case(
        name=name,
        path=path,
        info=_json(path / "case_info.json"),
        request_before=_json(path / "request_row_before.json"),
        request_after=_json(path / "request_row_after.json"),
        hook_before=_json(path / "webhook_row_before.json"),
        body=body_path.read_bytes() if body_path.exists() else None,
    )


def all_cases() -> list[Case]:
    return [load_case(p.name) for p in sorted(WEBHOOK_GOLDEN.iterdir()) if p.is_dir()]


def delivered_cases() -> list[Case]:
    return [case for case in all_cases() if case.made_request]
