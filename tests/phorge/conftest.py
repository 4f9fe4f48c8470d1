"""Real-Phorge tests: they run when GORGE_PHORGE_ROOT names a Phorge checkout
with arcanist/ beside it, and are skipped with one line otherwise.

One switched-over Phorge (its own namespace on the session's MariaDB, PHP's
built-in web server, ``bin/phd`` with ``phd.taskmasters`` = 0, and the four
gorge daemons as ``twistd`` processes) is shared by the mail, task and
webhook modules; the rollback module builds its own, since it switches back.
"""

from __future__ import annotations

import pytest

from tests.phorge.site import HOW_TO_RUN, find_checkout, wait
from tests.phorge.switched import Switched, gorge_mailer_entry

CHECKOUT, PROBLEM = find_checkout()


def pytest_report_header(config):
    if CHECKOUT is not None:
        return f"real-Phorge tests: {CHECKOUT.describe()}"
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # -rs already prints the skip reason, as one folded line.
    if CHECKOUT is not None or PROBLEM is not None or terminalreporter.hasopt("s"):
        return
    skipped = terminalreporter.stats.get("skipped", [])
    if any(report.nodeid.startswith("tests/phorge/") for report in skipped):
        terminalreporter.write_line(HOW_TO_RUN)


@pytest.fixture(scope="session", autouse=True)
def phorge_checkout():
    # Without GORGE_PHORGE_ROOT the package's setup_module skips first.
    if PROBLEM is not None:
        pytest.fail(PROBLEM, pytrace=False)
    return CHECKOUT


@pytest.fixture(scope="session")
def switched(phorge_checkout, mariadb, tmp_path_factory):
    """A Phorge switched over: gorge mailer entry, no taskmasters, gorge running."""
    s = Switched.build(phorge_checkout, mariadb, tmp_path_factory.mktemp("phorge-switched"), "s")
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
