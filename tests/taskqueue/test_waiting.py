"""The age of the oldest waiting task per class and priority band, on every backend."""

from __future__ import annotations

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from gorge.taskqueue import redis_reads, sql_reads
from gorge.taskqueue.memory import MemoryTaskStore
from gorge.taskqueue.metrics import TaskQueueMetrics
from gorge.taskqueue.model import EnqueueRequest
from gorge.taskqueue.waiting import BANDS, Waiting, oldest_waiting, priority_band
from tests.taskqueue.conftest import T0


def test_priorities_fall_in_phorges_bands():
    assert [priority_band(p) for p in (0, 999, 1000, 1999, 2000, 2499, 2500)] == [
        "alerts",
        "alerts",
        "alerts",
        "alerts",
        "default",
        "default",
        "commit",
    ]
    assert [priority_band(p) for p in (3000, 3499, 3500, 3999, 4000, 2**32 - 1)] == [
        "bulk",
        "bulk",
        "index",
        "index",
        "import",
        "import",
    ]


@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_a_priority_is_in_the_band_of_the_highest_named_priority_not_above_it(priority):
    band = priority_band(priority)
    starts = [start for start, name in BANDS if name == band]
    later = [start for start, _ in BANDS if start > starts[0]]
    assert priority >= starts[0] or band == "alerts"
    assert not later or priority < later[0]


def test_the_oldest_of_each_class_and_band_counts_and_ages_never_go_negative():
    reading = oldest_waiting(
        T0,
        [("A", 2000, T0 - 50), ("A", 2100, T0 - 80), ("A", 1000, T0 - 5), ("B", 2000, T0 + 9)],
    )
    assert reading.ages() == {("A", "default"): 80, ("A", "alerts"): 5, ("B", "default"): 0}
    assert reading.to_json() == [
        {"taskClass": "A", "priorityBand": "default", "ageSeconds": 80},
        {"taskClass": "A", "priorityBand": "alerts", "ageSeconds": 5},
        {"taskClass": "B", "priorityBand": "default", "ageSeconds": 0},
    ]


async def _scenario(store, clock) -> list[dict]:
    """New, delayed, leased, expired and retrying tasks; the readings on the way."""
    readings = []
    first = await store.enqueue(EnqueueRequest("Search", "{}", priority=2000))
    clock.advance(10)
    await store.enqueue(EnqueueRequest("Search", "{}", priority=2000))
    await store.enqueue(EnqueueRequest("Feed", "{}", priority=1000))
    await store.enqueue(EnqueueRequest("Feed", "{}", priority=3500))
    await store.enqueue(EnqueueRequest("Mail", "{}", priority=2000, delay_until=T0 + 1000))
    (feed,) = await store.lease("w", 1, 60, ["Feed"])  # the alerts one
    assert feed.priority == 1000
    readings.append((await store.oldest_waiting()).to_json())
    clock.advance(90)  # T0 + 100: the Feed lease ran out at T0 + 70
    readings.append((await store.oldest_waiting()).to_json())
    (search,) = await store.lease("w", 1, 600, ["Search"])
    assert search.id == first.id
    await store.fail(search.id, False, 300)  # retries from T0 + 400
    readings.append((await store.oldest_waiting()).to_json())
    clock.advance(901)  # T0 + 1001: the delay and the retry wait are over
    readings.append((await store.oldest_waiting()).to_json())
    return readings


def _row(task_class: str, band: str, age: int) -> dict:
    return {"taskClass": task_class, "priorityBand": band, "ageSeconds": age}


EXPECTED = [
    [_row("Search", "default", 10), _row("Feed", "index", 0)],
    [_row("Search", "default", 100), _row("Feed", "index", 90), _row("Feed", "alerts", 30)],
    # The failed one waits again only from its retry time: the second Search leads.
    [_row("Feed", "index", 90), _row("Search", "default", 90), _row("Feed", "alerts", 30)],
    [
        _row("Feed", "index", 991),
        _row("Search", "default", 991),
        _row("Feed", "alerts", 931),
        _row("Mail", "default", 1),
    ],
]


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_every_backend_reads_the_same_ages(backend_store, clock):
    assert await _scenario(backend_store, clock) == EXPECTED


@pytest_twisted.ensureDeferred
async def test_the_memory_model_reads_them_too(clock):
    assert await _scenario(MemoryTaskStore(clock), clock) == EXPECTED


async def _retried(store, clock) -> list[dict]:
    task = await store.enqueue(EnqueueRequest("Retried", "{}"))
    await store.cancel(task.id)
    clock.advance(50)
    retried = await store.retry(task.id, False)
    assert retried.lease_expires == 0  # Phorge's unarchive: leasable at once
    return (await store.oldest_waiting()).to_json()


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_a_retried_task_has_waited_since_it_was_created_not_since_1970(backend_store, clock):
    assert await _retried(backend_store, clock) == [_row("Retried", "default", 50)]


@pytest_twisted.ensureDeferred
async def test_a_retried_task_in_the_memory_model_too(clock):
    assert await _retried(MemoryTaskStore(clock), clock) == [_row("Retried", "default", 50)]


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_only_the_heads_of_the_queue_are_read(backend_store, clock, monkeypatch):
    """A class whose first task lies behind the head rows is left out, never
    reported younger than it is; the band's oldest task is always in."""
    home = redis_reads if backend_store.backend == "redis" else sql_reads
    monkeypatch.setattr(home, "HEAD_ROWS", 2)
    for task_class in ("Head", "Head", "Deep"):
        await backend_store.enqueue(EnqueueRequest(task_class, "{}", priority=3000))
        clock.advance(1)
    await backend_store.enqueue(EnqueueRequest("Other", "{}", priority=3100))
    assert (await backend_store.oldest_waiting()).to_json() == [
        _row("Head", "bulk", 3),
        _row("Other", "bulk", 0),
    ]


def test_the_gauge_has_a_series_per_class_and_band_waiting_and_drops_the_rest():
    registry = CollectorRegistry()
    metrics = TaskQueueMetrics(registry)
    name = b"gorge_taskqueue_oldest_waiting_seconds"
    assert metrics.waiting is None
    assert [line for line in generate_latest(registry).splitlines() if line.startswith(name)] == []
    metrics.observe_waiting(Waiting(T0, {("Search", "default"): T0 - 42, ("Feed", "bulk"): T0}))
    assert [line for line in generate_latest(registry).splitlines() if line.startswith(name)] == [
        name + b'{priority_band="bulk",task_class="Feed"} 0.0',
        name + b'{priority_band="default",task_class="Search"} 42.0',
    ]
    metrics.observe_waiting(Waiting(T0 + 5, {("Feed", "bulk"): T0}))
    assert [line for line in generate_latest(registry).splitlines() if line.startswith(name)] == [
        name + b'{priority_band="bulk",task_class="Feed"} 5.0',
    ]
