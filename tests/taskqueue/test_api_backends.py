"""The same HTTP conversation against every real backend answers byte-for-byte
what it answers on the in-memory reference store."""

from __future__ import annotations

import pytest
import pytest_twisted

from gorge.taskqueue.memory import MemoryTaskStore
from tests.taskqueue.helpers import Client

pytestmark = pytest.mark.integration

PHID = "PHID-TASK-tzdxqbs3s4qsrzbtcoun"


async def conversation(client: Client, clock) -> list:
    out = []

    async def post(path, body, **kw):
        out.append((path, await client.post(path, body, **kw)))

    async def get(path):
        out.append((path, await client.get(path)))

    await post(
        "enqueue",
        {
            "taskClass": "A",
            "data": '{"t":"h\\u00e9llo \\ud83d\\ude00"}',
            "priority": 1000,
            "objectPHID": PHID,
            "containerPHID": "PHID-USER-x",
        },
    )
    await post("enqueue", {"taskClass": "B", "data": "[]", "delayUntil": int(clock.seconds()) + 60})
    await post("enqueue", {"taskClass": "A"})
    await post("lease", {"limit": 5}, headers={"X-Lease-Owner": "22413:1795947021:vm:1"})
    await get("stats")
    clock.advance(3)
    await post("fail", {"taskID": 1, "retryWait": 10})
    await post("yield", {"taskID": 3, "duration": 120})
    await get("tasks?limit=10&offset=0")
    await post("awaken", {"taskIDs": [3, 1, 77]})
    clock.advance(61)
    await post(
        "lease",
        {"limit": 5, "taskClasses": ["A", "B"]},
        headers={"X-Lease-Owner": "host:1:2:gorge-worker"},
    )
    await get("tasks/1")
    await post("complete", {"taskID": 1, "duration": 1500})
    clock.advance(5)
    await post("complete", {"taskID": 1, "duration": 9})
    await post("cancel", {"taskID": 2})
    await post("fail", {"taskID": 3, "permanent": True})
    await post("complete", {"taskID": 3})
    await post("yield", {"taskID": 2})
    await get("tasks/2")
    await get("stats")
    await get("tasks")
    return out


@pytest_twisted.ensureDeferred
async def test_backend_answers_like_the_model(backend_store, clock):
    from twisted.internet import task

    from tests.taskqueue.conftest import T0

    model_clock = task.Clock()
    model_clock.advance(T0)
    expected = await conversation(Client(MemoryTaskStore(model_clock), model_clock), model_clock)
    actual = await conversation(Client(backend_store, clock, backend=backend_store.backend), clock)
    assert actual == expected
    assert [code for _, (code, _) in expected] == [200] * 15 + [404, 404, 404, 200, 200]
    counts = ("activeCount", "leasedCount", "archivedCount", "failedCount")
    assert {key: expected[-2][1][1]["data"][key] for key in counts} == {
        "activeCount": 0,
        "leasedCount": 0,
        "archivedCount": 3,
        "failedCount": 0,
    }
