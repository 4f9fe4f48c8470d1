"""SharedRun: one run at a time, shared by the callers that arrive meanwhile."""

from __future__ import annotations

import pytest
from twisted.internet.defer import CancelledError, Deferred

from gorge.app.shared import SharedRun


class Job:
    def __init__(self) -> None:
        self.runs: list[Deferred[int]] = []

    async def __call__(self) -> int:
        run: Deferred[int] = Deferred()
        self.runs.append(run)
        return await run


def test_callers_during_a_run_share_it_and_one_giving_up_cancels_nothing():
    job = Job()
    shared = SharedRun(job)
    first, second, third = shared(), shared(), shared()
    assert len(job.runs) == 1 and shared.running
    second.cancel()
    assert not job.runs[0].called
    job.runs[0].callback(7)
    assert (first.result, third.result) == (7, 7)
    second.addErrback(lambda f: f.trap(CancelledError))
    assert not shared.running
    shared()  # the run ended: the next call starts another
    assert len(job.runs) == 2


def test_a_failed_run_fails_every_caller_and_is_not_kept():
    job = Job()
    shared = SharedRun(job)
    first, second = shared(), shared()
    job.runs[0].errback(ValueError("down"))
    for waiter in (first, second):
        with pytest.raises(ValueError):
            waiter.result.raiseException()
        waiter.addErrback(lambda f: None)
    shared()
    assert len(job.runs) == 2


def test_a_run_that_ends_at_once_still_answers_its_caller():
    async def at_once() -> str:
        return "done"

    shared = SharedRun(at_once)
    assert shared().result == "done"
    assert not shared.running
