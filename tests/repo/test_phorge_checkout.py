"""scripts/phorge-checkout.sh: the pinned Phorge + Arcanist for the
real-Phorge tests, from the public repositories or from local git
directories, into a per-user cache; and find_checkout's order of places."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gorge_testing import phorge as harness
from tests.support.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "phorge-checkout.sh"


def _run(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GORGE_PHORGE_CACHE": str(cache), "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _git_repo(path: Path) -> Path:
    path.mkdir()
    for argv in (
        ["init", "-q"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x"],
    ):
        subprocess.run(["git", "-C", str(path), *argv], check=True, capture_output=True)
    return path


def test_print_path_on_an_empty_cache_prints_nothing_and_fails(tmp_path):
    done = _run("--print-path", cache=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (1, "", "")


def test_a_source_without_the_pinned_commit_fails_with_one_line_and_leaves_nothing(tmp_path):
    source = _git_repo(tmp_path / "not-phorge")
    cache = tmp_path / "cache"
    done = _run("--quiet", "--phorge", str(source), "--arcanist", str(source), cache=cache)
    assert done.returncode == 1
    assert done.stdout == ""
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("phorge-checkout: could not get Phorge ")
    assert "--phorge DIR --arcanist DIR" in last
    # Nothing half-made is left behind for --print-path to take.
    assert list(cache.iterdir()) == []


def test_an_unknown_option_names_itself(tmp_path):
    done = _run("--phorj", cache=tmp_path)
    assert done.returncode == 2
    assert "unknown option --phorj" in done.stderr


def test_a_checkout_from_local_git_directories_lands_at_the_pinned_commits(tmp_path):
    # The sources are the cached checkout the suite runs on, when there is one.
    existing = harness.cached_checkout_root()
    if not (existing / ".git").exists():
        pytest.skip("no pinned checkout in the cache to copy from")
    cache = tmp_path / "cache"
    done = _run(
        "--quiet",
        "--phorge",
        str(existing),
        "--arcanist",
        str(existing.parent / "arcanist"),
        cache=cache,
    )
    assert done.returncode == 0, done.stderr
    root = Path(done.stdout.strip())
    pinned = harness.pinned_commits()
    assert root == cache / f"phorge-{pinned['phorge'][:10]}" / "phorge"
    assert harness.git_commit(root) == pinned["phorge"]
    assert harness.git_commit(root.parent / "arcanist") == pinned["arcanist"]
    # A second call finds it without fetching.
    again = _run("--print-path", cache=cache)
    assert (again.returncode, again.stdout.strip()) == (0, str(root))


def test_find_checkout_prefers_the_variable_then_the_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(harness.ROOT_VARIABLE, raising=False)
    monkeypatch.setenv(harness.CACHE_VARIABLE, str(tmp_path / "empty"))
    assert harness.find_checkout() == (None, None)

    cached = harness.cached_checkout_root()
    for sub in ("bin/storage", "webroot/index.php"):
        (cached / sub).parent.mkdir(parents=True, exist_ok=True)
        (cached / sub).write_text("")
    (cached.parent / "arcanist" / "bin").mkdir(parents=True)
    (cached.parent / "arcanist" / "bin" / "arc").write_text("")
    checkout, problem = harness.find_checkout()
    if problem is not None:  # no php on this machine: the problem says so
        assert "no php on PATH" in problem
    else:
        assert checkout is not None
        assert (checkout.root, checkout.source) == (cached.resolve(), "the cache")

    monkeypatch.setenv(harness.ROOT_VARIABLE, str(tmp_path))
    checkout, problem = harness.find_checkout()
    assert checkout is None
    assert problem is not None and "is not a Phorge checkout" in problem


def test_pinned_commits_are_full_commit_ids():
    pinned = harness.pinned_commits()
    assert set(pinned) == {"phorge", "arcanist"}
    assert all(len(sha) == 40 and int(sha, 16) >= 0 for sha in pinned.values())
