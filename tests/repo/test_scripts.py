"""The README's two commands install what each needs, and no more."""

from __future__ import annotations

import re
import subprocess

from tests.support.paths import REPO_ROOT

SCRIPTS = REPO_ROOT / "scripts"
SERVERS = {"mariadb-server", "redis-server"}


def _packages(*args: str) -> set[str]:
    run = subprocess.run(
        ["bash", str(SCRIPTS / "install-deps.sh"), *args, "--print-packages"],
        capture_output=True,
        text=True,
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return set(run.stdout.split())


def test_the_demo_needs_no_database_server():
    assert _packages("--demo").isdisjoint(SERVERS)
    assert "python3-venv" in _packages("--demo")


def test_the_suite_needs_both_database_servers():
    assert SERVERS <= _packages("--test")
    assert "prometheus" in _packages("--test")  # promtool: tests/repo/test_monitoring.py
    assert _packages() == _packages("--test")


def test_each_command_asks_for_its_own_mode():
    calls = {
        script: re.findall(r"install-deps\.sh\"? *(--\w+)?", (SCRIPTS / script).read_text())
        for script in ("demo.sh", "test.sh")
    }
    assert set(calls["demo.sh"]) - {""} == {"--demo"}
    assert set(calls["test.sh"]) - {""} == {"--test"}


def test_an_unknown_option_is_refused_with_one_line():
    run = subprocess.run(
        ["bash", str(SCRIPTS / "install-deps.sh"), "--everything"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "install-deps: unknown option --everything (expected --demo, --test or --print-packages)"
    ]
