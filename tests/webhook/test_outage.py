"""A database outage in the log: when it starts, once a minute, when it ends."""

from __future__ import annotations

from twisted.internet import task

from gorge.webhook.outage import OUTAGE_LOG_EVERY, Outage


def test_an_outage_is_logged_when_it_starts_once_a_minute_and_when_it_ends(captured_log):
    clock = task.Clock()
    outage = Outage(clock)
    event = "WEBHOOK_POLL_FAILED error={error} reason={reason} since={since}"
    outage.recovered()
    assert captured_log.named("WEBHOOK_POLL_RECOVERED") == []
    for _ in range(3):
        outage.failed(ConnectionError("down"), event)
        clock.advance(1)
    assert len(captured_log.named("WEBHOOK_POLL_FAILED")) == 1
    clock.advance(OUTAGE_LOG_EVERY)
    outage.failed(ConnectionError("down"), event)
    failed = captured_log.named("WEBHOOK_POLL_FAILED")
    assert len(failed) == 2 and failed[1]["since"] == 0
    outage.recovered()
    (recovered,) = captured_log.named("WEBHOOK_POLL_RECOVERED")
    assert recovered["seconds"] == 3 + OUTAGE_LOG_EVERY
