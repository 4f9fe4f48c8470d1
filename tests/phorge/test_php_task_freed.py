"""``gorge queue free`` and ``cancel`` of a PHP task while gorge-worker runs
it, on a real Phorge, through both PHP paths (local executors and
``worker.execute``): the next heartbeat stops that run, nothing is reported
for its lease, and the worker says so in one line (docs/worker.md,
Heartbeat leases).

The task is Phorge's own PhabricatorTestWorker asked to sleep far longer
than any wait here: a run that is not stopped is still asleep when the test
looks, so each check below fails if the stop does not happen.
"""

from __future__ import annotations

import json
import sys

import pytest
import treq

from gorge_testing.gorge_stack import QUEUE_TOKEN, WORKER_SUFFIX
from tests.phorge.site import wait
from tests.phorge.switched import Switched, executor_pids

pytestmark = [pytest.mark.phorge, pytest.mark.integration, pytest.mark.slow]

TEST_WORKER = "PhabricatorTestWorker"
SUCCESS, CANCELLED = 0, 2
#: How long the PHP task sleeps: far past every bound below, and short
#: enough that a web-server worker kept asleep by the Conduit path (PHP's
#: built-in server does not stop a request its client hung up) is back soon.
SLEEP_SECONDS = 40
#: A run must be stopped well before its PHP would wake up by itself.
STOP_BOUND = 25.0
#: The task's own lines about its lease, one of which must be logged once.
LEASE_LINES = ("WORKER_TASK_LEASE_LOST", "WORKER_TASK_LEASED_AGAIN")
ACTIVE = "gorge_worker_active_tasks"
BUSY = 'gorge_worker_php_executors{state="busy"}'


@pytest.fixture
def freeable(switched):
    """gorge-worker restarted to run PhabricatorTestWorker in PHP, with a
    one-second heartbeat (and, with executors, a single executor, so the
    one busy is the one running the task); the shared worker is put back
    afterwards."""
    overrides = {
        "GORGE_WORKER_NATIVE_TEST_WORKER": "0",
        "GORGE_WORKER_HEARTBEAT_SEC": "1",
        "GORGE_WORKER_HEARTBEAT_LEASE_SEC": "5",
    }
    if switched.gorge.php == "executors":
        overrides["GORGE_WORKER_PHP_EXECUTORS"] = "1"
    wait(switched.gorge.stop("worker"))
    wait(switched.gorge.start_ready("worker", **overrides))
    try:
        yield switched
    finally:
        wait(switched.gorge.stop("worker"))
        wait(switched.gorge.start_ready("worker"))


async def _metrics(s: Switched) -> dict[str, float]:
    response = await treq.get(s.gorge.daemons["worker"].url + "/metrics", timeout=30)
    text = (await response.content()).decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


async def _queue_verb(s: Switched, verb: str, task_id: int) -> str:
    """``gorge queue VERB ID``, the operator's command, against the site's queue."""
    status, out, err = await s.site.run(
        [
            sys.executable,
            "-m",
            "gorge.cli",
            "queue",
            verb,
            "--url",
            s.gorge.daemons["taskqueue"].url,
            "--token",
            QUEUE_TOKEN,
            str(task_id),
        ]
    )
    assert status == 0, f"gorge queue {verb} {task_id} exited with {status}:\n{out}\n{err}"
    return out


def _lines(s: Switched, task_id: int, events: tuple[str, ...]) -> list[str]:
    needle = f"task_id={task_id} "
    return [
        line
        for line in s.gorge.daemons["worker"].log_text().splitlines()
        if needle in line + " " and any(event in line for event in events)
    ]


async def _running(s: Switched, task_id: int) -> dict:
    """Wait until the sleeping task is leased by gorge-worker and its PHP is
    under way (executors: the one executor busy); its row."""
    row = await s.until(
        lambda: (r := s.task(task_id)) and WORKER_SUFFIX + ":" in (r["leaseOwner"] or "") and r,
        f"task {task_id} leased by gorge-worker",
    )

    async def started() -> bool:
        metrics = await _metrics(s)
        if metrics.get(ACTIVE) != 1:
            return False
        return s.gorge.php != "executors" or metrics.get(BUSY) == 1

    await s.until(started, f"task {task_id} running in PHP", bound=STOP_BOUND)
    return row


