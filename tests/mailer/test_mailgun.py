"""Mailgun backend."""

from __future__ import annotations

import base64
from email import policy
from email.parser import BytesParser

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import defer, task

from gorge.config import ConfigError
from gorge.mailer.backends import mailgun
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
)

KEY = "key-3ax6xnjp29jd6fds4gc373sgvjxteol0"


def backend(clock=None, client=None, token_hex=None, **options) -> mailgun.MailgunBackend:
    options.setdefault("api_key", KEY)
    options.setdefault("domain", "mg.example.com")
    extra = {"token_hex": token_hex} if token_hex else {}
    return mailgun.MailgunBackend(
        entry("mailgun", key="mg", **options), clock=clock or task.Clock(), client=client, **extra
    )


def from_list(options: dict) -> mailgun.MailgunBackend:
    return from_backend_list("mailgun", "mg", options)


def parse_form(content_type: str, body: bytes) -> list[tuple[str, str | None, str | None, bytes]]:
    """(name, filename, content type, raw value) of each form-data part, in order."""
    doc = BytesParser(policy=policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body
    )
    fields = []
    for part in doc.iter_parts():
        disposition = part.get("Content-Disposition")
        name = disposition.params["name"]
        filename = disposition.params.get("filename")
        ctype = part.get("Content-Type")
        fields.append(
            (name, filename, str(ctype) if ctype else None, part.get_payload(decode=True))
        )
    return fields


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "options,field",
    [
        ({"domain": "mg.example.com"}, "api-key"),
        ({"api-key": "", "domain": "mg.example.com"}, "api-key"),
        ({"api-key": KEY}, "domain"),
        ({"api-key": KEY, "domain": " "}, "domain"),
    ],
)
def test_missing_credentials_name_entry_and_field(options, field):
    with pytest.raises(ConfigError) as caught:
        from_list(options)
    assert caught.value.setting == f"GORGE_MAILER_CONFIG [mg].{field}"
    assert caught.value.reason == f"mailgun: {field} is required"
    assert KEY not in str(caught.value)


@pytest.mark.parametrize("hostname", ["https://api.mailgun.net", "api.mailgun.net/v3", "a b", "-x"])
def test_bad_api_hostname_is_a_config_error(hostname):
    with pytest.raises(ConfigError) as caught:
        from_list({"api-key": KEY, "domain": "mg.example.com", "api-hostname": hostname})
    assert caught.value.setting == "GORGE_MAILER_CONFIG [mg].api-hostname"


def test_urls_from_hostname_endpoint_and_scalar_options():
    assert backend().url == "https://api.mailgun.net/v2/mg.example.com/messages"
    assert backend(api_hostname="api.eu.mailgun.net").url == (
        "https://api.eu.mailgun.net/v2/mg.example.com/messages"
    )
    assert backend(endpoint="http://127.0.0.1:8025/mg").url == (
        "http://127.0.0.1:8025/mg/v2/mg.example.com/messages"
    )
    built = from_list({"api-key": 42, "domain": "mg.example.com"})
    auth = built.build_request(message()).headers["Authorization"]
    assert base64.b64decode(auth.removeprefix("Basic ")) == b"api:42"


def test_key_is_not_in_repr():
    built = backend()
    assert KEY not in repr(built) and KEY not in repr(built.build_request(message()))


# ---------------------------------------------------------------- the request


def test_exact_request_for_a_small_message():
    request = backend(token_hex=lambda n: "b" * (2 * n)).build_request(
        message(textBody="hi", headers=[{"name": "X-A", "value": "1"}])
    )
    boundary = "b" * 32
    assert request.url == "https://api.mailgun.net/v2/mg.example.com/messages"
    assert request.headers == {
        "Authorization": "Basic " + base64.b64encode(f"api:{KEY}".encode()).decode(),
        "Content-Type": f"multipart/form-data; boundary={boundary}",
    }

    def field(name, value):
        return (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        ).encode()

    assert request.body == (
        field("from", "Phorge <noreply@example.com>")
        + field("to", "Alice <alice@example.com>")
        + field("subject", "[Differential] D123: Fix the thing")
        + field("text", "hi")
        + field("h:X-A", "1")
        + f"--{boundary}--\r\n".encode()
    )


def test_fields_in_order_with_decoded_attachments():
    request = backend().build_request(full_message())
    fields = parse_form(request.headers["Content-Type"], request.body)
    assert [(n, f, c, v) for n, f, c, v in fields if f is None] == [
        ("from", None, None, b"Phorge <noreply@example.com>"),
        ("to", None, None, b"Alice <alice@example.com>"),
        ("to", None, None, b"carol@example.com"),
        ("cc", None, None, b'"Doe, John" <bob@example.com>'),
        ("bcc", None, None, b"hidden@example.com"),
        ("h:Reply-To", None, None, b"reply@example.com"),
        ("subject", None, None, b"[Differential] D123: Fix the thing"),
        ("text", None, None, b"plain text"),
        ("html", None, None, b"<p>html</p>"),
        ("h:X-Phabricator-Sent-This-Message", None, None, b"Yes"),
        ("h:In-Reply-To", None, None, b"<thread@example.com>"),
    ]
    assert [(n, f, c, v) for n, f, c, v in fields if f is not None] == [
        ("attachment", "note.txt", "text/plain", b"Hello, gorge!"),
        ("attachment", "blob.bin", "application/octet-stream", b"\x00\x01\x02"),
    ]
    assert [n for n, *_ in fields][-2:] == ["attachment", "attachment"]


