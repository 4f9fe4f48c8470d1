"""Postmark backend."""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import defer, task

from gorge.config import ConfigError
from gorge.mailer.backends import postmark
from gorge.mailer.backends.http import HttpReply
from gorge.mailer.outcome import Kind
from tests.mailer.test_providers_support import (
    LoopbackServer,
    MemoryHttp,
    Scripted,
    entry,
    from_backend_list,
    full_message,
    message,
)

TOKEN = "pm-server-token-0123"


def backend(clock=None, client=None, **options) -> postmark.PostmarkBackend:
    options.setdefault("access_token", TOKEN)
    return postmark.build(
        entry("postmark", key="pm", **options), reactor=clock or task.Clock(), http_client=client
    )


def receipt(**fields) -> bytes:
    doc = {
        "To": "alice@example.com",
        "SubmittedAt": "2026-01-01T00:00:00Z",
        "MessageID": "b7bc2f4a-e38e-4336-af7d-e6c392c2f817",
        "ErrorCode": 0,
        "Message": "OK",
    }
    doc.update(fields)
    return json.dumps({k: v for k, v in doc.items() if v is not ...}).encode()


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize("options", [{}, {"access-token": ""}])
def test_missing_token_names_entry_and_field(options):
    with pytest.raises(ConfigError) as caught:
        from_backend_list("postmark", "pm", options)
    assert caught.value.setting == "GORGE_MAILER_CONFIG [pm].access-token"
    assert caught.value.reason == "postmark: access-token is required"


def test_token_is_not_in_repr():
    built = backend()
    assert TOKEN not in repr(built) and TOKEN not in repr(built.build_request(message()))


# ---------------------------------------------------------------- the request


def test_request_url_auth_and_body_shape():
    request = backend().build_request(full_message())
    assert request.url == "https://api.postmarkapp.com/email"
    assert request.headers == {
        "X-Postmark-Server-Token": TOKEN,
        "Content-Type": "application/json",
        "Accept": "application/json",
    }
    doc = json.loads(request.body)
    assert doc == {
        "From": "Phorge <noreply@example.com>",
        "To": "Alice <alice@example.com>, carol@example.com",
        "Cc": '"Doe, John" <bob@example.com>',
        "Bcc": "hidden@example.com",
        "ReplyTo": "reply@example.com",
        "Subject": "[Differential] D123: Fix the thing",
        "TextBody": "plain text",
        "HtmlBody": "<p>html</p>",
        "Headers": [
            {"Name": "X-Phabricator-Sent-This-Message", "Value": "Yes"},
            {"Name": "In-Reply-To", "Value": "<thread@example.com>"},
        ],
        "Attachments": [
            {"Name": "note.txt", "Content": "SGVsbG8sIGdvcmdlIQ==", "ContentType": "text/plain"},
            {"Name": "blob.bin", "Content": "AAEC", "ContentType": "application/octet-stream"},
        ],
    }
    assert list(doc) == [
        "From",
        "To",
        "Cc",
        "Bcc",
        "ReplyTo",
        "Subject",
        "TextBody",
        "HtmlBody",
        "Headers",
        "Attachments",
    ]


def test_minimal_message_omits_optional_keys():
    doc = json.loads(backend().build_request(message(textBody="", htmlBody="<p>x</p>")).body)
    assert doc == {
        "From": "Phorge <noreply@example.com>",
        "To": "Alice <alice@example.com>",
        "Subject": "[Differential] D123: Fix the thing",
        "HtmlBody": "<p>x</p>",
    }


# ---------------------------------------------------------------- the answer


@pytest.mark.parametrize(
    "reply,kind",
    [
        # Receipts on 2xx.
        (HttpReply(200, {}, receipt()), Kind.ACCEPTED),
        (HttpReply(200, {}, None), Kind.UNKNOWN),
        (HttpReply(200, {}, b"<html>ok</html>"), Kind.UNKNOWN),
        (HttpReply(200, {}, b"[]"), Kind.UNKNOWN),
        (HttpReply(200, {}, receipt(ErrorCode=...)), Kind.UNKNOWN),
        (HttpReply(200, {}, receipt(ErrorCode=True)), Kind.UNKNOWN),
        (HttpReply(200, {}, receipt(MessageID="")), Kind.UNKNOWN),
        (HttpReply(200, {}, receipt(MessageID=...)), Kind.UNKNOWN),
        (HttpReply(200, {}, receipt(MessageID=7)), Kind.UNKNOWN),
        # 2xx with a non-zero ErrorCode.
        (HttpReply(200, {}, receipt(ErrorCode=406)), Kind.REJECTED_MESSAGE),
        (HttpReply(200, {}, receipt(ErrorCode=300)), Kind.REJECTED_UNSCOPED),
        (HttpReply(200, {}, receipt(ErrorCode=401)), Kind.REJECTED_BACKEND),
        (HttpReply(200, {}, receipt(ErrorCode=100)), Kind.TRANSIENT),
        (HttpReply(200, {}, receipt(ErrorCode=422)), Kind.UNKNOWN),
        (HttpReply(200, {}, receipt(ErrorCode=9999)), Kind.UNKNOWN),
        # 422 with an ErrorCode.
        (HttpReply(422, {}, receipt(ErrorCode=406, MessageID=...)), Kind.REJECTED_MESSAGE),
        (HttpReply(422, {}, receipt(ErrorCode=411, MessageID=...)), Kind.REJECTED_MESSAGE),
        (HttpReply(422, {}, receipt(ErrorCode=300, MessageID=...)), Kind.REJECTED_UNSCOPED),
        (HttpReply(422, {}, receipt(ErrorCode=10, MessageID=...)), Kind.REJECTED_BACKEND),
        (HttpReply(422, {}, receipt(ErrorCode=412, MessageID=...)), Kind.REJECTED_BACKEND),
        (HttpReply(422, {}, receipt(ErrorCode=409, MessageID=...)), Kind.REJECTED_BACKEND),
        (HttpReply(422, {}, receipt(ErrorCode=429, MessageID=...)), Kind.TRANSIENT),
        (HttpReply(422, {}, receipt(ErrorCode=1234, MessageID=...)), Kind.REJECTED_UNSCOPED),
        (HttpReply(422, {}, None), Kind.REJECTED_UNSCOPED),
        (HttpReply(422, {}, b"not json"), Kind.REJECTED_UNSCOPED),
        # Generic table for everything else.
        (HttpReply(401, {}, receipt(ErrorCode=10, MessageID=...)), Kind.REJECTED_BACKEND),
        (HttpReply(302, {}, b""), Kind.UNKNOWN),
        (HttpReply(400, {}, b""), Kind.REJECTED_UNSCOPED),
        (HttpReply(429, {}, b""), Kind.TRANSIENT),
        (HttpReply(500, {}, receipt(ErrorCode=0)), Kind.UNKNOWN),
        (HttpReply(503, {}, b""), Kind.TRANSIENT),
    ],
)
def test_response_families(reply, kind):
    outcome = backend().classify(reply, 0.0)
    assert outcome.kind is kind
    if kind is Kind.ACCEPTED:
        assert outcome.message_id == "b7bc2f4a-e38e-4336-af7d-e6c392c2f817"