def _long_calls(s: Switched) -> int:
    """worker.execute calls Phorge logged that ran as long as the sleep: a
    run that PHP finished (Phorge logs a call once it is over)."""
    return s.site.rows(
        "conduit",
        "SELECT COUNT(*) AS n FROM conduit_methodcalllog"
        " WHERE method = 'worker.execute' AND duration >= %s",
        SLEEP_SECONDS * 1_000_000,
    )[0]["n"]


async def _stopped(s: Switched, task_id: int, pids_before: list[int]) -> None:
    """The stale run is over: with executors, its process was replaced
    (capacity kept); through Conduit, the worker hung up while Phorge's PHP
    is still asleep."""
    worker = s.gorge.daemons["worker"]

    async def over() -> bool:
        if (await _metrics(s)).get(ACTIVE) != 0:
            return False
        if s.gorge.php == "executors":
            pids = executor_pids(worker.pid)
            return bool(pids) and not set(pids) & set(pids_before)
        return True

    await s.until(over, f"task {task_id}'s run stopped", bound=STOP_BOUND)
    if s.gorge.php == "executors":
        assert len(executor_pids(worker.pid)) == 1  # replaced, not lost
        replaced = _lines(s, task_id, ("WORKER_EXECUTOR_REPLACED",))
        assert len(replaced) == 1, replaced
        # A stop the worker asked for is not an executor's death.
        assert "WORKER_EXECUTOR_EXITED" not in worker.log_text()
    else:
        assert _long_calls(s) == 0


@pytest.mark.parametrize("verb", ["free", "cancel"])
async def test_free_or_cancel_of_a_running_php_task_stops_it_and_reports_nothing(freeable, verb):
    s = freeable
    worker = s.gorge.daemons["worker"]
    task = await s.site.helper(
        "schedule",
        taskClass=TEST_WORKER,
        data={"doWork": "nothing", "duration": SLEEP_SECONDS},
    )
    task_id = task["taskID"]
    first = await _running(s, task_id)
    pids_before = executor_pids(worker.pid) if s.gorge.php == "executors" else []
    if verb == "free":
        # What the next lease reads: a run afresh finishes at once.
        s.site.execute(
            "worker",
            "UPDATE worker_taskdata SET data = %s WHERE id = %s",
            json.dumps({"doWork": "nothing"}),
            first["dataID"],
        )

    out = await _queue_verb(s, verb, task_id)
    assert str(task_id) in out

    await _stopped(s, task_id, pids_before)
    lease_lines = _lines(s, task_id, LEASE_LINES)
    assert len(lease_lines) == 1, lease_lines
    metrics = await _metrics(s)
    lost = f'gorge_worker_tasks_total{{outcome="lease_lost",task_class="{TEST_WORKER}"}}'
    assert metrics.get(lost) == 1

    if verb == "cancel":
        row = s.archived(task_id)
        assert row is not None and row["result"] == CANCELLED
        assert row["failureCount"] == 0
        assert not _lines(s, task_id, ("WORKER_TASK_OUTCOME", "WORKER_TASK_UNREPORTED"))
        return
    # Freed: leased again under a new owner, run afresh, archived once by
    # that run; the stale lease reported nothing (no failure counted).
    row = await s.until(lambda: s.archived(task_id), f"task {task_id} run again and archived")
    assert row["result"] == SUCCESS and row["failureCount"] == 0
    assert row["leaseOwner"] != first["leaseOwner"]
    assert WORKER_SUFFIX + ":" in (row["leaseOwner"] or "")
    assert not _lines(s, task_id, ("WORKER_TASK_OUTCOME", "WORKER_TASK_UNREPORTED"))
    assert (await _metrics(s)).get(lost) == 1
