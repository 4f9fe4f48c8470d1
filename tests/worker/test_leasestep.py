"""The consume loop's decisions, on their own: rules that hold for every
state the loop can be in."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gorge.worker.leasestep import (
    LeaseFacts,
    LoopSettings,
    LoopState,
    Turn,
    delay_after_lease,
    idle_after,
    next_step,
    queue_holds_after,
    wants_wake,
)
from gorge.worker.registry import LeasePlan, Registry

CLASS_NAMES = st.sampled_from(["A", "B", "C", "D", "E"])

loop_settings = st.builds(
    LoopSettings,
    lease_limit=st.integers(1, 64),
    max_workers=st.integers(1, 64),
    poll_interval=st.floats(0.01, 60),
    idle_timeout=st.floats(0, 600),
    hibernate=st.floats(0, 600),
    lease_wait=st.floats(0, 60),
)
times = st.floats(0, 1e6)
facts = st.builds(
    LeaseFacts,
    now=times,
    free=st.integers(-8, 64),
    hibernate_until=st.none() | times,
    paused=st.booleans(),
    classes=st.none() | st.lists(CLASS_NAMES, unique=True),
    attempted=st.booleans(),
    failing=st.booleans(),
)


@given(facts, loop_settings)
def test_a_lease_never_asks_for_more_than_the_free_slots_or_the_limit(f, s):
    step = next_step(f, s)
    if step.turn is Turn.LEASE:
        assert 1 <= step.limit <= f.free and step.limit <= s.lease_limit


@given(facts, loop_settings)
def test_the_loop_always_turns_again_within_the_poll_interval(f, s):
    step = next_step(f, s)
    if step.turn is not Turn.LEASE:
        assert 0 <= step.delay <= s.poll_interval


@given(facts, loop_settings)
def test_free_slots_outside_hibernation_and_without_a_pause_are_always_leased(f, s):
    step = next_step(f, s)
    hibernating = f.hibernate_until is not None and f.now < f.hibernate_until
    if f.free > 0 and not f.paused and not hibernating:
        assert step.turn is Turn.LEASE and step.classes == f.classes
    if hibernating:
        assert step.turn is Turn.HIBERNATING and not step.woke
    elif f.hibernate_until is not None:
        assert step.woke


@given(facts, loop_settings)
def test_only_a_healthy_unpaused_loop_lets_the_queue_hold_the_call(f, s):
    step = next_step(f, s)
    if step.turn is Turn.LEASE and step.wait > 0:
        assert f.attempted and not f.failing and not f.paused and step.wait == s.lease_wait


@given(
    registered=st.lists(CLASS_NAMES, unique=True),
    fallback=st.booleans(),
    class_filter=st.lists(CLASS_NAMES, unique=True),
    delegated=st.frozensets(CLASS_NAMES),
    free=st.integers(1, 64),
    s=loop_settings,
)
def test_while_paused_no_delegated_class_is_ever_asked_for(
    registered, fallback, class_filter, delegated, free, s
):
    """The plan's paused class list through next_step, as the consumer
    composes them: never a delegated class, and never "every class"."""
    registry = Registry()
    for name in registered:
        registry.register(name, lambda task, data: None)
    if fallback:
        registry.set_fallback(lambda task, data: None)
    plan = LeasePlan(registry, tuple(class_filter))
    classes = plan.classes_except(delegated.__contains__)
    f = LeaseFacts(
        now=0.0,
        free=free,
        hibernate_until=None,
        paused=True,
        classes=classes,
        attempted=True,
        failing=False,
    )
    step = next_step(f, s)
    if step.turn is Turn.LEASE:
        assert step.classes is not None and step.classes
        assert not delegated & set(step.classes)
        assert step.wait == 0
    else:
        assert step.turn is Turn.ALL_DELEGATED and not classes


@given(
    wait=st.floats(0.01, 60),
    elapsed=st.floats(0, 120),
    count=st.integers(0, 8),
    holds=st.booleans(),
)
def test_only_an_empty_answer_to_a_held_call_says_whether_the_queue_holds(
    wait, elapsed, count, holds
):
    f = LeaseFacts(
        now=0.0,
        free=8,
        hibernate_until=None,
        paused=False,
        classes=None,
        attempted=True,
        failing=False,
    )
    step = next_step(f, LoopSettings(lease_wait=wait, lease_limit=8, max_workers=8))
    after = queue_holds_after(step, count, elapsed, holds)
    assert after == (elapsed >= wait / 2 if count == 0 else holds)


@given(more=st.booleans(), held=st.booleans(), free=st.integers(-4, 64), s=loop_settings)
def test_after_a_lease_an_immediate_call_needs_half_a_batch_of_free_slots(more, held, free, s):
    delay = delay_after_lease(more_waiting=more, held=held, free=free, settings=s)
    if delay == 0:
        assert free >= s.batch_threshold and (more or held)
    if free <= 0:
        assert delay == s.poll_interval  # a full worker still turns every interval
    if delay is None:
        # Only a held call waits for a freed slot: the queue does the waiting.
        assert held and 0 < free < s.batch_threshold


@given(
    count=st.integers(0, 8),
    busy=st.booleans(),
    idle=st.booleans(),
    since=st.none() | times,
    now=times,
    s=loop_settings,
)
def test_idleness_follows_the_answers(count, busy, idle, since, now, s):
    after = idle_after(count, busy, idle, since, now, s)
    if count:
        assert (after.idle, after.since, after.hibernate_until) == (False, None, None)
    elif busy:
        assert (after.idle, after.since, after.hibernate_until) == (idle, since, None)
    elif since is None:
        assert after.since == now and after.idle == idle
    if after.hibernate_until is not None:
        assert after.idle and s.hibernate > 0 and after.hibernate_until == now + s.hibernate
    if after.idle and not idle:
        assert since is not None and s.idle_timeout > 0 and now - since > s.idle_timeout


@given(
    more=st.booleans(),
    holds=st.booleans(),
    hibernating=st.booleans(),
    free=st.integers(-4, 64),
    s=loop_settings,
)
def test_a_freed_slot_wakes_the_loop_only_for_a_batch_of_known_work(
    more, holds, hibernating, free, s
):
    state = LoopState(
        more_waiting=more, queue_holds=holds, hibernate_until=5.0 if hibernating else None
    )
    woken = wants_wake(state, free=free, settings=s)
    assert woken == ((more or holds) and not hibernating and free >= s.batch_threshold)


def test_the_turns_by_example():
    s = LoopSettings(lease_limit=4, max_workers=4, poll_interval=1.0, lease_wait=20.0)
    base = dict(paused=False, classes=["A"], attempted=True, failing=False)
    hibernating = next_step(LeaseFacts(now=10.0, free=4, hibernate_until=10.5, **base), s)
    assert (hibernating.turn, hibernating.delay) == (Turn.HIBERNATING, 0.5)
    full = next_step(LeaseFacts(now=11.0, free=0, hibernate_until=10.5, **base), s)
    assert (full.turn, full.woke, full.delay) == (Turn.FULL, True, 1.0)
    first = next_step(
        LeaseFacts(now=0, free=3, hibernate_until=None, **base | {"attempted": False}), s
    )
    assert (first.turn, first.limit, first.wait) == (Turn.LEASE, 3, 0.0)
    held = next_step(LeaseFacts(now=0, free=8, hibernate_until=None, **base), s)
    assert (held.limit, held.classes, held.wait) == (4, ["A"], 20.0)
    paused = next_step(
        LeaseFacts(now=0, free=4, hibernate_until=None, **base | {"paused": True, "classes": []}),
        s,
    )
    assert (paused.turn, paused.delay) == (Turn.ALL_DELEGATED, 1.0)
