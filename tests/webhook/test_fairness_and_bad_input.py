"""Fairness and the bad-input outcomes."""

from __future__ import annotations

import json

import pytest
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from gorge.webhook.settings import parse_blacklist
from tests.webhook.conftest import T0

pytestmark = pytest.mark.integration


async def test_per_hook_serialisation_under_the_global_cap(herald, receiver, make_harness):
    harness = make_harness(max_concurrent=3)
    receiver.delay = 0.05
    hooks = [herald.insert_hook(uri=f"{receiver.base}/h{i}") for i in range(5)]
    for n in range(20):
        herald.insert_request(hook=hooks[n % 5], object_phid=f"PHID-TASK-{n:020d}")

    await harness.run_tick()
    assert herald.status_counts() == {"sent": 20}
    assert receiver.peak_per_path == 1
    assert 1 < receiver.peak_total <= 3


async def test_open_breaker_backlog_does_not_delay_another_hooks_new_row(
    herald, receiver, make_harness
):
    harness = make_harness(max_concurrent=2)
    broken = herald.insert_hook(uri=f"{receiver.base}/status/500")
    now = int(harness.clock.seconds())
    for _ in range(10):  # ten recent failures: the hook is open
        herald.insert_request(
            hook=broken, status="failed", result="fail", epoch=now, created=now - 10, modified=now
        )
    for _ in range(100):  # a backlog deeper than one candidate batch
        herald.insert_request(
            hook=broken, created=now - 5, properties={"retry": "forever", "transactionPHIDs": []}
        )
    healthy = herald.insert_hook(uri=f"{receiver.base}/ok")
    await harness.run_tick()  # finds the breaker open
    new_row = herald.insert_request(hook=healthy, created=now)

    await harness.run_tick()  # the very next tick delivers the new row
    assert herald.request(new_row)["status"] == "sent"
    assert receiver.count("/status/500") == 0
    # And it stays that way, tick after tick, while the backlog waits.
    for _ in range(3):
        harness.clock.advance(1)
        newer = herald.insert_request(hook=healthy, created=int(harness.clock.seconds()))
        await harness.run_tick()
        assert herald.request(newer)["status"] == "sent"
    assert receiver.count("/status/500") == 0


def _props(row: dict) -> dict:
    return json.loads(row["properties"])


@pytest.mark.parametrize(
    "properties,kept",
    [
        ("{nope", None),
        (
            '{"retry":"forever","transactionPHIDs":"PHID-XACT-x","extra":1}',
            {"retry": "forever", "transactionPHIDs": "PHID-XACT-x", "extra": 1},
        ),
        ('{"silent":"yes"}', {"silent": "yes"}),
        ("[1,2]", None),
    ],
)
async def test_invalid_properties_fail_without_a_request(
    herald, receiver, make_harness, captured_log, properties, kept
):
    harness = make_harness()
    hook = herald.insert_hook(uri=f"{receiver.base}/ok")
    bad = herald.insert_request(hook=hook, properties=properties)
    good = herald.insert_request(hook=hook)
    await harness.run_tick()
    row = herald.request(bad)
    assert (row["status"], row["lastRequestResult"], row["lastRequestEpoch"]) == (
        "failed",
        "none",
        0,
    )
    expected = dict(kept or {}, errorType="hook", errorCode="invalid-properties")
    assert _props(row) == expected and list(_props(row)) == list(expected)
    assert herald.request(good)["status"] == "sent"  # the daemon keeps going
    assert receiver.count() == 1
    (line,) = captured_log.named("WEBHOOK_PROPERTIES_INVALID")
    assert line["request"] == row["phid"]


