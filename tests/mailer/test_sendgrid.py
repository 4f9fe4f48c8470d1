"""SendGrid v3 Mail Send backend."""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from twisted.internet import defer, task

from gorge.config import ConfigError
from gorge.mailer.backends import sendgrid
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
    response,
    split_request,
)

KEY = "SG.live-key-0123456789"


def backend(clock=None, client=None, **options) -> sendgrid.SendGridBackend:
    options.setdefault("api_key", KEY)
    return sendgrid.build(
        entry("sendgrid", key="sg", **options), reactor=clock or task.Clock(), http_client=client
    )


def from_list(options: dict) -> sendgrid.SendGridBackend:
    return from_backend_list("sendgrid", "sg", options)


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize("options", [{}, {"api-key": ""}, {"api-key": "   "}])
def test_missing_api_key_names_entry_and_field(options):
    with pytest.raises(ConfigError) as caught:
        from_list(options)
    assert caught.value.setting == "GORGE_MAILER_CONFIG [sg].api-key"
    assert caught.value.reason == "sendgrid: api-key is required"


def test_scalar_options_are_accepted():
    built = from_list({"api-key": 12345, "endpoint": "http://127.0.0.1:8025"})
    assert built.build_request(message()).headers["Authorization"] == "Bearer 12345"
    assert built.url == "http://127.0.0.1:8025/v3/mail/send"


def test_key_is_not_in_repr():
    built = backend()
    assert KEY not in repr(built)
    assert KEY not in repr(built.build_request(message()))
    assert "sg" in repr(built)


# ---------------------------------------------------------------- the request


