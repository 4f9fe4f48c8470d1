"""Issue points 7 and 8: diagnostics API, probes, metrics, and no URI or key anywhere."""

from __future__ import annotations

import json

import pytest
import treq
from twisted.internet import reactor

from gorge.config import HttpSettings
from tests.webhook.conftest import T0

pytestmark = pytest.mark.integration

TOKEN = "contract-token"
HTTP = HttpSettings(listen_addr="127.0.0.1:0", endpoint="tcp:0:interface=127.0.0.1", token=TOKEN)
SECRET_KEY = "s3cretkeys3cretkeys3cretkeys3cre"


async def get(url: str, method: str = "GET", headers: dict | None = None):
    response = await treq.request(method, url, headers=headers, persistent=False)
    return response.code, await response.content(), response.headers


def seed(herald, receiver_base: str = "http://127.0.0.1:9/x") -> None:
    enabled = herald.insert_hook(uri=receiver_base + "?token=abc", key=SECRET_KEY)
    disabled = herald.insert_hook(uri=receiver_base, status="disabled", key=SECRET_KEY)
    for status, n in (("queued", 3), ("sent", 2), ("failed", 1)):
        for _ in range(n):
            herald.insert_request(hook=enabled if status != "failed" else disabled, status=status)


async def test_stats_and_hooks_with_token(herald, make_harness, listen):
    seed(herald)
    base = listen(make_harness(http=HTTP).service.part("site"))
    auth = {"X-Service-Token": TOKEN}

    code, body, headers = await get(base + "/api/webhook/stats", headers=auth)
    assert code == 200
    assert body == (
        b'{"data":{"queuedCount":3,"sentCount":2,"failedCount":1,"activeWebhooks":1,'
        b'"site":{"queuedCount":3,"sentCount":2,"failedCount":1,"activeWebhooks":1,'
        b'"asOf":%d,"ageSeconds":0.0}}}' % T0
    )
    assert headers.getRawHeaders("content-type") == ["application/json"]

    code, body, _ = await get(base + "/api/webhook/hooks", headers=auth)
    assert (code, body) == (200, b'{"data":{"total":2}}')
    for needle in (b"hmac", b"Key", b"URI", b"http", SECRET_KEY.encode()):
        assert needle not in body

    code, body, _ = await get(base + f"/api/webhook/hooks?token={TOKEN}")
    assert (code, body) == (200, b'{"data":{"total":2}}')


@pytest.mark.parametrize(
    "path,headers,status,error",
    [
        ("/api/webhook/stats", {}, 401, "ERR_UNAUTHORIZED"),
        ("/api/webhook/nope", {}, 401, "ERR_UNAUTHORIZED"),
        (
            f"/api/webhook/stats?token={TOKEN}",
            {"X-Service-Token": "wrong"},
            401,
            "ERR_UNAUTHORIZED",
        ),
        ("/api/webhook/nope", {"X-Service-Token": TOKEN}, 404, "ERR_NOT_FOUND"),
        ("/api/webhook/stats/", {"X-Service-Token": TOKEN}, 404, "ERR_NOT_FOUND"),
    ],
)
async def test_auth_and_routing(herald, make_harness, listen, path, headers, status, error):
    base = listen(make_harness(http=HTTP).service.part("site"))
    code, body, _ = await get(base + path, headers=headers)
    assert code == status
    assert json.loads(body)["error"]["code"] == error
    assert "data" not in json.loads(body)


async def test_wrong_method_under_the_prefix_is_405(herald, make_harness, listen):
    base = listen(make_harness(http=HTTP).service.part("site"))
    code, body, _ = await get(
        base + "/api/webhook/stats", method="POST", headers={"X-Service-Token": TOKEN}
    )
    assert code == 405 and json.loads(body)["error"]["code"] == "ERR_METHOD_NOT_ALLOWED"


