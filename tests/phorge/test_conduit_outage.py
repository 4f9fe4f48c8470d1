"""A Phorge web outage costs no task anything: with gorge-worker delegating
through ``worker.execute``, Phorge's web server stops for 25 s while PHP
tasks are queued; the worker hands back what it could not deliver, holds
delegated classes back while its probe fails, and once the web server is
back each task runs once, with no failure counted. This module runs its own
Phorge, since it stops the web server."""

from __future__ import annotations

import json

import pytest
import treq
from twisted.internet import reactor
from twisted.internet.task import deferLater

from tests.phorge.site import BOUND, STEP, wait
from tests.phorge.switched import Switched

pytestmark = [pytest.mark.phorge, pytest.mark.integration, pytest.mark.slow]

OUTAGE = 25.0  # seconds Phorge's web server is down, on the reactor's clock
RECOVERY_BOUND = 10.0  # every task archived within this long of the restart
TASKS = 3
SUCCESS = 0
PAUSED = "; delegated classes paused"


@pytest.fixture(scope="module")
def outage(phorge_checkout, mariadb, tmp_path_factory):
    s = Switched.build(phorge_checkout, mariadb, tmp_path_factory.mktemp("phorge-outage"), "o")
    try:
        s.site.configure({"phd.taskmasters": 0})
        s.site.start_web()
        wait(s.site.wait_web())
        wait(s.gorge.start_ready("taskqueue"))
        # PhabricatorTestWorker goes to PHP (the fallback delegates every
        # class), and the probe keeps the operator's default period.
        wait(
            s.gorge.start_ready(
                "worker",
                GORGE_WORKER_NATIVE_TEST_WORKER="0",
                GORGE_WORKER_CONDUIT_PROBE_SEC="60",
            )
        )
        yield s
    finally:
        s.close()
        wait(s.stop_listening())


async def readyz(daemon) -> tuple[int, str]:
    response = await treq.get(daemon.url + "/readyz", timeout=10)
    body = json.loads(await response.content())
    return response.code, body.get("reason", "")


async def until_paused(outage: Switched, daemon) -> str:
    deadline = reactor.seconds() + BOUND
    while True:
        code, reason = await readyz(daemon)
        if code == 503 and reason.endswith(PAUSED):
            return reason
        daemon.require_alive()
        if reactor.seconds() > deadline:
            raise AssertionError(f"gorge-worker never paused delegation: {code} {reason}")
        await deferLater(reactor, STEP)


def last_call(outage: Switched) -> int:
    """The newest row of Phorge's Conduit call log."""
    return outage.site.rows("conduit", "SELECT MAX(id) AS m FROM conduit_methodcalllog")[0]["m"]


def executed(outage: Switched, after: int) -> int:
    """worker.execute calls logged after row ``after`` that ran a task (the
    probe's answer is an error by design)."""
    return outage.site.rows(
        "conduit",
        "SELECT COUNT(*) AS n FROM conduit_methodcalllog"
        " WHERE method = 'worker.execute' AND error = '' AND id > %s",
        after,
    )[0]["n"]


async def test_a_web_outage_costs_no_task_anything(outage):
    site, worker = outage.site, outage.gorge.daemons["worker"]
    # What setting up the site queued runs first, so that the only calls to
    # count later are the ones this test caused. One of them failing once
    # and waiting out Phorge's five-minute retry delay is fine: it cannot run
    # again within this test, so it adds no call to the count.
    await outage.settled(0, "the site's own tasks", retrying_ok=True)
    counted_after = last_call(outage)
    assert site.web is not None
    site.web.stop()
    stopped = reactor.seconds()

    tasks = [
        await site.helper("schedule", taskClass="PhabricatorTestWorker", data={"doWork": "nothing"})
        for _ in range(TASKS)
    ]
    ids = [t["taskID"] for t in tasks]
    reason = await until_paused(outage, worker)
    assert reason.startswith("conduit: "), reason

    # Down for the whole outage, measured on the reactor.
    await deferLater(reactor, max(0.0, stopped + OUTAGE - reactor.seconds()))
    during = [outage.task(task_id) for task_id in ids]
    assert [row["table"] for row in during] == ["worker_activetask"] * TASKS
    assert [row["failureCount"] for row in during] == [0] * TASKS
    # At least one was tried, and given back as a yield (not a failure).
    assert any(row["leaseOwner"] == "(yield)" for row in during), during
    code, reason = await readyz(worker)
    assert code == 503 and reason.endswith(PAUSED), reason
    down_for = reactor.seconds() - stopped

    site.start_web()
    restarted = reactor.seconds()
    await site.wait_web()
    rows = await outage.until(
        lambda: (found := [outage.archived(task_id) for task_id in ids]) and all(found) and found,
        "every task archived after the web server came back",
        bound=BOUND,
    )
    delay = reactor.seconds() - restarted
    print(f"\nweb server down {down_for:.1f}s; every task archived {delay:.1f}s after its restart")
    assert delay <= RECOVERY_BOUND, f"archived {delay:.1f}s after the restart"
    assert [row["result"] for row in rows] == [SUCCESS] * TASKS
    assert [row["failureCount"] for row in rows] == [0] * TASKS
    assert outage.leased_by_gorge(rows)
    # Each ran once: one worker.execute that ran a task per task.
    assert executed(outage, counted_after) == TASKS
    assert await readyz(worker) == (200, "")