def test_request_url_auth_and_body_shape():
    request = backend().build_request(full_message())
    assert request.url == "https://api.sendgrid.com/v3/mail/send"
    assert request.headers == {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    doc = json.loads(request.body)
    assert doc == {
        "personalizations": [
            {
                "to": [
                    {"email": "alice@example.com", "name": "Alice"},
                    {"email": "carol@example.com"},
                ],
                "cc": [{"email": "bob@example.com", "name": "Doe, John"}],
                "bcc": [{"email": "hidden@example.com"}],
                "headers": {
                    "X-Phabricator-Sent-This-Message": "Yes",
                    "In-Reply-To": "<thread@example.com>",
                },
            }
        ],
        "from": {"email": "noreply@example.com", "name": "Phorge"},
        "reply_to": {"email": "reply@example.com"},
        "subject": "[Differential] D123: Fix the thing",
        "content": [
            {"type": "text/plain", "value": "plain text"},
            {"type": "text/html", "value": "<p>html</p>"},
        ],
        "attachments": [
            {"content": "SGVsbG8sIGdvcmdlIQ==", "filename": "note.txt", "type": "text/plain"},
            {"content": "AAEC", "filename": "blob.bin", "type": "application/octet-stream"},
        ],
    }
    # Compact, in the documented key order.
    assert request.body.startswith(
        b'{"personalizations":[{"to":[{"email":"alice@example.com","name"'
    )


def test_minimal_message_omits_optional_parts_and_keeps_utf8():
    doc = json.loads(
        backend()
        .build_request(
            message(
                subject="Grüße",
                textBody="",
                htmlBody="<b>ü</b>",
                to=[{"name": "Zoë", "address": "zoe@example.com"}],
            )
        )
        .body
    )
    assert doc["personalizations"] == [{"to": [{"email": "zoe@example.com", "name": "Zoë"}]}]
    assert "reply_to" not in doc and "attachments" not in doc
    assert doc["content"] == [{"type": "text/html", "value": "<b>ü</b>"}]
    assert doc["subject"] == "Grüße"


def test_reserved_headers_are_dropped_and_same_names_collapse():
    doc = json.loads(
        backend()
        .build_request(
            message(
                headers=[
                    {"name": "X-A", "value": "1"},
                    {"name": "Reply-To", "value": "x@example.com"},
                    {"name": "DKIM-Signature", "value": "v=1"},
                    {"name": "x-a", "value": "2"},
                    {"name": "References", "value": "<r@example.com>"},
                ]
            )
        )
        .body
    )
    assert doc["personalizations"][0]["headers"] == {"x-a": "2", "References": "<r@example.com>"}


def test_attachment_base64_is_passed_on_whitespace_stripped():
    doc = json.loads(
        backend()
        .build_request(
            message(
                attachments=[
                    {"filename": "a.txt", "mimeType": "", "data": "SGVs\nbG8s IGdv\r\ncmdlIQ=="}
                ]
            )
        )
        .body
    )
    assert doc["attachments"] == [
        {"content": "SGVsbG8sIGdvcmdlIQ==", "filename": "a.txt", "type": "application/octet-stream"}
    ]


# ---------------------------------------------------------------- the answer


@pytest.mark.parametrize(
    "reply,kind,message_id",
    [
        (HttpReply(202, {"x-message-id": "abc123"}, b""), Kind.ACCEPTED, "abc123"),
        (HttpReply(202, {}, None), Kind.ACCEPTED, ""),
        (HttpReply(200, {"x-message-id": "m"}, None), Kind.ACCEPTED, "m"),
        (HttpReply(301, {}, b""), Kind.UNKNOWN, ""),
        (HttpReply(400, {}, b'{"errors":[{"message":"bad"}]}'), Kind.REJECTED_UNSCOPED, ""),
        (HttpReply(401, {}, b'{"errors":[]}'), Kind.REJECTED_BACKEND, ""),
        (HttpReply(403, {}, None), Kind.REJECTED_BACKEND, ""),
        (HttpReply(404, {}, b""), Kind.REJECTED_BACKEND, ""),
        (HttpReply(413, {}, b""), Kind.REJECTED_UNSCOPED, ""),
        (HttpReply(429, {}, b""), Kind.TRANSIENT, ""),
        (HttpReply(500, {}, b""), Kind.UNKNOWN, ""),
        (HttpReply(503, {}, b""), Kind.TRANSIENT, ""),
    ],
)
def test_response_families(reply, kind, message_id):
    outcome = backend().classify(reply, 0.0)
    assert outcome.kind is kind
    assert outcome.message_id == message_id


def test_429_retry_after_and_echoed_key_is_scrubbed():
    outcome = backend().classify(
        HttpReply(
            429, {"retry-after": "12"}, f'{{"errors":[{{"message":"slow down {KEY}"}}]}}'.encode()
        ),
        0.0,
    )
    assert outcome.kind is Kind.TRANSIENT and outcome.retry_after == 12.0
    assert KEY not in outcome.cause and outcome.cause.startswith("sendgrid: HTTP 429: ")


def test_timeouts_before_and_after_submission():
    mem = MemoryHttp()
    built = backend(clock=mem.reactor, client=mem.client, endpoint="http://127.0.0.1:8025")
    before = mem.outcome_past_deadline(built, 5.0, connect=False)
    assert before.kind is Kind.TRANSIENT and "before the request was sent" in before.cause

    mem = MemoryHttp()
    built = backend(clock=mem.reactor, client=mem.client, endpoint="http://127.0.0.1:8025")
    assert mem.outcome_past_deadline(built, 5.0, connect=True).kind is Kind.UNKNOWN


def test_status_received_but_body_stalls_is_still_accepted():
    mem = MemoryHttp()
    built = backend(clock=mem.reactor, client=mem.client, endpoint="http://127.0.0.1:8025")
    d = defer.Deferred.fromCoroutine(built.send(message(), deadline=5.0))
    request_line, headers, _ = split_request(mem.connect().value())
    assert request_line == "POST /v3/mail/send HTTP/1.1"
    assert headers["authorization"] == f"Bearer {KEY}"
    mem.respond(b"HTTP/1.1 202 Accepted\r\nX-Message-Id: q1\r\nContent-Length: 9\r\n\r\n{")
    mem.reactor.advance(5.0)
    assert d.result.kind is Kind.ACCEPTED and d.result.message_id == "q1"


def test_deadline_already_past_does_not_dial():
    mem = MemoryHttp()
    mem.reactor.advance(10)
    built = backend(clock=mem.reactor, client=mem.client)
    d = defer.Deferred.fromCoroutine(built.send(message(), deadline=10.0))
    assert d.result.kind is Kind.TRANSIENT and mem.attempts == 0


def test_memory_connection_answer_is_classified():
    mem = MemoryHttp()
    built = backend(clock=mem.reactor, client=mem.client, endpoint="http://127.0.0.1:8025")
    d = defer.Deferred.fromCoroutine(built.send(message(), deadline=5.0))
    mem.connect()
    mem.respond(response(401, b'{"errors":[{"message":"denied"}]}'))
    assert d.result.kind is Kind.REJECTED_BACKEND
    assert d.result.cause == 'sendgrid: HTTP 401: {"errors":[{"message":"denied"}]}'


# ---------------------------------------------------------------- over loopback


@pytest_twisted.ensureDeferred
async def test_end_to_end_against_a_loopback_endpoint():
    from twisted.internet import reactor

    async with LoopbackServer(reactor) as server:
        server.answer = Scripted(202, b"", {"X-Message-Id": "loop-1"})
        built = backend(clock=reactor, client=server.client, endpoint=server.url + "/prefix")
        outcome = await built.send(full_message(), deadline=reactor.seconds() + 10)
        assert outcome.kind is Kind.ACCEPTED and outcome.message_id == "loop-1"
        (seen,) = server.requests
        assert seen.method == b"POST" and seen.path == b"/prefix/v3/mail/send"
        assert seen.headers["authorization"] == f"Bearer {KEY}"
        assert seen.headers["content-type"] == "application/json"
        assert json.loads(seen.body)["personalizations"][0]["bcc"] == [
            {"email": "hidden@example.com"}
        ]

        server.answer = Scripted(429, b'{"errors":[]}', {"Retry-After": "3"})
        outcome = await built.send(message(), deadline=reactor.seconds() + 10)
        assert outcome.kind is Kind.TRANSIENT and outcome.retry_after == 3.0


def test_cancelled_attempt_returns_a_classified_outcome():
    # The dispatcher cancels on its deadline, a client disconnect or shutdown.
    for connect, kind in ((False, Kind.TRANSIENT), (True, Kind.UNKNOWN)):
        mem = MemoryHttp()
        built = backend(clock=mem.reactor, client=mem.client, endpoint="http://127.0.0.1:8025")
        d = defer.Deferred.fromCoroutine(built.send(message(), deadline=5.0))
        if connect:
            mem.connect()
        d.cancel()
        assert d.result.kind is kind
        assert "cancelled" in d.result.cause