async def test_database_failure_is_an_opaque_500(mariadb, make_harness, listen, captured_log):
    from gorge.webhook.service import build_webhook_service
    from gorge.webhook.store import WebhookStore
    from tests.webhook.conftest import webhook_settings

    settings = webhook_settings(mariadb.settings("absent_herald"), http=HTTP)
    store = WebhookStore.mysql(settings.mysql, reactor)
    try:
        service = build_webhook_service(settings, reactor, store=store)
        base = listen(service.part("site"))
        for path in ("/api/webhook/stats", "/api/webhook/hooks"):
            code, body, _ = await get(base + path, headers={"X-Service-Token": TOKEN})
            assert code == 500
            assert json.loads(body) == {
                "error": {"code": "ERR_INTERNAL", "message": "internal server error"}
            }
            for needle in (b"herald", b"127.0.0.1", str(mariadb.port).encode(), b"Unknown"):
                assert needle not in body
        assert captured_log.named("PANIC_RECOVERED") or captured_log.named("REQUEST_FAILED")
    finally:
        store.close()


async def test_readyz_follows_the_database_without_restart(mariadb, listen):
    from gorge.webhook.service import build_webhook_service
    from gorge.webhook.store import WebhookStore
    from tests.webhook.conftest import webhook_settings

    name = "later_herald"
    settings = webhook_settings(mariadb.settings(name), http=HTTP)
    store = WebhookStore.mysql(settings.mysql, reactor)
    try:
        base = listen(build_webhook_service(settings, reactor, store=store).part("site"))
        code, body, _ = await get(base + "/readyz")
        assert code == 503
        answer = json.loads(body)
        assert answer["status"] == "unavailable"
        assert answer["reason"].startswith("ping database: ")
        assert "unknown database" in answer["reason"]
        code, body, _ = await get(base + "/healthz")
        assert (code, json.loads(body)) == (200, {"status": "ok"})

        mariadb.create_database("herald", name)
        code, body, _ = await get(base + "/readyz")
        assert (code, json.loads(body)) == (200, {"status": "ok"})
    finally:
        store.close()


async def test_metrics_and_no_uri_or_key_in_logs(
    herald, receiver, make_harness, listen, captured_log
):
    harness = make_harness(http=HTTP)
    uri = f"{receiver.base}/hook?token=hunter2&x=1"
    hook = herald.insert_hook(uri=uri, key=SECRET_KEY)
    failing = herald.insert_hook(uri=f"{receiver.base}/status/500?secret=abc", key=SECRET_KEY)
    herald.insert_request(hook=hook)
    herald.insert_request(hook=failing, properties={"retry": "never"})
    herald.insert_request(hook=herald.insert_hook(uri="ftp://user:pw@host/x", key=SECRET_KEY))
    await harness.run_tick()
    assert receiver.count() == 2

    base = listen(harness.service.part("site"))
    code, body, _ = await get(base + "/metrics")
    text = body.decode()
    assert code == 200
    assert 'gorge_webhook_deliveries_total{outcome="sent"} 1.0' in text
    assert 'gorge_webhook_deliveries_total{outcome="failed"} 1.0' in text
    assert 'gorge_webhook_deliveries_total{outcome="config_failure"} 1.0' in text
    assert 'gorge_webhook_claims_total{result="lost"} 0.0' in text
    assert 'gorge_webhook_breaker_transitions_total{state="open"} 0.0' in text
    assert "gorge_webhook_open_breaker_rows 0.0" in text
    assert "gorge_webhook_delivery_seconds_count 2.0" in text
    assert 'gorge_webhook_write_seconds_count{next_waits="no"} 2.0' in text

    logged = captured_log.rendered()
    assert "WEBHOOK_DELIVERED" in logged and "WEBHOOK_URI_REFUSED" in logged
    for secret in (SECRET_KEY, "hunter2", "secret=abc", "/hook?", "user:pw", "/status/500"):
        assert secret not in logged


async def test_head_has_no_body_and_a_wrong_probe_method_is_405(herald, make_harness, listen):
    # HEAD gets the status without a body; only a probe path answers 405.
    base = listen(make_harness(http=HTTP).service.part("site"))
    code, body, _ = await get(
        base + "/api/webhook/stats", method="HEAD", headers={"X-Service-Token": TOKEN}
    )
    assert (code, body) == (200, b"")
    code, body, _ = await get(base + "/api/webhook/stats", method="HEAD")
    assert (code, body) == (401, b"")
    code, body, _ = await get(base + "/healthz", method="POST")
    assert code == 405 and json.loads(body)["error"]["code"] == "ERR_METHOD_NOT_ALLOWED"
    assert "data" not in json.loads(body)
