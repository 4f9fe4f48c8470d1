"""The console's Task Queue box (the overview's, read from Phorge's
``worker_activetask``) means by "waiting" and "oldest waiting" what
gorge-taskqueue's ``oldestWaiting`` (``gorge_taskqueue_oldest_waiting_seconds``)
means: a task delayed into the future, or leased, is not waiting; one whose
delay or lease ran out waits since its ``leaseExpires``, one never leased
since it was created."""

from __future__ import annotations

import json

import pytest
import treq

from gorge_testing.gorge_stack import QUEUE_TOKEN
from tests.phorge.console import get_page, person, start_worker

pytestmark = [
    pytest.mark.phorge,
    pytest.mark.integration,
    pytest.mark.parametrize("switched", ["conduit"], indirect=True),
]

FRESH = "GorgeConsoleAgeFreshWorker"  # never leased, and one delayed long ago
DUE = "GorgeConsoleAgeDueWorker"  # a delay ran out, and one leased
LATER = "GorgeConsoleAgeLaterWorker"  # only delayed into the future


async def queue_stats(s) -> dict:
    response = await treq.get(
        f"http://127.0.0.1:{s.gorge.ports['taskqueue']}/api/queue/stats",
        headers={"X-Service-Token": QUEUE_TOKEN},
        timeout=30,
    )
    body = json.loads(await response.content())
    assert response.code == 200, body
    return body["data"]


async def test_oldest_waiting_is_the_queue_s_own_reading(console):
    s = console
    admin = await person(s, "ageadmin", admin=True)
    await s.gorge.stop("worker")  # nothing leases: only this test moves rows
    made: list[int] = []
    try:

        async def task(task_class: str, sql: str) -> int:
            task_id = (await s.site.helper("schedule", taskClass=task_class, data={}))["taskID"]
            made.append(task_id)
            s.site.execute("worker", f"UPDATE worker_activetask SET {sql} WHERE id = %s", task_id)
            return task_id

        now = "UNIX_TIMESTAMP()"
        await task(FRESH, f"dateCreated = {now} - 500")
        await task(
            FRESH, f"dateCreated = {now} - 5000, leaseOwner = NULL, leaseExpires = {now} + 3600"
        )
        await task(
            DUE, f"dateCreated = {now} - 4000, leaseOwner = NULL, leaseExpires = {now} - 100"
        )
        await task(
            DUE,
            f"dateCreated = {now} - 9000, leaseOwner = 'age-test:gorge-worker', "
            f"leaseExpires = {now} + 3600",
        )
        await task(LATER, f"dateCreated = {now} - 7000, leaseExpires = {now} + 60")
        rows = {
            row["id"]: row
            for row in s.site.rows(
                "worker",
                "SELECT id, dateCreated, leaseExpires FROM worker_activetask WHERE id IN %s",
                tuple(made),
            )
        }
        fresh, _, due, _, _ = made

        summary = {
            row["taskClass"]: row
            for row in (await s.site.helper("console-queue-summary"))["rows"]
            if row["taskClass"] in (FRESH, DUE, LATER)
        }
        stats = await queue_stats(s)

        def counts(name: str) -> tuple[int, int, int, int]:
            row = summary[name]
            return tuple(int(row[k]) for k in ("waiting", "leased", "delayed", "active"))

        assert counts(FRESH) == (1, 0, 1, 2)
        assert counts(DUE) == (1, 1, 0, 2)
        assert counts(LATER) == (0, 0, 1, 1)
        # Since when: the never-leased task's creation, the due task's expiry;
        # not the delayed or leased tasks' older creation times.
        assert int(summary[FRESH]["oldestWaiting"]) == rows[fresh]["dateCreated"]
        assert int(summary[DUE]["oldestWaiting"]) == rows[due]["leaseExpires"]
        assert summary[LATER]["oldestWaiting"] is None

        # The same reading as gorge-taskqueue's, to the second.
        since = {
            entry["taskClass"]: stats["oldestWaitingAt"] - entry["ageSeconds"]
            for entry in stats["oldestWaiting"]
            if entry["taskClass"] in (FRESH, DUE, LATER)
        }
        assert since == {
            FRESH: int(summary[FRESH]["oldestWaiting"]),
            DUE: int(summary[DUE]["oldestWaiting"]),
        }

        code, page = await get_page(s, admin, "/gorge/")
        assert code == 200
        assert "Oldest Waiting" in page and "Delayed" in page
    finally:
        for task_id in made:
            s.forget_task(task_id)
        if "worker" not in s.gorge.daemons:
            await start_worker(s)
