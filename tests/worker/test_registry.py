"""Registry and lease-class table, test-worker emulation."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from gorge.worker.handlers.test_worker import TestWorker
from gorge.worker.outcome import PermanentFailure, RetryLater
from gorge.worker.registry import LeasePlan, Registry, is_php_class_name, parse_class_list

NAMES = st.sampled_from(["A", "B", "C", "D", "E"])


def handler(task, data):
    return None


@given(registered=st.sets(NAMES), filt=st.lists(NAMES, max_size=5), fallback=st.booleans())
def test_lease_classes_follow_the_table(registered, filt, fallback):
    registry = Registry()
    for name in registered:
        registry.register(name, handler)
    if fallback:
        registry.set_fallback(handler)
    plan = LeasePlan(registry, tuple(filt))
    if fallback:
        assert plan.task_classes == (sorted(set(filt)) or None)
    elif filt:
        assert plan.task_classes == sorted(registered & set(filt))
    else:
        assert plan.task_classes == sorted(registered)
    for name in "ABCDEFG":
        expected = (not filt or name in filt) and (fallback or name in registered)
        assert plan.runnable(name) is expected
    supported = registry.supported_classes()
    assert supported == sorted(registered) + (["*"] if fallback else [])


def test_class_list_parsing_and_php_names():
    assert parse_class_list(" A, ,B,A ,") == ("A", "B")
    assert parse_class_list("") == ()
    assert is_php_class_name("PhabricatorSearchWorker") and is_php_class_name("_x9")
    for bad in ("", "9x", "A-B", "A\\B", "a b", "x" * 65, None, 5):
        assert not is_php_class_name(bad)
    assert is_php_class_name("x" * 64)


def run(worker, data, failure_count=0):
    d = Deferred.fromCoroutine(worker({"id": 1, "failureCount": failure_count}, data))
    results = []
    d.addBoth(results.append)
    return d, results


def test_test_worker_emulation():
    clock = Clock()
    worker = TestWorker(clock)
    d, results = run(worker, '{"duration": 3}')
    clock.advance(2.9)
    assert results == []
    clock.advance(0.1)
    assert results == [None]
    _, results = run(worker, '{"doWork":"fail-temporary","getWaitBeforeRetry":17}')
    assert results[0].check(RetryLater) and results[0].value.retry_wait == 17
    _, results = run(worker, '{"doWork":"fail-permanent"}')
    assert results[0].check(PermanentFailure)
    _, results = run(worker, '{"getMaximumRetryCount":2}', failure_count=3)
    assert results[0].check(PermanentFailure)
    _, results = run(worker, '{"getMaximumRetryCount":2}', failure_count=2)
    assert results == [None]
    _, results = run(worker, "not json")
    assert results[0].check(PermanentFailure)


def test_test_worker_waits_fractional_and_numeric_string_durations():
    # PHP: usleep($duration * 1000000), so 0.5 and "1.5" are waits too.
    clock = Clock()
    worker = TestWorker(clock)
    _, results = run(worker, '{"duration": 0.5}')
    clock.advance(0.4)
    assert results == []
    clock.advance(0.1)
    assert results == [None]
    _, results = run(worker, '{"duration": "1.5"}')
    clock.advance(1.4)
    assert results == []
    clock.advance(0.1)
    assert results == [None]


def test_test_worker_data_too_deep_to_decode_fails_permanently():
    _, results = run(TestWorker(Clock()), '{"doWork":' + "[" * 100_000)
    assert results[0].check(PermanentFailure)
