"""Retry-After on 429/503 and 410 Gone (docs/webhook.md, "Retry-After and 410 Gone").

The clock is a ``task.Clock`` and the database clock is pinned to it, so
every wait is exact to the second.
"""

from __future__ import annotations

from decimal import Decimal
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.web.http import datetimeToString

from gorge.webhook.queuedrows import Seen
from gorge.webhook.queueview import QueueView
from gorge.webhook.retryafter import (
    MICROSECOND,
    held_second,
    retry_after_seconds,
    wait_seconds,
)
from gorge.webhook.rows import QUEUED

FOREVER = {"retry": "forever", "transactionPHIDs": [], "triggerPHIDs": []}
NEVER = {"retry": "never", "transactionPHIDs": [], "triggerPHIDs": []}


# -- reading the header --------------------------------------------------------------


@given(st.integers(0, 10**12), st.integers(0, 2**31))
def test_delay_seconds_are_read_as_they_are(seconds, now):
    assert retry_after_seconds(str(seconds).encode(), now) == seconds
    assert retry_after_seconds(f" {seconds} ", now) == seconds


@given(moment=st.integers(0, 253402300799), now=st.integers(0, 253402300799))
def test_an_http_date_is_the_time_left_until_it_never_negative(moment, now):
    value = datetimeToString(moment)  # IMF-fixdate, as servers send it
    assert retry_after_seconds(value, now) == max(moment - now, 0)


@pytest.mark.parametrize("value", ["Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"])
def test_the_obsolete_date_formats_are_read_too(value):
    assert retry_after_seconds(value, 784111777 - 30) == 30


@given(st.text())
def test_anything_else_is_unreadable_never_an_error(text):
    value = retry_after_seconds(text, 0)
    assert value is None or value >= 0


@pytest.mark.parametrize("value", [None, "", "soon", "-5", "1.5", "12 s"])
def test_unreadable_values(value):
    assert retry_after_seconds(value, 1000) is None


# -- the hold in the queue view --------------------------------------------------------


