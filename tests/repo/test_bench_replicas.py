"""bench/replicas.py runs end to end: a small run with one and two replicas
of gorge-webhook on one MariaDB and one and two gorge-workers on one
gorge-taskqueue, every item done once. Its figures are not checked here:
speed belongs to the benchmark's report."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "bench" / "replicas.py"


def _bench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_an_unknown_part_is_a_usage_error():
    done = _bench("--parts", "webhook,mailer")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1].endswith("mailer; choose from webhook,worker")


def test_a_count_below_one_is_a_usage_error():
    done = _bench("--counts", "1,0")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].endswith("'1,0': positive integers, comma-separated")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.time_limit(300)
def test_a_small_run_does_every_item_once_with_each_count():
    done = _bench("--counts", "1,2", "--rows", "30", "--hooks", "5", "--tasks", "60", timeout=280)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| webhook |")]
    rows += [line for line in done.stdout.splitlines() if line.startswith("| worker |")]
    # part, processes, items, ..., duplicates 0 on every row
    found = [re.match(r"\| (\w+) \| (\d) \| (\d+) \|.*\| 0 \|$", line) for line in rows]
    assert [m.groups() if m else line for m, line in zip(found, rows, strict=True)] == [
        ("webhook", "1", "30"),
        ("webhook", "2", "30"),
        ("worker", "1", "60"),
        ("worker", "2", "60"),
    ], output[-5000:]
