"""The import layers hold: the platform knows no service, and no service knows another.

The platform modules (``gorge/*.py``) are what every daemon stands on; a
service package (``gorge/webhook``, ``gorge/mailer``, ``gorge/taskqueue``,
``gorge/worker``) may use the platform but never a sibling service: the
worker reaches the queue over HTTP only. Only the command line and the demo,
which put the four together, may import them all.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "gorge"
SERVICES = ("webhook", "mailer", "taskqueue", "worker")
COMPOSERS = {"cli", "demo"}


def _imported_gorge_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "gorge" or name.startswith("gorge.")}


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).parts
        owner = relative[0].removesuffix(".py")
        if owner.split("_")[0] in COMPOSERS:
            continue
        yield owner if owner in SERVICES else "platform", path


@pytest.mark.parametrize(
    ("layer", "path"),
    [pytest.param(layer, path, id=str(path.relative_to(REPO_ROOT))) for layer, path in _sources()],
)
def test_imports_stay_within_their_layer(layer, path):
    allowed = {layer} if layer in SERVICES else set()
    crossing = sorted(
        module
        for module in _imported_gorge_modules(path)
        if _layer(module) in set(SERVICES) - allowed
        or (_layer(module) or "").split("_")[0] in COMPOSERS
    )
    assert crossing == []


def test_the_rule_notices_a_crossing(tmp_path):
    source = tmp_path / "bad.py"
    source.write_text("from gorge.taskqueue.store import TaskStore\nimport gorge.web\n")
    assert _imported_gorge_modules(source) == {
        "gorge.taskqueue.store",
        "gorge.taskqueue.store.TaskStore",
        "gorge.web",
    }
