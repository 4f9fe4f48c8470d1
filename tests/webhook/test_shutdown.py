"""Issue point 6 in-process: stop with a delivery in flight, then a restart."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry
from twisted.internet import reactor
from twisted.internet.task import deferLater

from gorge.webhook.service import build_webhook_service
from gorge.webhook.store import WebhookStore
from tests.webhook.conftest import webhook_settings

pytestmark = pytest.mark.integration


async def wait_for(predicate, timeout: float = 15.0, step: float = 0.02) -> None:
    waited = 0.0
    while not predicate():
        assert waited < timeout, "condition not reached in time"
        await deferLater(reactor, step)
        waited += step


def started_service(mariadb, herald_db, **overrides):
    settings = webhook_settings(mariadb.settings(herald_db), poll_interval=0.05, **overrides)
    store = WebhookStore.mysql(settings.mysql, reactor)
    service = build_webhook_service(settings, reactor, store=store, registry=CollectorRegistry())
    service.startService()
    return service


async def test_stop_lets_the_delivery_finish_and_write_then_closes_the_pool(
    mariadb, herald_db, herald, receiver, captured_log
):
    hook = herald.insert_hook(uri=f"{receiver.base}/slow")
    first = herald.insert_request(hook=hook, properties={"retry": "forever"})
    receiver.delay = 1.0
    service = started_service(mariadb, herald_db)
    await wait_for(lambda: receiver.count() == 1)

    stopping = service.stopService()
    late = herald.insert_request(hook=hook, object_phid="PHID-TASK-late")  # after polling stopped
    await stopping.addTimeout(30, reactor)

    row = herald.request(first)
    assert (row["status"], row["lastRequestResult"]) == ("sent", "okay")
    assert json.loads(row["properties"])["errorCode"] == 200  # never a fake timeout (28)
    late_row = herald.request(late)
    assert late_row["status"] == "queued" and late_row["dateModified"] == late_row["dateCreated"]
    assert service.part("store").db.pool.running is False
    names = captured_log.names()
    assert names.index("WEBHOOK_DELIVERED") < names.index("WEBHOOK_STOPPED")
    assert "WEBHOOK_DELIVERY_ABANDONED" not in names

    # A restart sends no second POST for the finished row (and does deliver the late one).
    receiver.delay = 0.0
    again = started_service(mariadb, herald_db)
    try:
        await wait_for(lambda: herald.request(late)["status"] == "sent")
        await deferLater(reactor, 0.2)  # a few more ticks
    finally:
        await again.stopService().addTimeout(30, reactor)
    assert receiver.count() == 2
    assert b"PHID-TASK-late" not in receiver.requests[0].body
    assert b"PHID-TASK-late" in receiver.requests[1].body
    assert herald.request(first)["lastRequestEpoch"] == row["lastRequestEpoch"]


async def test_budget_exhausted_aborts_and_writes_nothing(
    mariadb, herald_db, herald, receiver, captured_log
):
    hook = herald.insert_hook(uri=f"{receiver.base}/stuck")
    request_id = herald.insert_request(hook=hook)
    receiver.delay = 60.0
    service = started_service(mariadb, herald_db, delivery_timeout=30)
    await wait_for(lambda: receiver.count() == 1)
    claimed = herald.request(request_id)
    service.part("stop-budget").seconds = 0.5  # the delivery cannot finish inside it
    await service.stopService().addTimeout(30, reactor)
    row = herald.request(request_id)
    assert row == claimed  # claimed, nothing written: the lease hands it out again
    assert captured_log.named("WEBHOOK_SHUTDOWN_ABANDONED")
    assert captured_log.named("WEBHOOK_DELIVERY_ABANDONED")
    assert not captured_log.named("WEBHOOK_DELIVERY_FAILED")


async def test_budget_exhausted_while_resolving_a_redirect_writes_nothing(
    mariadb, herald_db, herald, receiver, captured_log
):
    # An exchange cut by the shutdown writes nothing, even when the
    # cut lands on the redirect target's lookup after a 307 was received.
    from urllib.parse import quote

    from twisted.internet.defer import Deferred

    asked: list[str] = []

    async def hanging(host, port):
        asked.append(host)
        await Deferred()
        return []

    location = quote("http://hang.example/x", safe="")
    hook = herald.insert_hook(uri=f"{receiver.base}/redirect/307/{location}")
    request_id = herald.insert_request(hook=hook)
    settings = webhook_settings(
        mariadb.settings(herald_db), poll_interval=0.05, delivery_timeout=30
    )
    service = build_webhook_service(
        settings,
        reactor,
        store=WebhookStore.mysql(settings.mysql, reactor),
        registry=CollectorRegistry(),
        resolver=hanging,
    )
    service.startService()
    await wait_for(lambda: asked == ["hang.example"])
    claimed = herald.request(request_id)
    service.part("stop-budget").seconds = 0.5
    await service.stopService().addTimeout(30, reactor)
    assert herald.request(request_id) == claimed
    assert captured_log.named("WEBHOOK_DELIVERY_ABANDONED")
    assert not captured_log.named("WEBHOOK_DELIVERY_FAILED")
    assert not captured_log.named("WEBHOOK_DELIVERY_REJECTED")
