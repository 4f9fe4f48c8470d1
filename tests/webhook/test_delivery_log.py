"""The delivery log and replay (docs/webhook.md, "Delivery log and replay"):
listing, one request, retry (one and by range), hooks with their breaker."""

from __future__ import annotations

import json

import pytest
import treq

from gorge.config import HttpSettings
from tests.webhook.conftest import T0
from tests.webhook.golden import load_case
from tests.webhook.test_golden_delivery import _assert_row_like, _load

pytestmark = pytest.mark.integration

TOKEN = "log-token"
HTTP = HttpSettings(listen_addr="127.0.0.1:0", endpoint="tcp:0:interface=127.0.0.1", token=TOKEN)
FOREVER = {"retry": "forever", "transactionPHIDs": [], "triggerPHIDs": []}
NEVER = {"retry": "never", "transactionPHIDs": [], "triggerPHIDs": []}


async def call(base: str, method: str, path: str, body=None, token: str = TOKEN):
    data = (
        None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    )
    response = await treq.request(
        method, base + path, data=data, persistent=False, headers={"X-Service-Token": token}
    )
    raw = await response.content()
    return response.code, (json.loads(raw) if raw else None)


def _ids(answer) -> list[int]:
    return [item["id"] for item in answer["data"]["requests"]]