def test_quotes_in_filenames_are_escaped_and_utf8_kept():
    request = backend(token_hex=lambda n: "c" * (2 * n)).build_request(
        message(
            subject="Grüße",
            attachments=[{"filename": 'a"b\\c.txt', "mimeType": "text/plain", "data": ""}],
        )
    )
    assert b'filename="a\\"b\\\\c.txt"' in request.body
    assert "Grüße".encode() in request.body


@given(st.binary(max_size=200))
def test_boundary_never_occurs_in_the_content(data):
    tokens = iter(["00" * 16, "ab" * 16, "cd" * 16])
    body, boundary = mailgun.multipart_body(
        [("attachment", data + b"0" * 32, "f", "application/octet-stream")], lambda n: next(tokens)
    )
    assert boundary == "ab" * 16  # the all-zero candidate occurs in the data
    assert body.count(boundary.encode()) == 2


# ---------------------------------------------------------------- the answer


@pytest.mark.parametrize(
    "reply,kind,message_id",
    [
        (
            HttpReply(
                200, {}, b'{"id":"<20260101.1@mg.example.com>","message":"Queued. Thank you."}'
            ),
            Kind.ACCEPTED,
            "<20260101.1@mg.example.com>",
        ),
        (HttpReply(200, {}, None), Kind.UNKNOWN, ""),
        (HttpReply(200, {}, b"Queued"), Kind.UNKNOWN, ""),
        (HttpReply(200, {}, b'{"message":"Queued. Thank you."}'), Kind.UNKNOWN, ""),
        (HttpReply(200, {}, b'{"id":""}'), Kind.UNKNOWN, ""),
        (HttpReply(200, {}, b'{"id":5}'), Kind.UNKNOWN, ""),
        (HttpReply(200, {}, b'["id"]'), Kind.UNKNOWN, ""),
        (HttpReply(302, {}, b""), Kind.UNKNOWN, ""),
        (
            HttpReply(400, {}, b'{"message":"to parameter is not a valid address"}'),
            Kind.REJECTED_UNSCOPED,
            "",
        ),
        (HttpReply(401, {}, b"Forbidden"), Kind.REJECTED_BACKEND, ""),
        (HttpReply(404, {}, b'{"message":"Domain not found"}'), Kind.REJECTED_BACKEND, ""),
        (HttpReply(429, {}, b""), Kind.TRANSIENT, ""),
        (HttpReply(500, {}, b""), Kind.UNKNOWN, ""),
        (HttpReply(503, {}, b""), Kind.TRANSIENT, ""),
    ],
)
def test_response_families(reply, kind, message_id):
    outcome = backend().classify(reply, 0.0)
    assert outcome.kind is kind and outcome.message_id == message_id


def test_timeouts_before_and_after_submission():
    for connect, kind in ((False, Kind.TRANSIENT), (True, Kind.UNKNOWN)):
        mem = MemoryHttp()
        built = backend(clock=mem.reactor, client=mem.client, endpoint="http://127.0.0.1:8025")
        assert mem.outcome_past_deadline(built, 4.0, connect=connect).kind is kind


def test_oversize_receipt_is_unknown():
    mem = MemoryHttp()
    d = defer.Deferred.fromCoroutine(
        backend(clock=mem.reactor, client=mem.client, endpoint="http://127.0.0.1:8025").send(
            message(), deadline=4.0
        )
    )
    mem.connect()
    mem.respond(response(200, b'{"id":"x","pad":"' + b"p" * 70_000 + b'"}'))
    assert d.result.kind is Kind.UNKNOWN


@pytest_twisted.ensureDeferred
async def test_end_to_end_against_a_loopback_endpoint():
    from twisted.internet import reactor

    async with LoopbackServer(reactor) as server:
        server.answer = Scripted(200, b'{"id":"<loop@mg>","message":"Queued. Thank you."}')
        built = backend(clock=reactor, client=server.client, endpoint=server.url)
        outcome = await built.send(full_message(), deadline=reactor.seconds() + 10)
        assert outcome.kind is Kind.ACCEPTED and outcome.message_id == "<loop@mg>"
        (seen,) = server.requests
        assert seen.path == b"/v2/mg.example.com/messages"
        assert (
            seen.headers["authorization"]
            == "Basic " + base64.b64encode(f"api:{KEY}".encode()).decode()
        )
        fields = parse_form(seen.headers["content-type"], seen.body)
        assert ("attachment", "note.txt", "text/plain", b"Hello, gorge!") in fields

        server.answer = Scripted(404, b'{"message":"Domain not found: mg.example.com"}')
        outcome = await built.send(message(), deadline=reactor.seconds() + 10)
        assert outcome.kind is Kind.REJECTED_BACKEND
        assert outcome.cause == 'mailgun: HTTP 404: {"message":"Domain not found: mg.example.com"}'
