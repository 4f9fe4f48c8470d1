"""The once-a-minute summary line of the delivery loop."""

from __future__ import annotations

from twisted.internet import task

from gorge.webhook.summary import SUMMARY_EVERY, Summary


def test_the_summary_counts_a_minute_then_starts_again(captured_log):
    clock = task.Clock()
    summary = Summary(clock)
    summary.delivered += 2
    summary.maybe_log()
    assert captured_log.named("WEBHOOK_SUMMARY") == []
    clock.advance(SUMMARY_EVERY)
    summary.maybe_log()
    (line,) = captured_log.named("WEBHOOK_SUMMARY")
    assert line["delivered"] == 2 and line["failed"] == 0
    assert summary.snapshot() == dict.fromkeys(Summary.FIELDS, 0)
    clock.advance(SUMMARY_EVERY)
    summary.maybe_log()  # a quiet minute logs nothing
    assert len(captured_log.named("WEBHOOK_SUMMARY")) == 1