@pytest.mark.parametrize("case", ["missing", "disabled", "scheme", "no-host", "refused"])
async def test_configuration_failures(herald, receiver, make_harness, captured_log, case):
    # "refused": the default blacklist covers the loopback receiver.
    harness = make_harness(
        outbound_blacklist=parse_blacklist(None if case == "refused" else "none")
    )
    uri = {"scheme": "ftp://example.com/x", "no-host": "http:///x"}.get(case, f"{receiver.base}/x")
    hook = (
        "PHID-HWBH-missingmissingmissing"
        if case == "missing"
        else herald.insert_hook(uri=uri, status="disabled" if case == "disabled" else "enabled")
    )
    other_hook = herald.insert_hook(uri=f"{receiver.base}/ok")
    props = {
        "retry": "forever",
        "transactionPHIDs": {"2": "b"},
        "triggerPHIDs": [],
        "silent": False,
        "keep": [1, "x"],
    }
    bad = herald.insert_request(hook=hook, properties=props)
    bystander = herald.insert_request(hook=other_hook, status="failed", result="fail", epoch=T0 - 5)
    before = herald.request(bystander)
    await harness.run_tick()
    row = herald.request(bad)
    code = {"missing": "not-found", "disabled": "disabled"}.get(case, "uri")
    assert (row["status"], row["lastRequestResult"], row["lastRequestEpoch"]) == (
        "failed",
        "none",
        0,
    )
    assert row["properties"] == json.dumps(
        dict(props, errorType="hook", errorCode=code), separators=(",", ":")
    )
    assert receiver.count() == 0
    assert herald.request(bystander) == before  # nothing else touched
    assert harness.metric("gorge_webhook_breaker_transitions_total", state="open") == 0
    # The reference's event names, which operators grep for.
    event = {"missing": "WEBHOOK_HOOK_MISSING", "disabled": "WEBHOOK_HOOK_DISABLED"}.get(
        case, "WEBHOOK_URI_REFUSED"
    )
    (line,) = captured_log.named(event)
    assert line["request"] == row["phid"] and line["hook"] == hook


async def test_empty_key_is_a_failed_attempt_after_the_claim(
    herald, receiver, make_harness, captured_log
):
    harness = make_harness()
    hook = herald.insert_hook(uri=f"{receiver.base}/x", key="")
    bad = herald.insert_request(hook=hook, properties={"retry": "never"})
    await harness.run_tick()
    row = herald.request(bad)
    assert (row["status"], row["lastRequestResult"]) == ("failed", "fail")
    assert row["lastRequestEpoch"] == int(harness.clock.seconds())
    assert _props(row) == {
        "retry": "never",
        "errorType": "hook",
        "errorCode": "request-build-error",
    }
    assert receiver.count() == 0
    (line,) = captured_log.named("WEBHOOK_REQUEST_BUILD_FAILED")
    assert line["request"] == row["phid"] and line["hook"] == hook


async def test_unresolvable_host_is_a_failed_attempt_with_code_6(herald, receiver, make_harness):
    async def nxdomain(host, port):
        raise OSError("Name or service not known")

    harness = make_harness(resolver=nxdomain)
    hook = herald.insert_hook(uri="http://hook.invalid/x")
    forever = herald.insert_request(hook=hook, properties={"retry": "forever"})
    never = herald.insert_request(hook=hook, properties={"retry": "never"})
    await harness.run_tick()
    assert herald.request(forever)["status"] == "queued"
    assert herald.request(never)["status"] == "failed"
    for request_id in (forever, never):
        row = herald.request(request_id)
        assert row["lastRequestResult"] == "fail"
        assert _props(row)["errorType"] == "http" and _props(row)["errorCode"] == 6


async def test_receiver_timeout_is_code_28(herald, receiver, make_harness):
    harness = make_harness(delivery_timeout=1, claim_lease=30)
    receiver.delay = 3
    hook = herald.insert_hook(uri=f"{receiver.base}/slow")
    request_id = herald.insert_request(hook=hook, properties={"retry": "never"})
    await harness.run_tick()
    row = herald.request(request_id)
    assert (row["status"], row["lastRequestResult"]) == ("failed", "fail")
    assert _props(row)["errorType"] == "timeout" and _props(row)["errorCode"] == 28


async def test_deadline_while_resolving_a_redirect_target_is_code_28(
    herald, receiver, make_harness
):
    # The deadline covers every followed redirect, and a
    # status already received (the 307) does not turn a timeout into it.
    from urllib.parse import quote

    async def hanging(host, port):
        await Deferred()  # never answers; only the delivery deadline ends it
        return []

    harness = make_harness(delivery_timeout=1, resolver=hanging)
    location = quote("http://hang.example/x", safe="")
    hook = herald.insert_hook(uri=f"{receiver.base}/redirect/307/{location}")
    request_id = herald.insert_request(hook=hook, properties={"retry": "never"})
    await harness.run_tick()
    row = herald.request(request_id)
    assert (row["status"], row["lastRequestResult"]) == ("failed", "fail")
    assert _props(row)["errorType"] == "timeout" and _props(row)["errorCode"] == 28


