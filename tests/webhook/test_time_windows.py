"""Issue point 4: pickup, lease floor, retry interval and breaker on an injected clock.

The database clock is pinned to the test clock (``SET timestamp``), so every
window the SQL computes follows ``clock.advance``.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gorge.config import HttpSettings, MySQLSettings
from gorge.webhook.service import build_webhook_service
from gorge.webhook.settings import WebhookSettings
from gorge.webhook.store import WebhookStore
from tests.webhook.conftest import webhook_settings


@given(lease=st.integers(0, 10_000), timeout=st.integers(1, 10_000), backoff=st.integers(0, 10_000))
def test_lease_is_never_shorter_than_the_delivery_timeout(lease, timeout, backoff):
    s = WebhookSettings(
        http=HttpSettings("", ""),
        mysql=MySQLSettings(),
        claim_lease=lease,
        delivery_timeout=timeout,
        retry_backoff=backoff,
    )
    assert s.effective_lease == max(lease, timeout) >= timeout
    assert s.effective_retry == max(s.effective_lease, backoff)


@pytest.mark.parametrize(
    "lease,timeout,effective", [(30, 15, 30), (5, 15, 15), (0, 15, 15), (120, 15, 120)]
)
def test_lease_floor_table(lease, timeout, effective):
    s = WebhookSettings(
        http=HttpSettings("", ""),
        mysql=MySQLSettings(),
        claim_lease=lease,
        delivery_timeout=timeout,
    )
    assert s.effective_lease == effective


def test_startup_logs_effective_retry_and_warns_when_backoff_is_below_lease(captured_log):
    from twisted.internet import reactor

    settings = webhook_settings(MySQLSettings(database="x_herald"), retry_backoff=2, claim_lease=20)
    store = WebhookStore.mysql(settings.mysql, reactor)
    try:
        build_webhook_service(settings, reactor, store=store)
    finally:
        store.close()
    (config,) = captured_log.named("WEBHOOK_CONFIG")
    assert config["effective_retry"] == 20 and config["lease"] == 20
    warnings = [e["warning"] for e in captured_log.named("WEBHOOK_CONFIG_WARNING")]
    assert any("retried every 20s" in w for w in warnings)


def test_no_backoff_warning_with_defaults(captured_log):
    from twisted.internet import reactor

    settings = webhook_settings(MySQLSettings(database="x_herald"))
    store = WebhookStore.mysql(settings.mysql, reactor)
    try:
        build_webhook_service(settings, reactor, store=store)
    finally:
        store.close()
    assert captured_log.named("WEBHOOK_CONFIG_WARNING") == []
    assert captured_log.named("WEBHOOK_CONFIG")[0]["effective_retry"] == 60


@pytest.mark.integration
async def test_new_rows_go_out_on_the_next_tick(herald, receiver, make_harness):
    harness = make_harness()
    hook = herald.insert_hook(uri=f"{receiver.base}/a")
    await harness.run_tick()
    assert receiver.requests == []
    now = int(harness.clock.seconds())
    request_id = herald.insert_request(hook=hook, created=now)
    await harness.run_tick()
    assert receiver.count("/a") == 1
    assert herald.request(request_id)["status"] == "sent"


@pytest.mark.integration
async def test_abandoned_claim_waits_one_effective_lease(herald, receiver, make_harness):
    harness = make_harness(claim_lease=5, delivery_timeout=15)
    hook = herald.insert_hook(uri=f"{receiver.base}/a")
    herald.insert_request(hook=hook, created=int(harness.clock.seconds()))
    (candidate,) = await harness.store.claims.candidates(limit=5, lease=15, backoff=60)
    assert await harness.store.claims.claim(candidate)  # a claimer that then died
    claimed_at = int(harness.clock.seconds())
    harness.clock.advance(14)
    await harness.run_tick()
    assert receiver.requests == []
    harness.clock.advance(claimed_at + 1 + 15 - harness.clock.seconds())
    await harness.run_tick()
    assert receiver.count("/a") == 1


@pytest.mark.integration
@pytest.mark.parametrize("backoff,lease,effective", [(60, 30, 60), (2, 20, 20), (0, 30, 30)])
async def test_failed_forever_row_is_retried_after_max_lease_backoff(
    herald, receiver, make_harness, backoff, lease, effective
):
    harness = make_harness(retry_backoff=backoff, claim_lease=lease)
    hook = herald.insert_hook(uri=f"{receiver.base}/status/500")
    request_id = herald.insert_request(
        hook=hook,
        created=int(harness.clock.seconds()) - 100,
        properties={"retry": "forever", "transactionPHIDs": [], "triggerPHIDs": []},
    )
    await harness.run_tick()
    assert receiver.count() == 1
    row = herald.request(request_id)
    assert (row["status"], row["lastRequestResult"]) == ("queued", "fail")
    attempt_at = row["lastRequestEpoch"]
    harness.clock.advance(effective - 1)
    await harness.run_tick()
    assert receiver.count() == 1
    # The result write bumps dateModified one second past the claim made in the
    # same second, so the lease side may add that one second.
    harness.clock.advance(2)
    await harness.run_tick()
    assert receiver.count() == 2
    assert row["dateModified"] - attempt_at <= 1


@pytest.mark.integration
async def test_breaker_opens_at_threshold_closes_as_failures_slide_out(
    herald, receiver, make_harness, captured_log
):
    harness = make_harness()
    failing = f"{receiver.base}/status/500"
    hook = herald.insert_hook(uri=failing)
    start = int(harness.clock.seconds())
    ids = [
        herald.insert_request(
            hook=hook, created=start, properties={"retry": "forever", "transactionPHIDs": []}
        )
        for _ in range(25)
    ]

    await harness.run_tick()
    # Serialised per hook: exactly the threshold reached the receiver, then it opened.
    assert receiver.count() == 10
    assert len(captured_log.named("WEBHOOK_HOOK_IN_ERROR_BACKOFF")) == 1
    assert harness.metric("gorge_webhook_breaker_transitions_total", state="open") == 1
    assert harness.metric("gorge_webhook_open_breaker_rows") == 25

    herald.execute("UPDATE herald_webhook SET webhookURI = %s", (f"{receiver.base}/ok",))
    opened_at = len(captured_log)
    # Open for the whole window: ticks every 10 s up to the window's last second.
    for _ in range(30):
        harness.clock.advance(10)
        await harness.run_tick()
    assert harness.clock.seconds() == start + 300
    assert receiver.count() == 10
    # No per-row or per-tick lines while the breaker stays open: the once-a-minute
    # summary is all that is logged above debug.
    shown = [
        e["log_format"].split()[0]
        for e in captured_log[opened_at:]
        if e["log_level"].name != "debug"
    ]
    assert set(shown) <= {"WEBHOOK_SUMMARY"} and len(shown) <= 5

    harness.clock.advance(1)  # the ten failures slide out of the window
    await harness.run_tick()
    # An open hook is looked at again at least every 30 s.
    while not captured_log.named("WEBHOOK_HOOK_BACKOFF_CLEARED"):
        assert harness.clock.seconds() < start + 301 + 30
        harness.clock.advance(10)
        await harness.run_tick()
    await harness.run_tick()
    assert len(captured_log.named("WEBHOOK_HOOK_BACKOFF_CLEARED")) == 1
    assert len(captured_log.named("WEBHOOK_HOOK_IN_ERROR_BACKOFF")) == 1
    assert harness.metric("gorge_webhook_breaker_transitions_total", state="closed") == 1
    assert harness.metric("gorge_webhook_open_breaker_rows") == 0
    assert receiver.count("/ok") == 25
    assert all(herald.request(i)["status"] == "sent" for i in ids)


@pytest.mark.integration
async def test_a_short_breaker_window_resumes_delivery_as_soon_as_it_allows(
    herald, receiver, make_harness, captured_log
):
    # An 8 s window: the hook is looked at again once its failures have left
    # the window, not after the 30 s that bound long windows.
    harness = make_harness(breaker_window=8, breaker_threshold=3)
    hook = herald.insert_hook(uri=f"{receiver.base}/status/500")
    start = int(harness.clock.seconds())
    for _ in range(5):
        herald.insert_request(
            hook=hook, created=start, properties={"retry": "forever", "transactionPHIDs": []}
        )
    await harness.run_tick()
    assert receiver.count() == 3
    assert len(captured_log.named("WEBHOOK_HOOK_IN_ERROR_BACKOFF")) == 1
    herald.execute("UPDATE herald_webhook SET webhookURI = %s", (f"{receiver.base}/ok",))

    # A failure stays counted while it is at most 8 s old (whole seconds):
    # the earliest the database can find the hook closed is start + 9.
    while harness.clock.seconds() < start + 8:
        harness.clock.advance(1)
        await harness.run_tick()
        assert receiver.count("/ok") == 0
    harness.clock.advance(1)
    await harness.run_tick()
    await harness.run_tick()  # the rows, now candidates again, go out
    assert len(captured_log.named("WEBHOOK_HOOK_BACKOFF_CLEARED")) == 1
    # The two rows never tried; the three that failed wait for their retry.
    assert receiver.count("/ok") == 2


@pytest.mark.integration
async def test_counters_are_summarised_once_a_minute_and_only_when_non_zero(
    herald, receiver, make_harness, captured_log
):
    # Claims, skips and outcomes are counted, not narrated.
    harness = make_harness()
    good = herald.insert_hook(uri=f"{receiver.base}/ok")
    bad = herald.insert_hook(uri=f"{receiver.base}/status/500")
    now = int(harness.clock.seconds())
    for _ in range(2):
        herald.insert_request(hook=good, created=now)
    herald.insert_request(hook=bad, created=now)
    herald.insert_request(hook="PHID-HWBH-missing", created=now)
    await harness.run_tick()
    assert captured_log.named("WEBHOOK_SUMMARY") == []

    harness.clock.advance(60)
    await harness.run_tick()
    (summary,) = captured_log.named("WEBHOOK_SUMMARY")
    assert summary["log_level"].name == "info"
    assert {
        k: summary[k]
        for k in (
            "claims_won",
            "claims_lost",
            "breaker_skips",
            "delivered",
            "failed",
            "config_failures",
        )
    } == {
        "claims_won": 3,
        "claims_lost": 0,
        "breaker_skips": 0,
        "delivered": 2,
        "failed": 1,
        "config_failures": 1,
    }

    harness.clock.advance(60)  # a quiet minute: no line
    await harness.run_tick()
    assert len(captured_log.named("WEBHOOK_SUMMARY")) == 1


@pytest.mark.integration
async def test_every_window_follows_the_database_clock_not_the_service_clock(
    mariadb, herald_db, herald, receiver
):
    # Cutoffs, the breaker window and lastRequestEpoch all come from
    # the database clock; here it runs an hour ahead of the service host.
    from prometheus_client import CollectorRegistry
    from twisted.internet import reactor, task
    from twisted.internet.defer import Deferred

    from tests.webhook.conftest import T0

    service_clock, db_clock = task.Clock(), task.Clock()
    service_clock.advance(T0)
    db_clock.advance(T0 + 3600)
    settings = webhook_settings(mariadb.settings(herald_db))
    store = WebhookStore.mysql(settings.mysql, reactor, db_clock=db_clock)
    service = build_webhook_service(
        settings, reactor, store=store, clock=service_clock, registry=CollectorRegistry()
    )
    hook = herald.insert_hook(uri=f"{receiver.base}/status/500")
    db_now = T0 + 3600
    # Failed 61 s ago by the database clock: due. By the service clock it would
    # lie an hour in the future and never be due.
    due = herald.insert_request(
        hook=hook,
        created=db_now - 100,
        modified=db_now - 61,
        result="fail",
        epoch=db_now - 61,
        properties={"retry": "forever"},
    )
    # Failed 59 s ago by the database clock: still backing off.
    waiting = herald.insert_request(
        hook=hook,
        created=db_now - 100,
        modified=db_now - 59,
        result="fail",
        epoch=db_now - 59,
        properties={"retry": "forever"},
    )
    try:
        await Deferred.fromCoroutine(service.part("dispatcher").tick())
        assert await service.part("dispatcher").wait_idle(20, reactor)
    finally:
        await Deferred.fromCoroutine(service.part("transport").close())
        store.close()
    assert receiver.count() == 1
    row = herald.request(due)
    assert (row["status"], row["lastRequestResult"]) == ("queued", "fail")
    assert row["lastRequestEpoch"] == db_now and row["dateModified"] > db_now - 61
    assert herald.request(waiting)["lastRequestEpoch"] == db_now - 59
