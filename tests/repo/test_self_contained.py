"""A clone of the repository with nothing beside it passes its own suite.

The repository is cloned (its committed HEAD) into an empty temporary folder
and the whole suite runs there, so a test, fixture or script that reaches
outside the checkout fails here even when the developer's machine happens to
have that file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.support.paths import REPO_ROOT

# Set in the suite that runs inside the clone, so it does not clone again.
NESTED = "GORGE_SELF_CONTAINED_RUN"
SUITE_TIME_LIMIT = 3600.0


def _git(*args: str, cwd=REPO_ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def clone(tmp_path):
    if os.environ.get(NESTED):
        pytest.skip("already running inside the self-contained clone")
    if shutil.which("git") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    target = tmp_path / "empty" / "gorge"
    _git("clone", "--quiet", "--no-hardlinks", str(REPO_ROOT), str(target))
    assert sorted(os.listdir(target.parent)) == ["gorge"]
    return target


@pytest.mark.slow
@pytest.mark.clone
@pytest.mark.time_limit(SUITE_TIME_LIMIT)
def test_the_suite_passes_in_a_clone_with_nothing_beside_it(clone):
    env = dict(os.environ, PYTHONPATH=str(clone), **{NESTED: "1"})
    # The real-Phorge tests need a checkout outside the clone; the outer run
    # covers them, so the inner one finds none (an empty cache) and fetches none.
    env.pop("GORGE_PHORGE_ROOT", None)
    env["GORGE_PHORGE_CACHE"] = str(clone.parent.parent / "no-phorge")
    env["GORGE_PHORGE_FETCH"] = "0"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x"],
        cwd=clone,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=SUITE_TIME_LIMIT - 60,
    )
    tail = "\n".join((run.stdout + run.stderr).splitlines()[-40:])
    assert run.returncode == 0, f"the suite failed inside the clone:\n{tail}"
    assert " passed" in run.stdout.splitlines()[-1], tail


# Spelled in pieces so this file does not match its own search.
OUTSIDE_MARKERS = ("../" + "shared", "GORGE_" + "SHARED_DIR")


def test_nothing_in_the_repository_reaches_outside_it():
    tracked = _git("ls-files").split()
    offenders = []
    for name in tracked:
        path = REPO_ROOT / name
        if path.suffix not in {".py", ".sh", ".md", ".toml", ".yml", ".example", ""}:
            continue
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if any(marker in text for marker in OUTSIDE_MARKERS):
            offenders.append(name)
    assert offenders == []