@pytest.mark.parametrize(
    "answer,code",
    [
        (b"HTTP/1.1 200 OK\r\nContent-Le", 0),  # closed inside the headers
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nok", 18),  # body cut short
        (b"", 52),  # closed before any byte
    ],
)
async def test_a_receiver_closing_early_records_curls_code(herald, make_harness, answer, code):
    from twisted.internet.protocol import Factory, Protocol

    class CloseEarly(Protocol):
        def dataReceived(self, data):
            if b"\r\n\r\n" in data:
                self.transport.write(answer)
                self.transport.loseConnection()

    port = reactor.listenTCP(0, Factory.forProtocol(CloseEarly), interface="127.0.0.1")
    try:
        harness = make_harness()
        hook = herald.insert_hook(uri=f"http://127.0.0.1:{port.getHost().port}/early")
        request_id = herald.insert_request(hook=hook, properties={"retry": "never"})
        await harness.run_tick()
    finally:
        await port.stopListening()
    row = herald.request(request_id)
    assert (row["status"], row["lastRequestResult"]) == ("failed", "fail")
    assert _props(row)["errorType"] == "http" and _props(row)["errorCode"] == code


async def test_a_redirect_to_a_host_that_does_not_resolve_is_code_6(herald, receiver, make_harness):
    # Only a refused target ends at the 3xx; a name with no
    # address is not a refusal but a failed attempt, recorded as cURL's 6.
    from urllib.parse import quote

    async def nxdomain(host, port):
        raise OSError("Name or service not known")

    harness = make_harness(resolver=nxdomain)
    location = quote("http://gone.invalid/x", safe="")
    hook = herald.insert_hook(uri=f"{receiver.base}/redirect/308/{location}")
    request_id = herald.insert_request(hook=hook, properties={"retry": "never"})
    await harness.run_tick()
    row = herald.request(request_id)
    assert (row["status"], row["lastRequestResult"]) == ("failed", "fail")
    assert _props(row)["errorType"] == "http" and _props(row)["errorCode"] == 6


async def test_a_2xx_whose_body_outlasts_the_deadline_is_a_timeout(herald, make_harness):
    # A status already received does not make a timed-out exchange a success.
    from twisted.internet.protocol import Factory, Protocol

    held = []

    class StallsInTheBody(Protocol):
        def dataReceived(self, data):
            if b"\r\n\r\n" in data and self not in held:
                held.append(self)
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nok")

    port = reactor.listenTCP(0, Factory.forProtocol(StallsInTheBody), interface="127.0.0.1")
    try:
        harness = make_harness(delivery_timeout=1)
        hook = herald.insert_hook(uri=f"http://127.0.0.1:{port.getHost().port}/stall")
        request_id = herald.insert_request(hook=hook, properties={"retry": "never"})
        await harness.run_tick()
    finally:
        for protocol in held:
            protocol.transport.abortConnection()
        await port.stopListening()
    row = herald.request(request_id)
    assert (row["status"], row["lastRequestResult"]) == ("failed", "fail")
    assert _props(row)["errorType"] == "timeout" and _props(row)["errorCode"] == 28


async def test_connection_refused_is_code_7(herald, receiver, make_harness):
    harness = make_harness()
    port = receiver.port.getHost().port
    await receiver.port.stopListening()
    hook = herald.insert_hook(uri=f"http://127.0.0.1:{port}/gone")
    request_id = herald.insert_request(hook=hook, properties={"retry": "never"})
    await harness.run_tick()
    row = herald.request(request_id)
    assert _props(row)["errorType"] == "http" and _props(row)["errorCode"] == 7
    receiver.port = reactor.listenTCP(0, receiver.port.factory, interface="127.0.0.1")


async def test_database_outage_is_logged_once_and_recovery_once(
    mariadb, make_harness, captured_log
):
    from prometheus_client import CollectorRegistry
    from twisted.internet import task

    from gorge.webhook.service import build_webhook_service
    from gorge.webhook.store import WebhookStore
    from tests.webhook.conftest import webhook_settings

    clock = task.Clock()
    settings = webhook_settings(mariadb.settings("nothere_herald"))
    store = WebhookStore.mysql(settings.mysql, reactor)
    service = build_webhook_service(
        settings, reactor, store=store, clock=clock, registry=CollectorRegistry()
    )
    try:
        for _ in range(5):
            await Deferred.fromCoroutine(service.part("dispatcher").tick())
            clock.advance(1)
        assert len(captured_log.named("WEBHOOK_POLL_FAILED")) == 1
        assert captured_log.named("WEBHOOK_POLL_FAILED")[0]["reason"] == "unknown database"
        mariadb.create_database("herald", "nothere_herald")
        await Deferred.fromCoroutine(service.part("dispatcher").tick())
        assert len(captured_log.named("WEBHOOK_POLL_RECOVERED")) == 1
    finally:
        store.close()


