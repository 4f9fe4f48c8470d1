"""The import layers hold: the platform knows no service, and no service knows another.

The platform (``gorge/config.py``, ``gorge/log``, ``gorge/app``, ``gorge/web``,
``gorge/client``, ``gorge/db``) is what every daemon stands on; a
service package (``gorge/webhook``, ``gorge/mailer``, ``gorge/taskqueue``,
``gorge/worker``) may use the platform but never a sibling service: the
worker reaches the queue over HTTP only. Only the command line and the demo,
which put the four together, may import them all. Nothing in ``gorge/``
imports the test launchers (``gorge_testing/``, which the wheel does not
hold), and the launchers use the platform only: a daemon under test runs as
a process of its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "gorge"
LAUNCHERS = REPO_ROOT / "gorge_testing"
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
    return {name for name in found if name.split(".")[0] in {"gorge", "gorge_testing"}}


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
        or module.split(".")[0] == "gorge_testing"
    )
    assert crossing == []


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(path, id=str(path.relative_to(REPO_ROOT)))
        for path in sorted(LAUNCHERS.rglob("*.py"))
    ],
)
def test_the_launchers_use_the_platform_only(path):
    crossing = sorted(
        module
        for module in _imported_gorge_modules(path)
        if module.startswith("gorge.")
        and (_layer(module) in SERVICES or (_layer(module) or "").split("_")[0] in COMPOSERS)
    )
    assert crossing == []


def test_the_rule_notices_a_crossing(tmp_path):
    source = tmp_path / "bad.py"
    source.write_text(
        "from gorge.taskqueue.store import TaskStore\nimport gorge.web\n"
        "from gorge_testing.procs import free_port\nimport gorgeous\n"
    )
    assert _imported_gorge_modules(source) == {
        "gorge.taskqueue.store",
        "gorge.taskqueue.store.TaskStore",
        "gorge.web",
        "gorge_testing.procs",
        "gorge_testing.procs.free_port",
    }


def _lint_imports(config: Path) -> int:
    # In a process of its own: import-linter reads the modules it is given
    # from a clean interpreter, not the one pytest has filled.
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
            "--config",
            str(config),
            "--no-cache",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode


def test_the_import_linter_contract_holds():
    # The contract in pyproject.toml: each layer imports only from the ones
    # below it, and the services not from one another.
    assert _lint_imports(REPO_ROOT / "pyproject.toml") == 0


def test_the_contract_would_catch_an_arrow_the_wrong_way(tmp_path):
    # The same layers with log put above app: app's imports of log now break
    # the rule, so a contract that could not fail would be caught here.
    text = (REPO_ROOT / "pyproject.toml").read_text()
    swapped = text.replace(
        '    "gorge.app",\n    "gorge.log",\n', '    "gorge.log",\n    "gorge.app",\n'
    )
    assert swapped != text
    config = tmp_path / "pyproject.toml"
    config.write_text(swapped)
    assert _lint_imports(config) == 1
