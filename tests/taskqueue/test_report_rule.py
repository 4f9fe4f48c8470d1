"""The report rule (gorge/taskqueue/report_rule.py) over every input: the
TaskStore fencing note, and the table the Redis scripts read it by."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gorge.taskqueue.model import (
    REPORT_COMPLETE,
    REPORT_FAIL,
    REPORT_YIELD,
    RESULT_CANCELLED,
    RESULT_FAILURE,
    RESULT_SUCCESS,
    Report,
)
from gorge.taskqueue.report_rule import (
    FENCE,
    REFUSALS,
    ROW_KINDS,
    RowFacts,
    Step,
    Verdict,
    judge,
    refusal,
    row_kind,
    step_of,
    verdict_key,
    verdict_table,
)
from gorge.taskqueue.store import LeaseConflict, TaskNotFound

# A few owners, so that generated rows often match the fence.
owners = st.sampled_from([None, "", "w1", "w2", FENCE, "(yield)"])
fences = st.sampled_from([None, "w1", "w2", FENCE])
steps = st.sampled_from(list(Step))
results = st.sampled_from([RESULT_SUCCESS, RESULT_FAILURE, RESULT_CANCELLED])
rows = st.one_of(
    st.builds(RowFacts, active=st.just(True), active_owner=owners),
    st.builds(RowFacts, archived_result=results, archived_owner=owners),
    st.just(RowFacts()),
)

_CHANGES = {
    Step.COMPLETE: Verdict.ARCHIVE_SUCCESS,
    Step.FAIL_PERMANENT: Verdict.ARCHIVE_FAILURE,
    Step.FAIL_TEMPORARY: Verdict.RETRY_LATER,
    Step.YIELD: Verdict.YIELD,
    Step.CANCEL: Verdict.ARCHIVE_CANCELLED,
}


def fencing_note(step: Step, fence: str | None, row: RowFacts) -> Verdict:
    """The note in gorge/taskqueue/store.py, read case by case."""
    replayable = (
        step is Step.COMPLETE
        and row.archived_result == RESULT_SUCCESS
        and (fence is None or row.archived_owner == fence)
    )
    if fence is None:
        if row.active:
            return _CHANGES[step]
        return Verdict.REPLAY if replayable else Verdict.NOT_FOUND
    if row.active and row.active_owner == fence:
        return _CHANGES[step]
    if row.active:
        return Verdict.CONFLICT
    if row.archived_result is not None:
        return Verdict.REPLAY if replayable else Verdict.CONFLICT
    return Verdict.NOT_FOUND


@given(steps, fences, rows)
def test_the_rule_is_the_fencing_note(step, fence, row):
    assert judge(step, fence, row) is fencing_note(step, fence, row)


@given(steps, fences, rows)
def test_a_row_gets_the_verdict_of_its_kind(step, fence, row):
    """What the Redis scripts rely on: the verdict depends on the row's kind
    alone, so the table of one example per kind answers for every row."""
    kind = row_kind(fence, row)
    assert kind in ROW_KINDS
    expected = verdict_table()[verdict_key(step, fence is not None, kind)]
    assert judge(step, fence, row).value == expected


@given(steps, rows)
def test_unfenced_calls_never_conflict(step, row):
    assert judge(step, None, row) is not Verdict.CONFLICT


@given(steps, fences, rows)
def test_only_an_active_row_changes(step, fence, row):
    verdict = judge(step, fence, row)
    if verdict not in REFUSALS and verdict is not Verdict.REPLAY:
        assert row.active
        assert verdict is _CHANGES[step]


@given(steps, fences, rows)
def test_only_a_complete_replays_and_only_a_success(step, fence, row):
    if judge(step, fence, row) is Verdict.REPLAY:
        assert step is Step.COMPLETE
        assert not row.active and row.archived_result == RESULT_SUCCESS


def test_the_table_has_every_step_fence_and_kind():
    table = verdict_table()
    assert len(table) == len(Step) * 2 * len(ROW_KINDS)
    assert set(table.values()) <= {v.value for v in Verdict}


@given(st.sampled_from([REPORT_COMPLETE, REPORT_FAIL, REPORT_YIELD]), st.booleans())
def test_step_of_a_report(outcome, permanent):
    step = step_of(Report(1, outcome, permanent=permanent))
    if outcome == REPORT_COMPLETE:
        assert step is Step.COMPLETE
    elif outcome == REPORT_YIELD:
        assert step is Step.YIELD
    else:
        assert step is (Step.FAIL_PERMANENT if permanent else Step.FAIL_TEMPORARY)


def test_refusals_raise_what_the_single_calls_raise():
    assert isinstance(refusal(Verdict.CONFLICT, 7), LeaseConflict)
    assert isinstance(refusal(Verdict.NOT_FOUND, 7), TaskNotFound)
