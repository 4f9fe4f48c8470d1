"""Contract fixtures (platform.md §12) replayed in-process through the real site.

Seed (§12.2): ids 1-3 enqueued as PhabricatorTestWorker with data
{"key":"value"} and objectPHID PHID-TASK-abcdefghijklmnopqrst, then ids 4-5
(data {}) enqueued and completed with duration 1234 - on the in-memory store.
``unavailable/`` runs against a store whose every call fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import task
from twisted.logger import globalLogPublisher

from gorge.taskqueue.memory import MemoryTaskStore
from gorge.taskqueue.model import EnqueueRequest
from tests.taskqueue.conftest import T0
from tests.taskqueue.helpers import Client

HERE = Path(__file__).parent / "contract"
FIXTURES = sorted(HERE.glob("*.json"))
UNAVAILABLE = sorted((HERE / "unavailable").glob("*.json"))
_MISSING = object()


def resolve(doc, path: str):
    """Dot path; numeric segments index lists; the longest literal key wins first."""
    if path == "":
        return doc
    if isinstance(doc, list):
        head, _, rest = path.partition(".")
        if head.isdigit() and int(head) < len(doc):
            return resolve(doc[int(head)], rest)
        return _MISSING
    if not isinstance(doc, dict):
        return _MISSING
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in doc:
            found = resolve(doc[key], ".".join(parts[n:]))
            if found is not _MISSING:
                return found
    return _MISSING


def loosely_equal(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


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
        run(store.enqueue(EnqueueRequest("PhabricatorTestWorker", '{"key":"value"}',
                                         object_phid="PHID-TASK-abcdefghijklmnopqrst")))
    for _ in range(2):
        task_id = run(store.enqueue(EnqueueRequest("PhabricatorTestWorker", "{}"))).id
        run(store.complete(task_id, 1234))
    return store, clock


class _Broken(MemoryTaskStore):
    def __getattribute__(self, name):
        if name in ("enqueue", "lease", "complete", "fail", "yield_", "cancel", "awaken",
                    "stats", "list_tasks", "get_task", "get_archived"):
            async def refused(*args, **kwargs):
                raise ConnectionRefusedError("dial tcp 127.0.0.1:3306 phabricator_worker: "
                                             "connection refused")
            return refused
        return super().__getattribute__(name)


@pytest.fixture(scope="module")
def seeded_client() -> Client:
    store, clock = _seeded()
    return Client(store, clock)


async def replay(client: Client, fixture: Path) -> None:
    spec = json.loads(fixture.read_text())
    assert spec.get("name") and spec["request"]["method"] and spec["request"]["path"], fixture
    request, expect = spec["request"], spec["expect"]
    body = request.get("body")
    code, _ = await client.call(request["method"], request["path"], token=None,
                                raw=None if body is None else body.encode(),
                                headers=request.get("headers") or {})
    raw = client.last_body
    assert code == expect["status"], (fixture.name, raw)
    for name, value in (expect.get("headerEquals") or {}).items():
        assert client.last_headers.getRawHeaders(name.lower()) == [value], name
    for needle in expect.get("bodyContains") or []:
        assert needle.encode() in raw
    for needle in expect.get("bodyNotContains") or []:
        assert needle.encode() not in raw, needle
    if any(k.startswith("json") for k in expect):
        doc = json.loads(raw)
        assert isinstance(doc, dict)
        for path in expect.get("jsonHas") or []:
            found = resolve(doc, path)
            assert found is not _MISSING and found is not None and found != "", path
        for path in expect.get("jsonAbsent") or []:
            assert resolve(doc, path) is _MISSING, path
        for path, value in (expect.get("jsonEquals") or {}).items():
            assert loosely_equal(resolve(doc, path), value), (path, resolve(doc, path), value)
        for path, needles in (expect.get("jsonStringContains") or {}).items():
            found = resolve(doc, path)
            assert isinstance(found, str) and all(n in found for n in needles), path


def _no_crash_events():
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    return events


def test_fixture_directories_are_not_empty():
    assert FIXTURES and UNAVAILABLE


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.stem for f in FIXTURES])
@pytest_twisted.ensureDeferred
async def test_contract(seeded_client, fixture):
    events = _no_crash_events()
    try:
        await replay(seeded_client, fixture)
    finally:
        globalLogPublisher.removeObserver(events.append)
    assert not [e for e in events if str(e.get("log_format", "")).startswith("PANIC_RECOVERED")]


@pytest.mark.parametrize("fixture", UNAVAILABLE, ids=[f.stem for f in UNAVAILABLE])
@pytest_twisted.ensureDeferred
async def test_contract_unavailable(fixture):
    clock = task.Clock()
    clock.advance(T0)
    await replay(Client(_Broken(clock), clock), fixture)
