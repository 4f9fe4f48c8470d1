"""bench/phorge.py runs end to end: a smoke run (``--quick``) against a real
Phorge when ``GORGE_PHORGE_ROOT`` names one, and one skip line without it.
Its figures are not checked here: speed belongs to the benchmark's report."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from gorge_testing.phorge import CACHE_VARIABLE, ROOT_VARIABLE, find_checkout
from tests.support.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "bench" / "phorge.py"
SKIP_LINE = (
    f"bench/phorge.py: skipped: no Phorge checkout ({ROOT_VARIABLE} is not set and "
    "the cache has none; make it with scripts/phorge-checkout.sh)"
)


def _bench(
    *args: str, root: str | None, timeout: float = 60, cache: str | None = None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != ROOT_VARIABLE}
    if cache is not None:
        env[CACHE_VARIABLE] = cache
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    if root is not None:
        env[ROOT_VARIABLE] = root
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_without_a_phorge_checkout_it_prints_one_skip_line_and_exits_0(tmp_path):
    done = _bench("--quick", root=None, cache=str(tmp_path))
    assert (done.returncode, done.stdout, done.stderr) == (0, SKIP_LINE + "\n", "")


def test_a_root_that_is_no_phorge_checkout_stops_it_with_one_line(tmp_path):
    done = _bench("--quick", root=str(tmp_path))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        (
            f"bench/phorge.py: {ROOT_VARIABLE}={tmp_path} is not a Phorge checkout "
            "(no bin/storage or webroot/index.php)"
        )
    ]


def test_an_unknown_workload_is_a_usage_error(tmp_path):
    done = _bench("--quick", "--workloads", "php,nightly", root=None, cache=str(tmp_path))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines()[-1].endswith(
        "--workloads: nightly; choose from tasks,webhooks,few-hooks,php,pickup"
    )


@pytest.mark.phorge
@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.time_limit(900)
def test_a_quick_run_measures_every_side_and_draws_the_chart(tmp_path):
    checkout, problem = find_checkout()
    if checkout is None:
        pytest.skip(
            problem or f"needs {ROOT_VARIABLE} (a Phorge checkout with arcanist/ beside it)"
        )
    chart = tmp_path / "phorge.png"
    # The chart needs the optional bench extra (matplotlib).
    drawing = importlib.util.find_spec("matplotlib") is not None
    plot = ["--plot", str(chart)] if drawing else []

    done = _bench("--quick", *plot, root=str(checkout.root), timeout=840)

    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    lines = done.stdout.splitlines()
    for workload in ("tasks", "webhooks", "few-hooks"):
        for side in ("Phorge", "gorge"):
            assert any(
                line.startswith(f"round 1 {workload}") and f" {side} " in line for line in lines
            ), output[-5000:]
        assert any(
            line.startswith(f"{workload}/s, bulk (10%-90%)") and line.endswith("x")
            for line in lines
        ), output[-5000:]
    assert any(line.startswith("idle pickup p50") for line in lines), output[-5000:]
    assert any(line.startswith("targets: tasks") for line in lines), output[-5000:]
    # The PHP workload: Phorge's four taskmasters and both of gorge-worker's
    # PHP paths, each with its CPU breakdown, and the two ratios against Phorge.
    for side, part in (
        ("Phorge", "taskmasters x4 "),
        ("gorge executors", "executors "),
        ("gorge conduit", "web server "),
    ):
        assert any(
            line.startswith("round 1 php") and f" {side} " in line and part in line
            for line in lines
        ), output[-5000:]
    # executors/Phorge and conduit/Phorge
    for label in ("php tasks/s, bulk (10%-90%)", "CPU per php task, all processes"):
        assert any(line.startswith(label) and re.search(r"\S+x +\S+x$", line) for line in lines), (
            output[-5000:]
        )
    assert any(
        line.startswith("targets: php tasks: executors") and "CPU per php task" in line
        for line in lines
    ), output[-5000:]
    # Every item of every run was done, exactly once: no PROBLEM line.
    assert "PROBLEM" not in output, output[-5000:]
    if drawing:
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
