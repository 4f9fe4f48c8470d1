"""The per-hook lines: one row of a hook at a time, the oldest idle hook first."""

from __future__ import annotations

from gorge.webhook.claims import Candidate
from gorge.webhook.lines import HookLines
from gorge.webhook.observation import Hook


def candidate(request_id: int, hook: str) -> Candidate:
    return Candidate(
        id=request_id,
        phid=f"PHID-HWBR-{request_id}",
        hook_phid=hook,
        object_phid="PHID-TASK-x",
        properties="{}",
        last_result="none",
        last_epoch=0,
        date_created=0,
        version=0,
    )


def hook(phid: str) -> Hook:
    return Hook(id=1, phid=phid, name=phid, uri="http://x/", status="enabled", hmac_key="k")


def test_slots_take_the_oldest_row_of_an_idle_hook():
    lines = HookLines()
    lines.replace([candidate(1, "a"), candidate(2, "a"), candidate(3, "b")], {"a": hook("a")})
    first = lines.take_next()
    second = lines.take_next()
    assert (first.id, second.id) == (1, 3)
    assert lines.take_next() is None  # both hooks busy: row 2 waits for row 1
    assert lines.hook("a") == hook("a") and lines.hook("b") is None
    lines.release(first)
    assert lines.take_next().id == 2


def test_a_row_dealt_with_before_its_post_hands_on_to_its_hook_next():
    lines = HookLines()
    lines.replace([candidate(1, "a"), candidate(2, "b"), candidate(3, "a")], {})
    first = lines.take_next()
    assert lines.continue_after(first, stopping=False).id == 3
    # No row of that hook left: the oldest row of any idle hook, then nothing.
    assert lines.continue_after(candidate(3, "a"), stopping=False).id == 2
    assert lines.continue_after(candidate(2, "b"), stopping=False) is None


def test_once_stopping_a_slot_takes_nothing_more():
    lines = HookLines()
    lines.replace([candidate(1, "a"), candidate(2, "a"), candidate(3, "b")], {})
    first = lines.take_next()
    assert lines.continue_after(first, stopping=True) is None
    assert lines.take_next().id == 2  # the hook was freed


def test_rows_in_process_are_left_out_of_the_next_tick():
    lines = HookLines()
    lines.replace([candidate(1, "a"), candidate(2, "b")], {})
    taken = lines.take_next()
    lines.replace([candidate(1, "a"), candidate(2, "b"), candidate(4, "c")], {})
    assert lines.waiting() == 2
    assert [lines.take_next().id, lines.take_next().id] == [2, 4]
    lines.release(taken)
    assert lines.take_next() is None


def test_dropping_a_hook_forgets_its_waiting_rows_only():
    lines = HookLines()
    lines.replace([candidate(1, "a"), candidate(2, "a"), candidate(3, "b")], {})
    assert lines.drop("a") == 2 and lines.drop("a") == 0
    assert lines.waiting() == 1
    lines.clear()
    assert lines.waiting() == 0 and lines.take_next() is None


def test_a_hooks_following_row_keeps_the_hook_busy_until_both_are_released():
    lines = HookLines()
    lines.replace([candidate(1, "a"), candidate(2, "a"), candidate(3, "a")], {})
    first = lines.take_next()
    following = lines.take_following(first)
    assert following.id == 2
    lines.release(first)
    assert lines.take_next() is None  # row 2 still holds the hook
    lines.release(following)
    assert lines.take_next().id == 3


def test_only_a_row_in_process_has_a_following_row():
    lines = HookLines()
    lines.replace([candidate(1, "a"), candidate(2, "a")], {})
    assert lines.take_following(candidate(1, "a")) is None
    assert lines.waiting() == 2
