"""The PHP executor pool's supervision, against real child processes that
speak the executor's wire (tests/worker/executor/stand_in.py): one task per
process at a time, recycling, replacement after a death, back-off while
they die before they are ready, and the lease deadline ending a process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import deferLater

from gorge.worker.executor import pool as pool_module
from gorge.worker.executor.pool import ExecutorPool, PoolSettings
from gorge.worker.executor.process import ExecutorFailed

STAND_IN = Path(__file__).with_name("stand_in.py")
BOUND = 30.0


def _settings(size=2, max_tasks=1000, max_memory=10**9, **env) -> PoolSettings:
    return PoolSettings(
        argv=(sys.executable, str(STAND_IN), "/nowhere"),
        env={"PATH": os.environ.get("PATH", ""), **env},
        size=size,
        max_tasks=max_tasks,
        max_memory=max_memory,
    )


async def _until(check, what: str):
    """Wait on the reactor for ``check()``; fail after BOUND seconds."""
    deadline = reactor.seconds() + BOUND
    while not check():
        if reactor.seconds() > deadline:
            raise AssertionError(f"not reached within {BOUND:g}s: {what}")
        await deferLater(reactor, 0.02)


def _bounded(d: Deferred) -> Deferred:
    return d.addTimeout(BOUND, reactor)


@pytest.fixture
def pools():
    started: list[ExecutorPool] = []

    def make(settings: PoolSettings) -> ExecutorPool:
        pool = ExecutorPool(settings, reactor)
        pool.start()
        started.append(pool)
        return pool

    yield make
    for pool in started:
        pytest_twisted.blockon(_bounded(Deferred.fromCoroutine(pool.stop())))


def _run(pool: ExecutorPool, task_class: str, **extra) -> Deferred:
    return _bounded(Deferred.fromCoroutine(pool.run({"taskClass": task_class, **extra})))


@pytest_twisted.ensureDeferred
async def test_tasks_run_in_long_lived_processes_and_readiness_follows(pools):
    pool = pools(_settings(size=2))
    assert pool.readiness_reason() == "php executors: starting"
    answers = [await _run(pool, "Succeed") for _ in range(6)]
    assert {a["result"] for a in answers} == {"success"}
    # Six tasks, at most two processes: each loaded once and reused.
    assert len({a["pid"] for a in answers}) <= 2
    assert pool.started == 2
    assert pool.readiness_reason() is None


@pytest_twisted.ensureDeferred
async def test_at_most_size_tasks_run_at_once_and_the_rest_wait(pools):
    pool = pools(_settings(size=2))
    hanging = [_run(pool, "Hang"), _run(pool, "Hang")]
    waiting = _run(pool, "Succeed")
    await _until(lambda: pool.busy == 2, "both executors busy")
    assert not waiting.called
    # The lease deadline of one hanging task ends its process; the waiting
    # task then runs in the replacement.
    hanging[0].cancel()
    with pytest.raises(CancelledError):
        await hanging[0]
    answer = await waiting
    assert answer["result"] == "success"
    hanging[1].cancel()
    with pytest.raises(CancelledError):
        await hanging[1]
    assert pool.started >= 3


@pytest_twisted.ensureDeferred
async def test_a_process_that_dies_mid_task_fails_that_task_and_is_replaced(pools):
    pool = pools(_settings(size=1))
    first = await _run(pool, "Succeed")
    with pytest.raises(ExecutorFailed, match="exit"):
        await _run(pool, "Die")
    after = await _run(pool, "Succeed")
    assert after["pid"] != first["pid"]
    assert pool.died == 1


@pytest_twisted.ensureDeferred
async def test_a_cancelled_task_ends_its_process_which_is_replaced_as_no_death(pools):
    """A lost lease cancels the task: its executor is killed (PHP cannot be
    stopped mid-task otherwise) and replaced at once, logged once as a
    replacement naming the task, not as a death."""
    from twisted.logger import globalLogPublisher

    seen: list[dict] = []
    globalLogPublisher.addObserver(seen.append)
    try:
        pool = pools(_settings(size=1))
        first = await _run(pool, "Succeed")
        hanging = _run(pool, "Hang", taskID=41)
        await _until(lambda: pool.busy == 1, "the executor busy")
        hanging.cancel()
        with pytest.raises(CancelledError):
            await hanging
        after = await _run(pool, "Succeed")
    finally:
        globalLogPublisher.removeObserver(seen.append)
    assert after["pid"] != first["pid"]
    assert (pool.replaced, pool.died, pool.started) == (1, 0, 2)
    events = [e for e in seen if "WORKER_EXECUTOR_" in (e.get("log_format") or "")]
    replaced = [e for e in events if "WORKER_EXECUTOR_REPLACED" in e["log_format"]]
    assert [(e["pid"], e["task_id"], e["task_class"]) for e in replaced] == [
        (first["pid"], 41, "Hang")
    ]
    assert not [e for e in events if "WORKER_EXECUTOR_EXITED" in e["log_format"]]


@pytest_twisted.ensureDeferred
async def test_processes_are_recycled_after_max_tasks(pools):
    pool = pools(_settings(size=1, max_tasks=2))
    pids = [(await _run(pool, "Succeed"))["pid"] for _ in range(5)]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]
    assert pool.recycled == 2
    assert pool.died == 0


@pytest_twisted.ensureDeferred
async def test_processes_are_recycled_past_the_memory_bound(pools):
    pool = pools(_settings(size=1, max_memory=5000))
    small = await _run(pool, "Grow", data="10")
    same = await _run(pool, "Grow", data="6000")
    fresh = await _run(pool, "Succeed")
    assert small["pid"] == same["pid"] != fresh["pid"]
    assert pool.recycled == 1


@pytest_twisted.ensureDeferred
async def test_output_of_a_task_is_logged_and_never_read_as_an_answer(pools):
    from twisted.logger import globalLogPublisher

    seen: list[dict] = []
    globalLogPublisher.addObserver(seen.append)
    try:
        pool = pools(_settings(size=1))
        answer = await _run(pool, "Print")
        await _until(
            lambda: (
                len([e for e in seen if "WORKER_EXECUTOR_OUTPUT" in (e.get("log_format") or "")])
                >= 2
            ),
            "both output lines logged",
        )
    finally:
        globalLogPublisher.removeObserver(seen.append)
    assert answer["result"] == "success"
    lines = {
        (e["stream"], e["line"])
        for e in seen
        if "WORKER_EXECUTOR_OUTPUT" in (e.get("log_format") or "")
    }
    assert lines == {("stdout", "a line on stdout"), ("stderr", "a line on stderr")}


@pytest_twisted.ensureDeferred
async def test_a_broken_phorge_backs_off_and_recovers(pools, tmp_path, monkeypatch):
    monkeypatch.setattr(pool_module, "RESTART_FIRST", 0.05)
    broken = tmp_path / "broken"
    broken.write_text("")
    pool = pools(_settings(size=1, STAND_IN_FATAL_FILE=str(broken)))
    await _until(lambda: pool.died >= 3, "three failed starts")
    reason = pool.readiness_reason()
    assert reason is not None and "Phorge is broken here" in reason
    # The pauses grow: three deaths took at least 0.05 + 0.1 of waiting.
    broken.unlink()
    answer = await _run(pool, "Succeed")
    assert answer["result"] == "success"
    assert pool.readiness_reason() is None


@pytest_twisted.ensureDeferred
async def test_stop_lets_idle_executors_exit_and_cancels_waiters(pools):
    pool = ExecutorPool(_settings(size=1), reactor)
    pool.start()
    await _run(pool, "Succeed")
    hanging = _run(pool, "Hang")
    waiter = _run(pool, "Succeed")
    await _until(lambda: pool.busy == 1, "the executor busy")
    hanging.cancel()
    with pytest.raises(CancelledError):
        await hanging
    await _bounded(Deferred.fromCoroutine(pool.stop()))
    with pytest.raises(CancelledError):
        await waiter
    assert pool.readiness_reason() is not None


@pytest_twisted.ensureDeferred
async def test_the_gate_pauses_delegation_only_while_phorge_cannot_load(
    pools, tmp_path, monkeypatch
):
    from gorge.worker.executor.pool import ExecutorGate

    monkeypatch.setattr(pool_module, "RESTART_FIRST", 0.05)
    broken = tmp_path / "broken"
    broken.write_text("")
    pool = pools(_settings(size=1, STAND_IN_FATAL_FILE=str(broken)))
    gate = ExecutorGate(pool, lambda name: name != "Native")
    assert not gate.paused  # starting is not broken
    await _until(lambda: gate.paused, "delegation paused after failed starts")
    assert gate.delegated("PhabricatorSearchWorker") and not gate.delegated("Native")
    broken.unlink()
    await _until(lambda: not gate.paused, "delegation resumed once Phorge loads")


@pytest_twisted.ensureDeferred
async def test_the_executors_gauge_follows_their_states(reactor_metrics):
    pool, registry = reactor_metrics
    await _run(pool, "Succeed")

    def value(state):
        return registry.get_sample_value("gorge_worker_php_executors", {"state": state})

    await _until(lambda: value("idle") == 2, "both executors idle")
    assert (value("busy"), value("starting")) == (0, 0)
    # While a task runs, its executor counts as busy (not only after it).
    hanging = _run(pool, "Hang")
    assert (value("busy"), value("idle")) == (1, 1)
    hanging.cancel()
    with pytest.raises(CancelledError):
        await hanging
    await _until(lambda: value("idle") == 2, "the replacement idle")
    assert value("busy") == 0


@pytest.fixture
def reactor_metrics():
    from prometheus_client import CollectorRegistry

    from gorge.worker.metrics import WorkerMetrics

    registry = CollectorRegistry()
    pool = ExecutorPool(_settings(size=2), reactor, WorkerMetrics(registry))
    pool.start()
    yield pool, registry
    pytest_twisted.blockon(_bounded(Deferred.fromCoroutine(pool.stop())))
