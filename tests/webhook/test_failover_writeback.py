"""gorge-webhook on a master that turns read-only while a POST is open (SET
GLOBAL read_only=1; the daemon's account has no READ ONLY ADMIN, so its
writes fail with 1290 as on a demoted master): the result is written once
the master takes writes again, not dropped after a few tries, so the row is
not POSTed a second time; and no tick claims anything meanwhile."""

from __future__ import annotations

import pytest
import pytest_twisted
from prometheus_client import CollectorRegistry
from twisted.internet import reactor, task
from twisted.internet.defer import Deferred
from twisted.web.client import Agent

from gorge.webhook.service import build_webhook_service
from gorge.webhook.store import WebhookStore
from gorge.webhook.writeback import WRITE_ATTEMPTS, WRITE_RETRY_DELAY
from tests.db.readonly import plain_user, set_read_only
from tests.support.logcapture import first_event
from tests.webhook.conftest import T0, Harness, webhook_settings

pytestmark = pytest.mark.integration


def transactions(store: WebhookStore) -> int:
    return sum(t.count for t in store.db.transactions.values())


@pytest_twisted.ensureDeferred
async def test_result_written_after_read_only_window_and_nothing_claimed_meanwhile(
    mariadb, herald_db, herald, receiver, captured_log
):
    with plain_user(mariadb, herald_db) as account:
        clock = task.Clock()
        clock.advance(T0)
        settings = webhook_settings(account)
        store = WebhookStore.mysql(settings.mysql, reactor, db_clock=clock)
        registry = CollectorRegistry()
        service = build_webhook_service(
            settings, reactor, store=store, clock=clock, registry=registry
        )
        harness = Harness(service=service, clock=clock, registry=registry)
        try:
            # The POST is answered only when the test says so.
            receiver.hold_until_arrived["/held"] = "/release"
            hook = herald.insert_hook(uri=f"{receiver.base}/held")
            request_id = herald.insert_request(hook=hook)

            with first_event("WEBHOOK_DB_READ_ONLY") as read_only:
                # Claims the row and POSTs it.
                await Deferred.fromCoroutine(harness.dispatcher.tick())
                await receiver.when_arrived("/held").addTimeout(20, reactor)
                set_read_only(mariadb, True)
                # The POST answers 200 once /release arrives (after the gate is set).
                await Agent(reactor).request(b"POST", f"{receiver.base}/release".encode())
                await read_only.addTimeout(20, reactor)  # its result write was refused
            assert not store.db.writable
            assert herald.request(request_id)["status"] == "queued"

            # A tick while read-only reads and claims nothing, and logs no failure.
            late = herald.insert_request(hook=herald.insert_hook(uri=f"{receiver.base}/late"))
            clock.advance(1)
            ran = transactions(store)
            await Deferred.fromCoroutine(harness.dispatcher.tick())
            assert transactions(store) == ran  # not even a read of the queue
            assert receiver.count("/late") == 0

            # Past the few quick tries of other errors: the write still waits.
            clock.advance(3 * WRITE_RETRY_DELAY * WRITE_ATTEMPTS)
            assert herald.request(request_id)["status"] == "queued"
            set_read_only(mariadb, False)
            with first_event("WEBHOOK_DB_WRITABLE") as writable:
                # What the health check, or a /readyz, asks every few seconds.
                assert await store.db.ping() is None
            assert writable.called
            assert await harness.dispatcher.wait_idle(20, reactor)
            assert herald.request(request_id)["status"] == "sent"
            assert receiver.count("/held") == 1

            # Writable again: the next tick delivers the late row.
            clock.advance(1)
            await harness.run_tick()
            assert herald.request(late)["status"] == "sent"
            assert receiver.count("/late") == 1
        finally:
            await harness.close()
    names = captured_log.names()
    assert "WEBHOOK_RESULT_WRITE_FAILED" not in names
    assert "WEBHOOK_CLAIM_FAILED" not in names
    assert "WEBHOOK_POLL_FAILED" not in names
    assert names.count("WEBHOOK_DB_READ_ONLY") == 1