async def test_listing_is_newest_first_filtered_and_paged(herald, receiver, make_harness, listen):
    harness = make_harness(http=HTTP)
    base = listen(harness.service.part("site"))
    one = herald.insert_hook(uri=f"{receiver.base}/ok")
    two = herald.insert_hook(uri=f"{receiver.base}/status/500")
    t0 = int(harness.clock.seconds())
    ids = [
        herald.insert_request(hook=(one, two)[n % 2], created=t0 + n, properties=NEVER)
        for n in range(6)
    ]
    await harness.run_tick()

    code, answer = await call(base, "GET", "/api/webhook/requests")
    assert code == 200 and _ids(answer) == ids[::-1]
    assert answer["data"]["nextCursor"] is None
    first = answer["data"]["requests"][0]
    assert first == {
        "id": ids[5],
        "phid": herald.request(ids[5])["phid"],
        "hookPHID": two,
        "objectPHID": "PHID-TASK-abcdefghijklmnopqrst",
        "status": "failed",
        "lastRequestResult": "fail",
        "lastRequestEpoch": t0,
        "errorType": "http",
        "errorCode": 500,
        "retry": "never",
        "dateCreated": t0 + 5,
        "dateModified": herald.request(ids[5])["dateModified"],
    }

    _, answer = await call(base, "GET", f"/api/webhook/requests?hook={one}&status=sent")
    assert _ids(answer) == [ids[4], ids[2], ids[0]]
    _, answer = await call(base, "GET", "/api/webhook/requests?result=fail")
    assert _ids(answer) == [ids[5], ids[3], ids[1]]
    _, answer = await call(base, "GET", f"/api/webhook/requests?since={t0 + 3}")
    assert _ids(answer) == [ids[5], ids[4], ids[3]]

    # Pages of two, following nextCursor.
    seen, cursor = [], None
    while True:
        path = "/api/webhook/requests?limit=2" + (f"&cursor={cursor}" if cursor else "")
        _, answer = await call(base, "GET", path)
        seen += _ids(answer)
        cursor = answer["data"]["nextCursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]


async def test_a_listing_call_reads_a_bounded_number_of_ids(herald, make_harness):
    harness = make_harness()
    hook = herald.insert_hook(uri="http://127.0.0.1:9/x")
    other = herald.insert_hook(uri="http://127.0.0.1:9/y")
    ids = [herald.insert_request(hook=other) for _ in range(20)]
    wanted = herald.insert_request(hook=hook)
    ids += [herald.insert_request(hook=other) for _ in range(20)]
    # Windows of 5 ids, 10 ids per call: the one matching row is found by paging.
    pages, cursor = [], None
    while True:
        page = await harness.store.history.list_requests(
            limit=10, cursor=cursor, hook=hook, window=5, budget=10
        )
        pages.append([row.id for row in page.rows])
        cursor = page.next_cursor
        if cursor is None:
            break
    assert [p for p in pages if p] == [[wanted]]
    assert len(pages) == 5  # 41 ids, 10 per call
    assert sum(pages, []) == [wanted]


@pytest.mark.parametrize(
    "query,message",
    [
        ("status=done", "status: must be one of queued, sent, failed, got 'done'"),
        ("result=ok", "result: must be one of none, okay, fail, got 'ok'"),
        ("limit=0", "limit: must be between 1 and 1000, got 0"),
        ("limit=1001", "limit: must be between 1 and 1000, got 1001"),
        ("limit=ten", "limit: not a non-negative integer: 'ten'"),
        ("since=-1", "since: not a non-negative integer: '-1'"),
        ("cursor=0", "cursor: must be between 1 and 4294967296, got 0"),
        ("hook=PHID-TASK-abc", "hook: not a hook PHID (PHID-HWBH-...): 'PHID-TASK-abc'"),
        (
            "hook_phid=x",
            "unknown parameter 'hook_phid' (accepted: cursor, hook, limit, result, since, status)",
        ),
        ("status=sent&status=failed", "status: give it once"),
    ],
)
async def test_a_bad_filter_is_400_saying_what_to_fix(herald, make_harness, listen, query, message):
    base = listen(make_harness(http=HTTP).service.part("site"))
    code, answer = await call(base, "GET", "/api/webhook/requests?" + query)
    assert (code, answer) == (400, {"error": {"code": "ERR_BAD_REQUEST", "message": message}})


@pytest.mark.parametrize(
    "method,path",
    [
        ("GET", "/api/webhook/requests/77"),
        ("GET", "/api/webhook/requests/abc"),
        ("GET", "/api/webhook/requests/PHID-HWBR-nothing"),
        ("GET", "/api/webhook/requests/0"),
        ("GET", "/api/webhook/requests/99999999999"),
        ("POST", "/api/webhook/requests/77/retry"),
        ("POST", "/api/webhook/requests/x/retry"),
    ],
)
async def test_a_bad_id_is_404(herald, make_harness, listen, method, path):
    herald.insert_request(hook="PHID-HWBH-x", status="sent")  # id 1 exists
    base = listen(make_harness(http=HTTP).service.part("site"))
    code, answer = await call(base, method, path)
    assert code == 404 and answer["error"]["code"] == "ERR_NOT_FOUND"


@pytest.mark.parametrize(
    "method,path,allowed",
    [
        ("POST", "/api/webhook/requests/1", "GET, HEAD"),
        ("GET", "/api/webhook/requests/1/retry", "POST"),
        # The range replay's path, not a request called "retry": POST only.
        ("GET", "/api/webhook/requests/retry", "POST"),
        ("HEAD", "/api/webhook/requests/retry", "POST"),
    ],
)
async def test_a_known_path_with_another_method_is_405(
    herald, make_harness, listen, method, path, allowed
):
    # The path names a route; the method is the wrong one for it.
    herald.insert_request(hook="PHID-HWBH-x", status="sent")
    base = listen(make_harness(http=HTTP).service.part("site"))
    response = await treq.request(
        method, base + path, persistent=False, headers={"X-Service-Token": TOKEN}
    )
    raw = await response.content()
    assert response.code == 405
    if method != "HEAD":
        assert json.loads(raw)["error"]["code"] == "ERR_METHOD_NOT_ALLOWED"
    assert response.headers.getRawHeaders("Allow") == [allowed]


async def test_everything_needs_the_token(herald, make_harness, listen):
    base = listen(make_harness(http=HTTP).service.part("site"))
    for method, path in [
        ("GET", "/api/webhook/requests"),
        ("GET", "/api/webhook/requests/1"),
        ("POST", "/api/webhook/requests/1/retry"),
        ("POST", "/api/webhook/requests/retry"),
        ("GET", "/api/webhook/hooks/state"),
    ]:
        code, answer = await call(base, method, path, token="wrong")
        assert (code, answer["error"]["code"]) == (401, "ERR_UNAUTHORIZED")


async def test_show_gives_the_request_in_detail_by_id_or_phid(
    herald, receiver, make_harness, listen
):
    harness = make_harness(http=HTTP)
    base = listen(harness.service.part("site"))
    hook = herald.insert_hook(uri=f"{receiver.base}/ok")
    request_id = herald.insert_request(
        hook=hook,
        properties={
            "retry": "forever",
            "transactionPHIDs": {"44": "PHID-XACT-a", "45": "PHID-XACT-b"},
            "triggerPHIDs": ["PHID-HRUL-c"],
            "test": True,
        },
    )
    phid = herald.request(request_id)["phid"]
    code, by_id = await call(base, "GET", f"/api/webhook/requests/{request_id}")
    code2, by_phid = await call(base, "GET", f"/api/webhook/requests/{phid}")
    assert code == code2 == 200 and by_id == by_phid
    data = by_id["data"]
    assert (
        data["status"],
        data["lastRequestResult"],
        data["errorType"],
        data["errorCode"],
        data["retry"],
    ) == ("queued", "none", None, None, "forever")
    assert data["transactionPHIDs"] == ["PHID-XACT-b", "PHID-XACT-a"]  # as the body lists them
    assert data["triggerPHIDs"] == ["PHID-HRUL-c"]
    assert (
        data["test"],
        data["silent"],
        data["secure"],
        data["propertiesValid"],
        data["heldUntil"],
    ) == (True, False, False, True, None)

    bad = herald.insert_request(hook=hook, properties="not json")
    _, answer = await call(base, "GET", f"/api/webhook/requests/{bad}")
    assert answer["data"]["propertiesValid"] is False and answer["data"]["test"] is None


async def test_a_replay_sends_the_same_bytes_and_signature_once_more(
    herald, receiver, make_harness, listen, captured_log
):
    case = load_case("firehose_200_task_created")
    harness = make_harness(http=HTTP)
    base = listen(harness.service.part("site"))
    harness.clock.advance(case.request_before["dateCreated"] - harness.clock.seconds())
    request_id = _load(herald, receiver, case)
    await harness.run_tick()
    first_row = herald.request(request_id)
    _assert_row_like(first_row, case.request_after)

    harness.clock.advance(100)
    code, answer = await call(base, "POST", f"/api/webhook/requests/{request_id}/retry")
    assert code == 200
    assert (
        answer["data"]["status"],
        answer["data"]["lastRequestResult"],
        answer["data"]["lastRequestEpoch"],
    ) == ("queued", "none", 0)
    replayed = herald.request(request_id)
    # The state Phorge inserts a row in; properties untouched until the next outcome.
    assert replayed["dateModified"] == replayed["dateCreated"]
    assert replayed["properties"] == first_row["properties"]
    (line,) = captured_log.named("WEBHOOK_REQUEST_REPLAYED")
    assert (
        line["previous_status"],
        line["previous_result"],
        line["error_type"],
        line["error_code"],
        line["attempted_at"],
    ) == ("sent", "okay", "http", 200, first_row["lastRequestEpoch"])
    assert harness.metric("gorge_webhook_replays_total", previous="sent") == 1
    _, stats = await call(base, "GET", "/api/webhook/stats")
    assert (stats["data"]["queuedCount"], stats["data"]["sentCount"]) == (1, 0)

    await harness.run_tick()
    for _ in range(3):
        harness.clock.advance(60)
        await harness.run_tick()
    first, again = receiver.requests
    assert again.body == first.body == case.body
    assert (
        again.headers["x-phabricator-webhook-signature"]
        == first.headers["x-phabricator-webhook-signature"]
    )
    _assert_row_like(herald.request(request_id), case.request_after)
    _, stats = await call(base, "GET", "/api/webhook/stats")
    assert (stats["data"]["queuedCount"], stats["data"]["sentCount"]) == (0, 1)


async def test_a_queued_request_is_not_replayed(herald, make_harness, listen):
    harness = make_harness(http=HTTP)
    base = listen(harness.service.part("site"))
    request_id = herald.insert_request(hook="PHID-HWBH-x", properties=FOREVER)
    before = herald.request(request_id)
    code, answer = await call(base, "POST", f"/api/webhook/requests/{request_id}/retry")
    assert (code, answer["error"]["code"]) == (409, "ERR_REQUEST_STATE")
    assert "already queued" in answer["error"]["message"]
    assert herald.request(request_id) == before
    code, answer = await call(
        base, "POST", f"/api/webhook/requests/{request_id}/retry", body={"x": 1}
    )
    assert (code, answer["error"]["code"]) == (400, "ERR_BAD_REQUEST")


async def test_a_configuration_failure_replayed_after_the_fix_is_delivered(
    herald, receiver, make_harness, listen
):
    harness = make_harness(http=HTTP)
    base = listen(harness.service.part("site"))
    hook = herald.insert_hook(uri=f"{receiver.base}/ok", status="disabled")
    request_id = herald.insert_request(hook=hook, properties=NEVER)
    await harness.run_tick()
    assert herald.request(request_id)["status"] == "failed"
    herald.execute("UPDATE herald_webhook SET status = 'enabled'")
    code, _ = await call(base, "POST", f"/api/webhook/requests/{request_id}/retry", body={})
    assert code == 200
    await harness.run_tick()
    assert receiver.count() == 1
    row = herald.request(request_id)
    assert (row["status"], row["lastRequestResult"]) == ("sent", "okay")
    assert json.loads(row["properties"])["errorCode"] == 200


async def test_replay_by_hook_and_time_range(herald, receiver, make_harness, listen):
    harness = make_harness(http=HTTP)
    base = listen(harness.service.part("site"))
    broken = herald.insert_hook(uri=f"{receiver.base}/status/500")
    other = herald.insert_hook(uri=f"{receiver.base}/status/500")
    t0 = int(harness.clock.seconds())
    ids = [herald.insert_request(hook=broken, created=t0 + n, properties=NEVER) for n in range(5)]
    other_id = herald.insert_request(hook=other, created=t0 + 1, properties=NEVER)
    await harness.run_tick()
    assert herald.status_counts() == {"failed": 6}

    # Created in [t0 + 1, t0 + 4), two per call; 2.0 is the integer 2, as
    # the document's integer type admits.
    body = {"hookPHID": broken, "since": t0 + 1.0, "until": t0 + 4, "limit": 2.0}
    code, answer = await call(base, "POST", "/api/webhook/requests/retry", body=body)
    assert code == 200
    assert [r["id"] for r in answer["data"]["retried"]] == ids[1:3]
    assert answer["data"]["nextAfterId"] == ids[2] and answer["data"]["skipped"] == []
    code, answer = await call(
        base, "POST", "/api/webhook/requests/retry", body={**body, "afterId": ids[2]}
    )
    assert [r["id"] for r in answer["data"]["retried"]] == [ids[3]]
    assert answer["data"]["nextAfterId"] is None
    assert {r["previousStatus"] for r in answer["data"]["retried"]} == {"failed"}
    assert [herald.request(i)["status"] for i in ids] == [
        "failed",
        "queued",
        "queued",
        "queued",
        "failed",
    ]
    assert herald.request(other_id)["status"] == "failed"
    # Sent requests are left alone unless asked for.
    code, answer = await call(
        base,
        "POST",
        "/api/webhook/requests/retry",
        body={"hookPHID": broken, "since": 0, "status": "sent"},
    )
    assert answer["data"]["retried"] == []


@pytest.mark.parametrize(
    "body,message",
    [
        ({"since": 0}, "hookPHID: not a hook PHID (PHID-HWBH-...): None"),
        ({"hookPHID": "PHID-HWBH-a"}, "since: required"),
        ({"hookPHID": "PHID-HWBH-a", "since": True}, "since: must be an integer, got True"),
        ({"hookPHID": "PHID-HWBH-a", "since": 1.5}, "since: must be an integer, got 1.5"),
        (
            {"hookPHID": "PHID-HWBH-a", "since": 10, "until": 10},
            "until: must be between 11 and 4294967296, got 10",
        ),
        (
            {"hookPHID": "PHID-HWBH-a", "since": 0, "status": "queued"},
            "status: must be one of failed, sent, any, got 'queued'",
        ),
        (
            {"hookPHID": "PHID-HWBH-a", "since": 0, "limit": 5000},
            "limit: must be between 1 and 1000, got 5000",
        ),
        (
            {"hookPHID": "PHID-HWBH-a", "since": 0, "hook": "x"},
            "unknown field 'hook' (accepted: hookPHID, since, until, status, afterId, limit)",
        ),
    ],
)
async def test_a_bad_range_is_400(herald, make_harness, listen, body, message):
    base = listen(make_harness(http=HTTP).service.part("site"))
    code, answer = await call(base, "POST", "/api/webhook/requests/retry", body=body)
    assert (code, answer) == (400, {"error": {"code": "ERR_BAD_REQUEST", "message": message}})


async def test_hooks_with_their_breaker_and_backlog(herald, receiver, make_harness, listen):
    harness = make_harness(http=HTTP, breaker_threshold=2)
    base = listen(harness.service.part("site"))
    good = herald.insert_hook(uri=f"{receiver.base}/ok", name="good")
    bad = herald.insert_hook(uri=f"{receiver.base}/status/500?secret=1", name="bad")
    off = herald.insert_hook(uri=f"{receiver.base}/ok", name="off", status="disabled")
    for age in (90, 5, 0, 0):
        herald.insert_request(hook=bad, properties=FOREVER, created=T0 - age)
    await harness.run_tick()
    code, answer = await call(base, "GET", "/api/webhook/hooks/state")
    assert code == 200
    assert answer["data"] == {
        "threshold": 2,
        "window": 300,
        "hooks": [
            {
                "phid": good,
                "name": "good",
                "status": "enabled",
                "breaker": "closed",
                "failures": 0,
                "queued": 0,
                "oldestQueuedSeconds": None,
            },
            {
                "phid": bad,
                "name": "bad",
                "status": "enabled",
                "breaker": "open",
                "failures": 2,
                "queued": 4,
                "oldestQueuedSeconds": 90,
            },
            {
                "phid": off,
                "name": "off",
                "status": "disabled",
                "breaker": "closed",
                "failures": 0,
                "queued": 0,
                "oldestQueuedSeconds": None,
            },
        ],
    }
    raw = json.dumps(answer)
    assert "secret" not in raw and receiver.base not in raw and "k" * 32 not in raw


def _object(body: bytes) -> str:
    return body.split(b'"phid": "', 1)[1].split(b'"', 1)[0].decode()


async def _tick(harnesses, seconds: int = 1) -> None:
    harnesses[0].clock.advance(seconds)
    for harness in harnesses:
        await harness.run_tick()


async def test_three_replicas_deliver_a_replay_exactly_once_more(
    herald, receiver, make_harness, listen
):
    one = make_harness(http=HTTP)
    two = make_harness(clock=one.clock)
    three = make_harness(clock=one.clock)
    replicas = [one, two, three]
    base = listen(one.service.part("site"))
    hooks = [herald.insert_hook(uri=f"{receiver.base}/h{i}") for i in range(3)]
    t0 = int(one.clock.seconds())
    for n in range(12):
        herald.insert_request(
            hook=hooks[n % 3], created=t0, properties=NEVER, object_phid=f"PHID-TASK-{n:020d}"
        )
    for _ in range(3):
        await _tick(replicas)
    assert herald.status_counts() == {"sent": 12} and receiver.count() == 12
    first = {_object(r.body): r for r in receiver.requests}

    for hook in hooks:
        code, _ = await call(
            base,
            "POST",
            "/api/webhook/requests/retry",
            body={"hookPHID": hook, "since": t0, "status": "sent"},
        )
        assert code == 200
    for _ in range(5):
        await _tick(replicas, 10)
    assert herald.status_counts() == {"sent": 12}
    assert receiver.count() == 24
    again = receiver.requests[12:]
    assert sorted(_object(r.body) for r in again) == sorted(first)
    for got in again:
        original = first[_object(got.body)]
        assert got.body == original.body
        assert (
            got.headers["x-phabricator-webhook-signature"]
            == original.headers["x-phabricator-webhook-signature"]
        )


async def test_other_replicas_find_a_replay_whose_replica_stopped(
    herald, receiver, make_harness, listen
):
    one = make_harness(http=HTTP)
    two = make_harness(clock=one.clock)
    three = make_harness(clock=one.clock)
    base = listen(one.service.part("site"))
    hook = herald.insert_hook(uri=f"{receiver.base}/h")
    request_id = herald.insert_request(hook=hook, properties=NEVER)
    for _ in range(2):
        await _tick([one, two, three])
    assert receiver.count() == 1

    code, _ = await call(base, "POST", f"/api/webhook/requests/{request_id}/retry")
    assert code == 200
    # The replica that answered stops before its next poll; the others see the
    # row at their background recount: (highest id - lowest id) / 2000 s, and a poll.
    ticks = 0
    while receiver.count() == 1:
        assert ticks < 3, "not found within the recount bound"
        await _tick([two, three])
        ticks += 1
    for _ in range(5):
        await _tick([two, three], 10)
    assert receiver.count() == 2
    assert receiver.requests[1].body == receiver.requests[0].body
    assert herald.request(request_id)["status"] == "sent"
