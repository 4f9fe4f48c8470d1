"""Real-Phorge tests: they run on the Phorge checkout GORGE_PHORGE_ROOT names
(arcanist/ beside it), else on the pinned one scripts/phorge-checkout.sh keeps
in the per-user cache, and are skipped with one line when there is neither.

One switched-over Phorge (its own namespace on the session's MariaDB, PHP's
built-in web server, ``bin/phd`` with ``phd.taskmasters`` = 0, and the four
gorge daemons as ``twistd`` processes) is shared by the mail, task and
webhook modules; the rollback module builds its own, since it switches back.
"""

from __future__ import annotations

import pytest

from gorge_testing.gorge_stack import PHP_PATHS
from tests.phorge.console import give_tokens, take_tokens_back
from tests.phorge.site import HOW_TO_RUN, find_checkout, wait
from tests.phorge.switched import Switched, gorge_mailer_entry

CHECKOUT, PROBLEM = find_checkout()


def pytest_report_header(config):
    if CHECKOUT is not None:
        return f"real-Phorge tests: {CHECKOUT.describe()}"
    return None


def _phorge_outcomes(terminalreporter) -> dict[str, int]:
    # The reporter files each test once under its outcome ("error" for a
    # failed setup), so counting by node id counts tests.
    return {
        outcome: sum(
            1
            for report in terminalreporter.stats.get(outcome, [])
            if getattr(report, "nodeid", "").startswith("tests/phorge/")
        )
        for outcome in ("passed", "failed", "error", "skipped")
    }


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    counts = _phorge_outcomes(terminalreporter)
    if not any(counts.values()):
        return
    if CHECKOUT is None and PROBLEM is None:
        terminalreporter.write_line(HOW_TO_RUN)
        return
    ran = counts["passed"] + counts["failed"] + counts["error"]
    where = CHECKOUT.describe() if CHECKOUT is not None else PROBLEM
    terminalreporter.write_line(
        f"real-Phorge tests ran: {ran} ({counts['passed']} passed, {counts['failed']} failed, "
        f"{counts['error']} errors; {counts['skipped']} skipped) on {where}"
    )


@pytest.fixture(scope="session", autouse=True)
def phorge_checkout():
    # Without GORGE_PHORGE_ROOT the package's setup_module skips first.
    if PROBLEM is not None:
        pytest.fail(PROBLEM, pytrace=False)
    return CHECKOUT


@pytest.fixture(scope="session", params=PHP_PATHS)
def switched(request, phorge_checkout, mariadb, tmp_path_factory):
    """A Phorge switched over: gorge mailer entry, no taskmasters, gorge running.

    Once with PHP tasks in gorge-worker's local PHP executors, once through
    ``worker.execute`` on Phorge's web server; a module that is about one of
    them says so with ``pytest.mark.parametrize("switched", [...], indirect=True)``.
    """
    php = request.param
    s = Switched.build(
        phorge_checkout, mariadb, tmp_path_factory.mktemp(f"phorge-{php}"), php[0], php=php
    )
    try:
        s.site.configure(
            {
                "cluster.mailers": [gorge_mailer_entry(s.gorge.mailer_uri)],
                "phd.taskmasters": 0,
                "feed.http-hooks": [s.receiver.base + "/feed"],
            }
        )
        s.site.start_web()
        wait(s.site.wait_web())
        s.site.bin_sync("phd", "start")
        for name in ("taskqueue", "mailer", "webhook", "worker"):
            wait(s.gorge.start_ready(name))
        yield s
    finally:
        s.close()
        wait(s.stop_listening())


@pytest.fixture(scope="module")
def console(switched):
    """The switched-over site with every daemon holding a service token and
    named in ``gorge.daemons`` (tests/phorge/console.py), for the console and
    setup-check modules; the shared stack as it was afterwards."""
    wait(give_tokens(switched))
    try:
        yield switched
    finally:
        wait(take_tokens_back(switched))