@given(st.integers(min_value=-5, max_value=100_000), st.sampled_from([200, 422]))
def test_unlisted_error_codes_are_never_message_permanent(code, status):
    outcome = backend().classify(HttpReply(status, {}, receipt(ErrorCode=code)), 0.0)
    if code in (406, 411):
        assert outcome.kind is Kind.REJECTED_MESSAGE
    else:
        assert outcome.kind is not Kind.REJECTED_MESSAGE
    if code == 0 and status == 200:
        assert outcome.kind is Kind.ACCEPTED


def test_error_code_429_keeps_retry_after():
    outcome = backend().classify(
        HttpReply(422, {"retry-after": "4"}, receipt(ErrorCode=429, MessageID=...)), 0.0
    )
    assert outcome.kind is Kind.TRANSIENT and outcome.retry_after == 4.0


def test_timeouts_before_and_after_submission():
    mem = MemoryHttp()
    built = backend(clock=mem.reactor, client=mem.client)
    assert mem.outcome_past_deadline(built, 2.0, connect=False).kind is Kind.TRANSIENT

    mem = MemoryHttp()
    built = backend(clock=mem.reactor, client=mem.client, endpoint="http://127.0.0.1:8025")
    assert mem.outcome_past_deadline(built, 2.0, connect=True).kind is Kind.UNKNOWN


def test_deadline_during_the_tls_handshake_is_not_submitted():
    # The default https endpoint: TCP is up, the ClientHello went out, the
    # server never answers it; the request bytes only sit in TLS's buffer.
    mem = MemoryHttp()
    d = defer.Deferred.fromCoroutine(
        backend(clock=mem.reactor, client=mem.client).send(message(), deadline=2.0)
    )
    assert mem.reactor.tcpClients[-1][1] == 443
    hello = mem.connect().value()
    assert hello[:1] == b"\x16" and b"X-Postmark-Server-Token" not in hello
    mem.reactor.advance(2.0)
    assert d.result.kind is Kind.TRANSIENT
    assert "before the request was sent" in d.result.cause


def test_receipt_cut_off_by_the_deadline_is_unknown():
    mem = MemoryHttp()
    d = defer.Deferred.fromCoroutine(
        backend(
            clock=mem.reactor,
            client=mem.client,
            endpoint="http://127.0.0.1:8025",
        ).send(message(), deadline=2.0)
    )
    mem.connect()
    mem.respond(b'HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{"ErrorCode":0,')
    mem.reactor.advance(2.0)
    assert d.result.kind is Kind.UNKNOWN


@pytest_twisted.ensureDeferred
async def test_end_to_end_against_a_loopback_endpoint():
    from twisted.internet import reactor

    async with LoopbackServer(reactor) as server:
        server.answer = Scripted(
            200, receipt(MessageID="loop-pm"), {"Content-Type": "application/json"}
        )
        built = backend(clock=reactor, client=server.client, endpoint=server.url)
        outcome = await built.send(full_message(), deadline=reactor.seconds() + 10)
        assert outcome.kind is Kind.ACCEPTED and outcome.message_id == "loop-pm"
        (seen,) = server.requests
        assert seen.path == b"/email"
        assert seen.headers["x-postmark-server-token"] == TOKEN
        assert seen.headers["accept"] == "application/json"
        assert json.loads(seen.body)["To"] == "Alice <alice@example.com>, carol@example.com"

        server.answer = Scripted(422, receipt(ErrorCode=406, MessageID=..., Message="Inactive"))
        outcome = await built.send(message(), deadline=reactor.seconds() + 10)
        assert outcome.kind is Kind.REJECTED_MESSAGE
        assert outcome.cause.startswith("postmark: HTTP 422: ")