async def test_a_failing_hook_lookup_is_logged_once_not_every_tick(
    herald, make_harness, captured_log
):
    # The candidate query works but herald_webhook cannot be
    # read (a missing grant or table): still one error line, not two per tick.
    harness = make_harness()
    request_id = herald.insert_request(hook="PHID-HWBH-00000000000000000001")
    herald.execute("DROP TABLE herald_webhook")
    for _ in range(5):
        await harness.run_tick()
        harness.clock.advance(1)
    assert len(captured_log.named("WEBHOOK_HOOK_LOOKUP_FAILED")) == 1
    assert captured_log.named("WEBHOOK_POLL_RECOVERED") == []
    assert herald.request(request_id)["status"] == "queued"


@pytest.mark.parametrize(
    "code,location,final,landed",
    [
        (307, "/landed", 200, True),
        (308, "/landed", 200, True),
        (302, "/landed", 302, False),
        (303, "/landed", 303, False),
        (307, "http://10.1.2.3/elsewhere", 307, False),  # refused by the policy: not followed
    ],
)
async def test_redirects(herald, receiver, make_harness, code, location, final, landed):
    from urllib.parse import quote

    harness = make_harness(outbound_blacklist=parse_blacklist("10.0.0.0/8"))
    hook = herald.insert_hook(uri=f"{receiver.base}/redirect/{code}/{quote(location, safe='')}")
    request_id = herald.insert_request(hook=hook, properties={"retry": "never"})
    await harness.run_tick()
    row = herald.request(request_id)
    assert json.loads(row["properties"])["errorCode"] == final
    assert row["status"] == ("sent" if final == 200 else "failed")
    assert (receiver.count("/landed") == 1) is landed
    if landed:
        first, second = receiver.requests
        assert first.body == second.body
        assert (
            first.headers["x-phabricator-webhook-signature"]
            == second.headers["x-phabricator-webhook-signature"]
        )


async def test_outcome_lines_carry_request_hook_status_and_duration(
    herald, receiver, make_harness, captured_log
):
    # Log fields are request PHID, hook PHID, status code, duration, error class.
    harness = make_harness()
    port = reactor.listenTCP(0, receiver.port.factory, interface="127.0.0.1")
    closed = port.getHost().port
    await port.stopListening()
    hooks = {
        "WEBHOOK_DELIVERED": herald.insert_hook(uri=f"{receiver.base}/ok"),
        "WEBHOOK_DELIVERY_REJECTED": herald.insert_hook(uri=f"{receiver.base}/status/500"),
        "WEBHOOK_DELIVERY_FAILED": herald.insert_hook(uri=f"http://127.0.0.1:{closed}/x"),
    }
    for hook in hooks.values():
        herald.insert_request(hook=hook)
    await harness.run_tick()
    for name, hook in hooks.items():
        (event,) = captured_log.named(name)
        assert event["hook"] == hook and event["request"].startswith("PHID-HWBR-")
        assert isinstance(event["duration"], float) and event["duration"] >= 0
    assert captured_log.named("WEBHOOK_DELIVERED")[0]["status"] == 200
    assert captured_log.named("WEBHOOK_DELIVERY_REJECTED")[0]["status"] == 500
    failed = captured_log.named("WEBHOOK_DELIVERY_FAILED")[0]
    assert failed["code"] == 7 and failed["error"].startswith("ConnectionRefusedError")


