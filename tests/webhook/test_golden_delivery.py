"""Issue point 1: every golden case replayed through the real dispatcher and MariaDB."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from tests.webhook.golden import all_cases, load_case

pytestmark = pytest.mark.integration


def _local_uri(receiver, golden_uri: str) -> str:
    return receiver.base + golden_uri.split("8765", 1)[1]


def _assert_row_like(row: dict, golden: dict) -> None:
    assert row["status"] == golden["status"]
    assert row["lastRequestResult"] == golden["lastRequestResult"]
    assert row["properties"] == golden["properties"]
    assert row["dateCreated"] == golden["dateCreated"]
    assert row["dateModified"] > row["dateCreated"]  # Strictly after the creation second
    if golden["lastRequestResult"] == "none":
        assert row["lastRequestEpoch"] == 0


def _load(herald, receiver, case):
    herald.insert_hook(
        row=case.hook_before, uri=_local_uri(receiver, case.hook_before["webhookURI"])
    )
    return herald.insert_request(row=case.request_before)


@pytest.mark.parametrize("case", all_cases(), ids=lambda c: c.name)
async def test_golden_case(case, herald, receiver, make_harness):
    harness = make_harness()
    harness.clock.advance(case.request_before["dateCreated"] - harness.clock.seconds())
    request_id = _load(herald, receiver, case)

    await harness.run_tick()

    row = herald.request(request_id)
    _assert_row_like(row, case.request_after)
    if not case.made_request:
        assert receiver.requests == []
        return
    assert len(receiver.requests) == 1
    got = receiver.requests[0]
    assert got.body == case.body
    key = case.hook_before["hmacKey"].encode()
    assert got.headers["x-phabricator-webhook-signature"] == [
        hmac.new(key, got.body, hashlib.sha256).hexdigest()
    ]
    assert got.headers["content-type"] == ["application/json"]
    assert got.headers["content-length"] == [str(len(case.body))]
    assert "transfer-encoding" not in got.headers and "expect" not in got.headers
    assert row["lastRequestEpoch"] == harness.clock.seconds()


async def test_retry_forever_attempts_send_identical_bytes(herald, receiver, make_harness):
    case = load_case("http500_editor_retry_forever")
    attempt2 = json.loads(
        (case.path / "attempt2_bin_worker_execute/request_row_after.json").read_text()
    )
    attempt3 = json.loads(
        (case.path / "attempt3_after_receiver_recovers/request_row_after.json").read_text()
    )
    recovered_hook = json.loads(
        (case.path / "attempt3_after_receiver_recovers/webhook_row_before.json").read_text()
    )
    harness = make_harness()
    harness.clock.advance(case.request_before["dateCreated"] - harness.clock.seconds())
    request_id = _load(herald, receiver, case)

    await harness.run_tick()
    assert herald.request(request_id)["status"] == "queued"
    # Not due again before max(lease, backoff) = 60 s.
    harness.clock.advance(59)
    await harness.run_tick()
    assert len(receiver.requests) == 1

    harness.clock.advance(1)
    await harness.run_tick()
    assert len(receiver.requests) == 2
    _assert_row_like(herald.request(request_id), attempt2)

    herald.execute(
        "UPDATE herald_webhook SET webhookURI = %s WHERE phid = %s",
        (_local_uri(receiver, recovered_hook["webhookURI"]), recovered_hook["phid"]),
    )
    harness.clock.advance(60)
    await harness.run_tick()
    assert len(receiver.requests) == 3
    _assert_row_like(herald.request(request_id), attempt3)
    bodies = {r.body for r in receiver.requests}
    signatures = {tuple(r.headers["x-phabricator-webhook-signature"]) for r in receiver.requests}
    assert bodies == {case.body} and len(signatures) == 1
    assert harness.metric("gorge_webhook_deliveries_total", outcome="retry") == 2
    assert harness.metric("gorge_webhook_deliveries_total", outcome="sent") == 1
