"""Contract fixtures replayed in-process through the real site.

Seed: ids 1-3 enqueued as PhabricatorTestWorker with data
{"key":"value"} and objectPHID PHID-TASK-abcdefghijklmnopqrst, then ids 4-5
(data {}) enqueued and completed with duration 1234 - on the in-memory store.
``unavailable/`` runs against a store whose every call fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import task

from gorge.taskqueue.memory import MemoryTaskStore
from gorge.taskqueue.model import EnqueueRequest
from tests.support.contract import crashes, fixture_files, replay
from tests.support.logcapture import logged_events
from tests.taskqueue.conftest import T0
from tests.taskqueue.helpers import Client

HERE = Path(__file__).parent / "contract"
FIXTURES = fixture_files(HERE)
UNAVAILABLE = fixture_files(HERE / "unavailable")


def _seeded() -> tuple[MemoryTaskStore, task.Clock]:
    clock = task.Clock()
    clock.advance(T0)
    store = MemoryTaskStore(clock)

    def run(coro):
        try:
            coro.send(None)
        except StopIteration as stop:
            return stop.value
        raise AssertionError("the memory store awaited something")

    for _ in range(3):
        run(
            store.enqueue(
                EnqueueRequest(
                    "PhabricatorTestWorker",
                    '{"key":"value"}',
                    object_phid="PHID-TASK-abcdefghijklmnopqrst",
                )
            )
        )
    for _ in range(2):
        task_id = run(store.enqueue(EnqueueRequest("PhabricatorTestWorker", "{}"))).id
        run(store.complete(task_id, 1234))
    return store, clock


class _Broken(MemoryTaskStore):
    def __getattribute__(self, name):
        if name in (
            "enqueue",
            "lease",
            "complete",
            "fail",
            "yield_",
            "cancel",
            "awaken",
            "stats",
            "list_tasks",
            "get_task",
            "get_archived",
        ):

            async def refused(*args, **kwargs):
                raise ConnectionRefusedError(
                    "dial tcp 127.0.0.1:3306 phabricator_worker: connection refused"
                )

            return refused
        return super().__getattribute__(name)


@pytest.fixture(scope="module")
def seeded_client() -> Client:
    store, clock = _seeded()
    return Client(store, clock)


def test_fixture_directories_are_not_empty():
    assert FIXTURES and UNAVAILABLE


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.stem for f in FIXTURES])
@pytest_twisted.ensureDeferred
async def test_contract(seeded_client, fixture):
    with logged_events() as events:
        await replay(seeded_client.stub, fixture)
    assert crashes(events) == []


@pytest.mark.parametrize("fixture", UNAVAILABLE, ids=[f.stem for f in UNAVAILABLE])
@pytest_twisted.ensureDeferred
async def test_contract_unavailable(fixture):
    clock = task.Clock()
    clock.advance(T0)
    await replay(Client(_Broken(clock), clock).stub, fixture)
