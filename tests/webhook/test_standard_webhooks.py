"""Standard Webhooks headers, opt-in: checked with the ``standardwebhooks``
library the way a receiver would, next to Phorge's unchanged signature."""

from __future__ import annotations

import hashlib
import hmac
import time
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from twisted.internet import task

from gorge.webhook import payload
from tests.webhook.golden import delivered_cases, load_case
from tests.webhook.test_golden_delivery import _load

STANDARD = ("webhook-id", "webhook-timestamp", "webhook-signature")


@given(
    key=st.text(min_size=1, max_size=40),
    message_id=st.text(
        alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40
    ),
    timestamp=st.integers(0, 2**33),
    body=st.text(max_size=200),
)
def test_the_signature_is_the_one_the_library_computes(key, message_id, timestamp, body):
    library = Webhook(payload.standard_secret(key))
    expected = library.sign(message_id, datetime.fromtimestamp(timestamp, UTC), body)
    assert payload.standard_signature(key, message_id, timestamp, body.encode()) == expected


def test_the_receiver_secret_is_the_hook_key_in_base64():
    # Documented for operators: printf %s KEY | base64, prefixed with whsec_.
    assert payload.standard_secret("abcdefghijklmnopqrstuvwxyz012345") == (
        "whsec_YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXowMTIzNDU="
    )


def _real_time_clock() -> task.Clock:
    clock = task.Clock()
    clock.advance(int(time.time()))  # the library checks the timestamp against its own clock
    return clock


def _flat(headers: dict[str, list[str]]) -> dict[str, str]:
    return {name: values[0] for name, values in headers.items()}


@pytest.mark.integration
@pytest.mark.parametrize("case", delivered_cases()[:3], ids=lambda c: c.name)
async def test_a_delivery_verifies_with_the_library_and_keeps_phorge_bytes(
    case, herald, receiver, make_harness
):
    harness = make_harness(clock=_real_time_clock(), standard_headers=True)
    request_id = _load(herald, receiver, case)
    await harness.run_tick()

    (got,) = receiver.requests
    assert got.body == case.body  # byte for byte what Phorge sends
    key = case.hook_before["hmacKey"]
    assert got.headers["x-phabricator-webhook-signature"] == [
        hmac.new(key.encode(), got.body, hashlib.sha256).hexdigest()
    ]
    headers = _flat(got.headers)
    assert headers["webhook-id"] == herald.request(request_id)["phid"]
    assert headers["webhook-timestamp"] == str(int(harness.clock.seconds()))
    verified = Webhook(payload.standard_secret(key)).verify(got.body, headers)
    assert verified["object"]["phid"] == case.request_before["objectPHID"]
    # A receiver holding another hook's secret refuses it.
    with pytest.raises(WebhookVerificationError):
        Webhook(payload.standard_secret("x" * 32)).verify(got.body, headers)
    # And the body cannot be changed under the signature.
    with pytest.raises(WebhookVerificationError):
        Webhook(payload.standard_secret(key)).verify(got.body[:-1] + b" \n", headers)


@pytest.mark.integration
async def test_every_attempt_of_a_request_has_the_same_id_and_its_own_timestamp(
    herald, receiver, make_harness
):
    case = load_case("http500_editor_retry_forever")
    harness = make_harness(clock=_real_time_clock(), standard_headers=True)
    request_id = _load(herald, receiver, case)
    await harness.run_tick()
    harness.clock.advance(60)
    await harness.run_tick()

    first, second = receiver.requests
    assert (
        first.headers["webhook-id"]
        == second.headers["webhook-id"]
        == [herald.request(request_id)["phid"]]
    )
    stamps = [int(r.headers["webhook-timestamp"][0]) for r in receiver.requests]
    assert stamps[1] - stamps[0] == 60
    assert first.body == second.body == case.body
    assert (
        first.headers["x-phabricator-webhook-signature"]
        == second.headers["x-phabricator-webhook-signature"]
    )
    key = case.hook_before["hmacKey"]
    for got in receiver.requests:
        Webhook(payload.standard_secret(key)).verify(got.body, _flat(got.headers))


@pytest.mark.integration
async def test_off_by_default_no_standard_header_is_sent(herald, receiver, make_harness):
    case = load_case("firehose_200_task_created")
    harness = make_harness()
    _load(herald, receiver, case)
    await harness.run_tick()
    (got,) = receiver.requests
    assert not set(STANDARD) & set(got.headers)
    assert sorted(got.headers) == [
        "content-length",
        "content-type",
        "host",
        "user-agent",
        "x-phabricator-webhook-signature",
    ]
