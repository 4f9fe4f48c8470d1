"""What a report means for the row it names: one rule for every backend.

A worker's complete, fail or yield, and an operator's cancel, name a task.
What the backend then does depends on nothing but the step, the lease owner
the call is fenced by (None: unfenced) and a few facts of the row: is it
active and who holds it, or was it archived, with which result and by whom.
:func:`judge` is that decision, pure; each backend gathers the facts in its
own atomic step (a locked read, one Lua script, the model's dicts), asks the
rule and carries out the :class:`Verdict`.

The Redis scripts cannot call Python without giving up their one atomic
step, so they read the rule as a table: :func:`verdict_table` evaluates
:func:`judge` once per kind of row (:func:`row_kind`, which the scripts
compute the same way) and the table is handed to the scripts at start.

The rule is the TaskStore fencing note (gorge/taskqueue/store.py); the range
of a computed expiry is checked after it, by the backend.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gorge.taskqueue.model import (
    REPORT_COMPLETE,
    REPORT_FAIL,
    RESULT_CANCELLED,
    RESULT_FAILURE,
    RESULT_SUCCESS,
    ArchivedTask,
    Report,
    Task,
)
from gorge.taskqueue.store import LeaseConflict, TaskNotFound


class Step(enum.Enum):
    """What the call asks of the task."""

    COMPLETE = "complete"
    FAIL_PERMANENT = "fail_permanent"
    FAIL_TEMPORARY = "fail_temporary"
    YIELD = "yield"
    CANCEL = "cancel"


class Verdict(enum.Enum):
    """What the backend does."""

    ARCHIVE_SUCCESS = "archive_success"
    ARCHIVE_FAILURE = "archive_failure"
    ARCHIVE_CANCELLED = "archive_cancelled"
    RETRY_LATER = "retry_later"
    YIELD = "yield"
    # Answer the archived success again and write nothing: the worker sent
    # its complete twice, and the first one inserted any follow-ups.
    REPLAY = "replay"
    CONFLICT = "conflict"
    NOT_FOUND = "not_found"


@dataclass(frozen=True)
class RowFacts:
    """What the backend read about the named task: its active row's lease
    owner, or its archive row's result and lease owner; neither when the id
    names nothing (or an archive record already pruned)."""

    active: bool = False
    active_owner: str | None = None
    archived_result: int | None = None
    archived_owner: str | None = None

    @classmethod
    def of(cls, active: Task | None, archived: ArchivedTask | None = None) -> RowFacts:
        if active is not None:
            return cls(active=True, active_owner=active.lease_owner)
        if archived is not None:
            return cls(archived_result=archived.result, archived_owner=archived.lease_owner)
        return cls()


# What an active row held by the caller (or any active row, unfenced) becomes.
_CHANGE = {
    Step.COMPLETE: Verdict.ARCHIVE_SUCCESS,
    Step.FAIL_PERMANENT: Verdict.ARCHIVE_FAILURE,
    Step.FAIL_TEMPORARY: Verdict.RETRY_LATER,
    Step.YIELD: Verdict.YIELD,
    Step.CANCEL: Verdict.ARCHIVE_CANCELLED,
}

# The verdicts that change nothing; what the single call raises for each.
REFUSALS = frozenset({Verdict.CONFLICT, Verdict.NOT_FOUND})


def judge(step: Step, fence: str | None, row: RowFacts) -> Verdict:
    """The verdict for ``step`` on ``row``, fenced by ``fence`` unless None."""
    if row.active:
        if fence is not None and row.active_owner != fence:
            return Verdict.CONFLICT
        return _CHANGE[step]
    if row.archived_result is not None:
        if (
            step is Step.COMPLETE
            and row.archived_result == RESULT_SUCCESS
            and (fence is None or row.archived_owner == fence)
        ):
            return Verdict.REPLAY
        if fence is not None:
            return Verdict.CONFLICT
    return Verdict.NOT_FOUND


# The archive result each archiving verdict records.
_ARCHIVE_RESULTS = {
    Verdict.ARCHIVE_SUCCESS: RESULT_SUCCESS,
    Verdict.ARCHIVE_FAILURE: RESULT_FAILURE,
    Verdict.ARCHIVE_CANCELLED: RESULT_CANCELLED,
}


def archive_result(verdict: Verdict) -> int:
    """The result an archiving verdict records (KeyError for any other)."""
    return _ARCHIVE_RESULTS[verdict]


def step_of(report: Report) -> Step:
    """The step a batched report's entry asks for."""
    if report.outcome == REPORT_COMPLETE:
        return Step.COMPLETE
    if report.outcome == REPORT_FAIL:
        return Step.FAIL_PERMANENT if report.permanent else Step.FAIL_TEMPORARY
    return Step.YIELD


def refusal(verdict: Verdict, task_id: int) -> Exception:
    """The error a refusing verdict is answered with."""
    if verdict is Verdict.CONFLICT:
        return LeaseConflict(task_id)
    return TaskNotFound(task_id)


def refuse(verdict: Verdict, task_id: int) -> Verdict:
    """``verdict`` when it changes the task, else raise its refusal."""
    if verdict in REFUSALS:
        raise refusal(verdict, task_id)
    return verdict


# The kinds of row the rule tells apart, with one row of each kind for a
# caller fenced by FENCE (``_held`` rows are the fence's own).  Every row of
# a kind gets the verdict its example gets: tests/taskqueue/test_report_rule.py.
FENCE = "fence"
_OTHER = "other"
ROW_KINDS = {
    "active_held": RowFacts(active=True, active_owner=FENCE),
    "active_other": RowFacts(active=True, active_owner=_OTHER),
    "archived_success_held": RowFacts(archived_result=RESULT_SUCCESS, archived_owner=FENCE),
    "archived_success_other": RowFacts(archived_result=RESULT_SUCCESS, archived_owner=_OTHER),
    "archived_unsuccessful": RowFacts(archived_result=RESULT_FAILURE, archived_owner=FENCE),
    "missing": RowFacts(),
}


def row_kind(fence: str | None, row: RowFacts) -> str:
    """Which of :data:`ROW_KINDS` ``row`` is, for a caller fenced by
    ``fence``; unfenced, every row is the caller's.  The scripts' report_verdict
    (gorge/taskqueue/lua/parts/verdict.lua) computes the same."""
    if row.active:
        return "active_held" if fence is None or row.active_owner == fence else "active_other"
    if row.archived_result is None:
        return "missing"
    if row.archived_result != RESULT_SUCCESS:
        return "archived_unsuccessful"
    if fence is None or row.archived_owner == fence:
        return "archived_success_held"
    return "archived_success_other"


def verdict_key(step: Step, fenced: bool, kind: str) -> str:
    """The table key the scripts look a verdict up by."""
    return f"{step.value}/{'fenced' if fenced else 'unfenced'}/{kind}"


def verdict_table() -> dict[str, str]:
    """:func:`judge` for every step, fenced or not, and kind of row."""
    return {
        verdict_key(step, fenced, kind): judge(step, FENCE if fenced else None, row).value
        for step in Step
        for fenced in (False, True)
        for kind, row in ROW_KINDS.items()
    }