async def test_a_tick_with_every_slot_busy_still_replaces_the_lines_and_hooks(
    herald, receiver, make_harness
):
    # Candidates not started when the next tick arrives are
    # dropped and re-read, with their hook — so a hook disabled
    # while its backlog is being worked stops receiving at the next tick.
    harness = make_harness(max_concurrent=1)
    receiver.delay = 1.0  # room for the test to act while the POST is open
    hook = herald.insert_hook(uri=f"{receiver.base}/backlog")
    ids = [herald.insert_request(hook=hook, object_phid=f"PHID-TASK-{n:020d}") for n in range(5)]
    first = Deferred.fromCoroutine(harness.dispatcher.tick())
    await first
    waited = 0
    while receiver.count() == 0:
        assert waited < 200, "first delivery never started"
        await deferLater(reactor, 0.02)
        waited += 1
    herald.execute("UPDATE herald_webhook SET status = 'disabled'")
    harness.clock.advance(1)
    await harness.run_tick()  # the only slot is busy while this tick runs
    assert receiver.count() == 1
    assert herald.request(ids[0])["status"] == "sent"
    for request_id in ids[1:]:
        row = herald.request(request_id)
        assert (row["status"], _props(row)["errorCode"]) == ("failed", "disabled")


async def test_a_row_deleted_during_its_delivery_is_logged_at_info_and_left_alone(
    herald, receiver, make_harness, captured_log
):
    # The garbage collector may delete a row we are delivering;
    # the result write then changes nothing: one info line, no retry, no error.
    harness = make_harness()
    receiver.delay = 1.0  # room for the test to act while the POST is open
    hook = herald.insert_hook(uri=f"{receiver.base}/gc")
    request_id = herald.insert_request(hook=hook)
    await Deferred.fromCoroutine(harness.dispatcher.tick())
    waited = 0
    while receiver.count() == 0:
        assert waited < 200, "delivery never started"
        await deferLater(reactor, 0.02)
        waited += 1
    herald.execute("DELETE FROM herald_webhookrequest WHERE id = %s", (request_id,))
    assert await harness.dispatcher.wait_idle(20, reactor)
    (line,) = captured_log.named("WEBHOOK_RESULT_ROW_GONE")
    assert line["log_level"].name == "info"
    assert not captured_log.named("WEBHOOK_RESULT_WRITE_FAILED")
    assert herald.status_counts() == {}
    assert receiver.count() == 1


async def test_no_cookie_is_kept_or_sent(herald, make_harness):
    # Like Phorge's cURL, deliveries neither store nor replay cookies.
    from twisted.web import resource, server

    seen: list[list[bytes] | None] = []

    class SetsCookies(resource.Resource):
        isLeaf = True

        def render_POST(self, request):
            seen.append(request.requestHeaders.getRawHeaders(b"cookie"))
            request.addCookie(b"session", b"abc", path=b"/")
            return b"ok"

    site = server.Site(SetsCookies())
    site.log = lambda request: None
    port = reactor.listenTCP(0, site, interface="127.0.0.1")
    try:
        harness = make_harness()
        hook = herald.insert_hook(uri=f"http://127.0.0.1:{port.getHost().port}/c")
        for n in range(2):
            herald.insert_request(hook=hook, object_phid=f"PHID-TASK-{n:020d}")
        await harness.run_tick()
    finally:
        await port.stopListening()
    assert seen == [None, None]
    assert herald.status_counts() == {"sent": 2}


async def test_a_database_failure_mid_line_logs_once_per_hook_not_once_per_row(
    herald, receiver, make_harness, captured_log
):
    # When the database goes away under a hook's line, the rest
    # of the line would only fail the same way: one error line, not one per row.
    harness = make_harness(max_concurrent=1)
    receiver.delay = 1.0  # room for the test to act while the POST is open
    hook = herald.insert_hook(uri=f"{receiver.base}/status/500")
    for n in range(6):
        herald.insert_request(
            hook=hook, object_phid=f"PHID-TASK-{n:020d}", properties={"retry": "forever"}
        )
    await Deferred.fromCoroutine(harness.dispatcher.tick())
    waited = 0
    while receiver.count() == 0:
        assert waited < 200, "first delivery never started"
        await deferLater(reactor, 0.02)
        waited += 1
    herald.execute("RENAME TABLE herald_webhookrequest TO herald_webhookrequest_away")
    try:
        idle = harness.dispatcher.wait_idle(20, reactor)
        while not idle.called:  # the result write's retry pauses run on the test clock
            harness.clock.advance(0.5)
            await deferLater(reactor, 0.02)
        assert idle.result is True
    finally:
        herald.execute("RENAME TABLE herald_webhookrequest_away TO herald_webhookrequest")
    assert receiver.count() == 1
    failed = captured_log.named("WEBHOOK_BACKOFF_CHECK_FAILED") + captured_log.named(
        "WEBHOOK_CLAIM_FAILED"
    )
    assert len(failed) == 1
    assert herald.status_counts() == {"queued": 6}