@given(lease=st.integers(1, 600), wait=st.integers(0, 20_000), data=st.data())
def test_a_held_row_stays_leased_against_every_replica_until_the_time_asked_for(lease, wait, data):
    """Renewing as the view says, on ticks no further apart than a third of the
    lease, the row's lease never runs out before ``not_before`` and runs out
    at most one tick after it."""
    backoff = data.draw(st.integers(0, 600))
    step = data.draw(st.integers(1, max(1, lease // 3)))
    view = QueueView()
    view.configure(lease, backoff)
    epoch = 10_000
    seen = Seen(
        id=1, hook="H", status=QUEUED, result="fail", epoch=epoch, created=1, modified=epoch
    )
    view.saw(seen, view.stamp())
    not_before = epoch + wait
    held = view.hold(seen, not_before, view.stamp())
    natural = max(epoch + lease, epoch + backoff)
    assert held == (not_before > natural)
    modified, now = epoch, epoch
    while now < not_before + 2 * step + lease:
        for request_id, version in view.renewals(now):
            assert (request_id, version) == (1, modified)
            modified = max(modified + 1, now)  # the claim statement's new version
            view.renewed(1, modified, view.stamp())
        offered = view.take(now, 10) == [1]
        others_may_claim = modified <= now - lease and epoch <= now - backoff
        if now < not_before:
            assert not offered and not others_may_claim
        if now >= max(not_before, natural) + step:
            assert offered and others_may_claim
        now += step


def test_a_hold_no_later_than_the_fixed_retry_is_not_kept():
    view = QueueView()
    view.configure(30, 60)
    seen = Seen(id=1, hook="H", status=QUEUED, result="fail", epoch=100, created=1, modified=100)
    view.saw(seen, view.stamp())
    assert view.hold(seen, 160, view.stamp()) is False
    assert view.renewals(150) == [] and view.held_until(1) is None
    assert view.hold(seen, 161, view.stamp()) is True and view.held_until(1) == 161


def test_another_writer_ends_the_hold():
    view = QueueView()
    view.configure(30, 60)
    seen = Seen(id=1, hook="H", status=QUEUED, result="fail", epoch=100, created=1, modified=100)
    view.saw(seen, view.stamp())
    assert view.hold(seen, 1000, view.stamp())
    view.saw(seen._replace(modified=131), view.stamp())  # claimed by another replica
    assert view.held_until(1) is None and view.renewals(200) == []


# -- on a real database, on a clock --------------------------------------------------------


async def _tick_until(harnesses, receiver, until: int, step: int = 5) -> dict[int, int]:
    """Tick every harness every ``step`` seconds up to ``until``; the second of each new POST."""
    clock = harnesses[0].clock
    posts: dict[int, int] = {}
    while clock.seconds() < until:
        clock.advance(step)
        before = receiver.count()
        for harness in harnesses:
            await harness.run_tick()
        if receiver.count() > before:
            posts[int(clock.seconds())] = receiver.count() - before
    return posts


@pytest.mark.integration
@pytest.mark.parametrize("status", [429, 503])
async def test_retry_after_seconds_delays_the_next_attempt_on_every_replica(
    status, herald, receiver, make_harness, captured_log
):
    one = make_harness()
    two = make_harness(clock=one.clock)
    hook = herald.insert_hook(uri=f"{receiver.base}/status/{status}/after/600")
    start = int(one.clock.seconds())
    request_id = herald.insert_request(hook=hook, created=start, properties=FOREVER)
    await one.run_tick()
    assert receiver.count() == 1
    row = herald.request(request_id)
    assert (row["status"], row["lastRequestResult"], row["lastRequestEpoch"]) == (
        "queued",
        "fail",
        start,
    )
    (rejected,) = captured_log.named("WEBHOOK_DELIVERY_REJECTED")
    assert rejected["not_before"] == start + 600
    assert one.store.claims.held_until(request_id) == start + 600

    # Both replicas poll every 5 s; the fixed retry (60 s) would have gone at start + 60.
    posts = await _tick_until([one, two], receiver, start + 700)
    assert posts == {start + 600: 1}
    # The second answer holds the row again, on whichever replica sent it.
    assert sum(h.metric("gorge_webhook_retry_after_total", result="held") for h in (one, two)) == 2
    after = herald.request(request_id)
    # Nothing but Phorge's own columns changed, as an attempt writes them.
    assert after["properties"] == row["properties"]
    assert after["lastRequestEpoch"] == start + 600


@pytest.mark.integration
async def test_an_http_date_is_waited_for_and_the_wait_is_bounded(herald, receiver, make_harness):
    harness = make_harness(retry_after_max=120)
    start = int(harness.clock.seconds())
    dated = herald.insert_hook(
        uri=f"{receiver.base}/dated/status/503/after/"
        + quote(datetimeToString(start + 300).decode())
    )
    capped = herald.insert_hook(uri=f"{receiver.base}/capped/status/429/after/86400")
    herald.insert_request(hook=dated, created=start, properties=FOREVER)
    herald.insert_request(hook=capped, created=start, properties=FOREVER)
    await harness.run_tick()
    assert receiver.count() == 2

    posts: dict[str, list[int]] = {"dated": [], "capped": []}
    while harness.clock.seconds() < start + 310:
        harness.clock.advance(5)
        before = len(receiver.requests)
        await harness.run_tick()
        for got in receiver.requests[before:]:
            posts[got.path.split("/")[1]].append(int(harness.clock.seconds()))
    # Capped at 120 s, and every new answer holds again. The date is a fixed
    # moment: 300 s ahead at first (bounded to 120), then 180 s (bounded to 120),
    # then 60 s, no later than the fixed retry.
    assert posts == {
        "dated": [start + 120, start + 240, start + 300],
        "capped": [start + 120, start + 240],
    }
    # held: capped at 0, 120, 240; dated at 0, 120. Not later: dated at 240 and 300.
    assert harness.metric("gorge_webhook_retry_after_total", result="held") == 5
    assert harness.metric("gorge_webhook_retry_after_total", result="not_later") == 2


@pytest.mark.integration
async def test_a_shorter_or_unreadable_retry_after_leaves_the_fixed_retry(
    herald, receiver, make_harness
):
    harness = make_harness()
    start = int(harness.clock.seconds())
    short = herald.insert_hook(uri=f"{receiver.base}/short/status/429/after/5")
    garbled = herald.insert_hook(uri=f"{receiver.base}/garbled/status/503/after/soon")
    for hook in (short, garbled):
        herald.insert_request(hook=hook, created=start, properties=FOREVER)
    await harness.run_tick()
    posts = await _tick_until([harness], receiver, start + 60, step=1)
    assert posts == {start + 60: 2}
    # Both answers came twice (at start and at start + 60).
    assert harness.metric("gorge_webhook_retry_after_total", result="not_later") == 2
    assert harness.metric("gorge_webhook_retry_after_total", result="unreadable") == 2
    assert harness.metric("gorge_webhook_retry_after_total", result="held") == 0


@pytest.mark.integration
async def test_a_retry_never_request_fails_whatever_retry_after_says(
    herald, receiver, make_harness
):
    harness = make_harness()
    hook = herald.insert_hook(uri=f"{receiver.base}/status/429/after/600")
    request_id = herald.insert_request(
        hook=hook, created=int(harness.clock.seconds()), properties=NEVER
    )
    await harness.run_tick()
    assert herald.request(request_id)["status"] == "failed"
    assert harness.store.claims.held_until(request_id) is None


@pytest.mark.integration
async def test_a_hold_changed_by_another_writer_is_dropped(
    herald, receiver, make_harness, captured_log
):
    harness = make_harness()
    hook = herald.insert_hook(uri=f"{receiver.base}/status/429/after/3600")
    start = int(harness.clock.seconds())
    request_id = herald.insert_request(hook=hook, created=start, properties=FOREVER)
    await harness.run_tick()
    assert harness.store.claims.held_until(request_id) == start + 3600
    # Someone else writes the row (an operator's UPDATE, another tool) before a renewal.
    herald.execute(
        "UPDATE herald_webhookrequest SET dateModified = dateModified + 1 WHERE id = %s",
        (request_id,),
    )
    harness.clock.advance(25)  # the renewal is due two thirds into the lease
    await harness.run_tick()
    assert [e["request_id"] for e in captured_log.named("WEBHOOK_HOLD_LOST")] == [request_id]
    assert harness.metric("gorge_webhook_retry_after_total", result="lost") == 1
    assert harness.store.claims.held_until(request_id) is None


@pytest.mark.integration
async def test_a_replica_that_restarts_forgets_its_holds(herald, receiver, make_harness):
    first = make_harness()
    hook = herald.insert_hook(uri=f"{receiver.base}/status/429/after/3600")
    start = int(first.clock.seconds())
    herald.insert_request(hook=hook, created=start, properties=FOREVER)
    await first.run_tick()
    await _tick_until([first], receiver, start + 100)
    last_renewal = int(herald.query("SELECT dateModified FROM herald_webhookrequest")[0][0])
    assert last_renewal > start + 60  # renewed while it was running
    # A new process (the first one stopped): the row is due one lease after that renewal.
    second = make_harness(clock=first.clock)
    posts = await _tick_until([second], receiver, last_renewal + 40, step=1)
    assert posts == {last_renewal + 30: 1}


@pytest.mark.integration
async def test_410_is_logged_once_per_hook_counted_and_follows_the_retry_mode(
    herald, receiver, make_harness, captured_log
):
    harness = make_harness()
    gone = herald.insert_hook(uri=f"{receiver.base}/status/410")
    other = herald.insert_hook(uri=f"{receiver.base}/other/status/410")
    start = int(harness.clock.seconds())
    forever = herald.insert_request(hook=gone, created=start, properties=FOREVER)
    never = herald.insert_request(hook=gone, created=start, properties=NEVER)
    herald.insert_request(hook=other, created=start, properties=NEVER)
    await harness.run_tick()

    assert herald.request(forever)["status"] == "queued"
    assert herald.request(never)["status"] == "failed"
    warnings = captured_log.named("WEBHOOK_RECEIVER_GONE")
    assert sorted(e["hook"] for e in warnings) == sorted([gone, other])
    assert {e["log_level"].name for e in warnings} == {"warn"}
    assert harness.metric("gorge_webhook_gone_total") == 3

    harness.clock.advance(60)  # the retry=forever row is tried again: counted, not logged
    await harness.run_tick()
    assert harness.metric("gorge_webhook_gone_total") == 4
    assert len(captured_log.named("WEBHOOK_RECEIVER_GONE")) == 2

    # The receiver comes back, then goes again: logged again.
    herald.execute(
        "UPDATE herald_webhook SET webhookURI = %s WHERE phid = %s", (f"{receiver.base}/ok", gone)
    )
    harness.clock.advance(60)
    await harness.run_tick()
    assert herald.request(forever)["status"] == "sent"
    herald.execute(
        "UPDATE herald_webhook SET webhookURI = %s WHERE phid = %s",
        (f"{receiver.base}/status/410", gone),
    )
    herald.insert_request(hook=gone, created=int(harness.clock.seconds()), properties=NEVER)
    await harness.run_tick()
    assert len(captured_log.named("WEBHOOK_RECEIVER_GONE")) == 3


# -- to the millisecond ----------------------------------------------------------------


@given(
    value=st.one_of(
        st.integers(0, 10**7).map(str),
        st.integers(0, 253402300799).map(lambda moment: datetimeToString(moment).decode()),
    ),
    arrived=st.integers(0, 4 * 10**12).map(lambda ms: ms / 1000),  # host clock, to the ms
    skew=st.integers(-(10**9), 10**9).map(lambda us: Decimal(us) / 10**6),  # database - host
    cap=st.integers(0, 10**6),
)
def test_the_held_second_is_never_before_the_moment_asked_for_nor_a_second_past_it(
    value, arrived, skew, cap
):
    """For every Retry-After value and arrival time: the next attempt, made at
    the first poll whose database second reaches the held second, never comes
    before the moment asked for (capped), and the hold is never longer than
    that moment rounded up to the database's next whole second."""
    wait = wait_seconds(value, arrived, cap)
    asked = retry_after_seconds(value, arrived)
    assert wait is not None and asked is not None
    assert 0 <= wait <= cap and wait == min(asked, cap)
    arrival = Decimal(repr(arrived)) + skew  # the database's clock at the arrival
    held = held_second(arrival, wait)
    moment = arrival + Decimal(repr(wait))
    assert held >= moment - MICROSECOND  # never early (beyond the database's precision)
    assert held < moment + 1
    assert held - arrival <= cap + 1


async def _posts_until(harness, db_clock, receiver, until: float, step: float) -> list[float]:
    """Tick every ``step`` seconds (both clocks) up to ``until``; the clock time of each POST."""
    posts: list[float] = []
    while harness.clock.seconds() < until:
        harness.clock.advance(step)
        if db_clock is not harness.clock:
            db_clock.advance(step)
        before = receiver.count()
        await harness.run_tick()
        posts += [harness.clock.seconds()] * (receiver.count() - before)
    return posts


@pytest.mark.integration
async def test_retry_after_seconds_counts_from_the_arrival_not_from_its_whole_second(
    herald, receiver, make_harness
):
    harness = make_harness()
    hook = herald.insert_hook(uri=f"{receiver.base}/status/429/after/120")
    request_id = herald.insert_request(
        hook=hook, created=int(harness.clock.seconds()), properties=FOREVER
    )
    harness.clock.advance(0.9)  # the answer arrives 0.9 s into a second
    arrived = harness.clock.seconds()
    await harness.run_tick()
    assert receiver.count() == 1
    assert harness.store.claims.held_until(request_id) == int(arrived) + 121

    # Polls every second (the default interval) keep the hold's lease renewed, then
    # every 0.1 s around the moment.
    assert await _posts_until(harness, harness.clock, receiver, arrived + 115, step=1) == []
    posts = await _posts_until(harness, harness.clock, receiver, arrived + 122, step=0.1)
    assert posts, "the request was not attempted again"
    assert posts[0] >= arrived + 120  # never before the delay asked for
    assert posts[0] <= arrived + 121.1  # and at the next whole second of the database after it


@pytest.mark.integration
async def test_an_http_date_is_waited_for_on_a_database_clock_behind_this_host(
    herald, receiver, make_harness
):
    # The database's clock is 0.6 s behind this host's: the date is a moment on
    # the receiver's (and this host's) clock, and the wait is measured from the
    # answer's arrival, not from the database's whole second of the write.
    from twisted.internet import task

    db_clock = task.Clock()
    harness = make_harness(db_clock=db_clock)
    db_clock.advance(harness.clock.seconds() - 0.6)
    start = int(harness.clock.seconds())
    date = start + 300
    hook = herald.insert_hook(
        uri=f"{receiver.base}/status/503/after/" + quote(datetimeToString(date).decode())
    )
    herald.insert_request(hook=hook, created=start - 1, properties=FOREVER)
    harness.clock.advance(0.2)
    db_clock.advance(0.2)
    await harness.run_tick()
    assert receiver.count() == 1

    assert await _posts_until(harness, db_clock, receiver, date - 5, step=1) == []
    posts = await _posts_until(harness, db_clock, receiver, date + 2, step=0.1)
    assert posts, "the request was not attempted again"
    assert posts[0] >= date  # never before the date
    assert posts[0] <= date + 1.1
