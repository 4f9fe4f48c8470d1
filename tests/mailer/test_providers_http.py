"""The shared HTTP provider plumbing: endpoint option, bounded POST, and the
generic status / transport-failure tables."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from OpenSSL import SSL
from twisted.internet import defer, error, ssl
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure
from twisted.web.client import (
    Agent,
    BrowserLikePolicyForHTTPS,
    HTTPConnectionPool,
    ResponseNeverReceived,
)
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from gorge.config import ConfigError
from gorge.mailer.backends import http
from gorge.mailer.outcome import Kind
from tests.mailer.test_providers_support import (
    MemoryHttp,
    entry,
    response,
    self_signed,
    split_request,
)

URL = "http://127.0.0.1:8025/v3/mail/send"


def run_post(mem: MemoryHttp, *, deadline: float = 30.0, body: bytes = b"hello") -> defer.Deferred:
    return defer.Deferred.fromCoroutine(
        http.post(
            mem.client,
            mem.reactor,
            URL,
            body=body,
            headers={"Content-Type": "application/json"},
            deadline=deadline,
        )
    )


def failure_of(d: defer.Deferred) -> http.PostFailed:
    assert d.called, "the POST is still pending"
    results: list = []
    d.addBoth(results.append)
    assert isinstance(results[0], Failure), results[0]
    assert results[0].check(http.PostFailed), results[0]
    return results[0].value


def reply_of(d: defer.Deferred) -> http.HttpReply:
    assert d.called, "the POST is still pending"
    results: list = []
    d.addBoth(results.append)
    assert isinstance(results[0], http.HttpReply), results[0]
    return results[0]


# ---------------------------------------------------------------- endpoint option


def test_endpoint_defaults_to_the_provider_origin():
    assert (
        http.endpoint_url(entry("sendgrid"), "https://api.sendgrid.com/")
        == "https://api.sendgrid.com"
    )


@pytest.mark.parametrize(
    "value,expected",
    [
        ("http://127.0.0.1:8025", "http://127.0.0.1:8025"),
        ("http://localhost:8025/", "http://localhost:8025"),
        ("http://[::1]:80/prefix/", "http://[::1]:80/prefix"),
        ("https://proxy.example.com/mail", "https://proxy.example.com/mail"),
    ],
)
def test_endpoint_accepts_https_and_loopback_http(value, expected):
    assert http.endpoint_url(entry("postmark", endpoint=value), "https://x") == expected


@pytest.mark.parametrize(
    "value,reason",
    [
        ("http://mail.example.com", "loopback"),
        ("ftp://127.0.0.1", "http(s) URL"),
        ("https://user:s3cret@proxy.example.com", "credentials"),
        ("https://proxy.example.com/?key=s3cret", "query"),
        ("https://proxy.example.com:99999", "port"),
    ],
)
def test_bad_endpoint_is_a_config_error_naming_entry_and_field(value, reason):
    with pytest.raises(ConfigError) as caught:
        http.endpoint_url(entry("postmark", key="pm", endpoint=value), "https://x")
    assert caught.value.setting == "GORGE_MAILER_CONFIG [pm].endpoint"
    assert reason in caught.value.reason
    assert "s3cret" not in str(caught.value)


def test_bare_host_endpoint_gets_https_when_allowed():
    got = http.endpoint_url(
        entry("ses", endpoint="email.us-west-2.amazonaws.com"), "https://x", bare_host=True
    )
    assert got == "https://email.us-west-2.amazonaws.com"
    with pytest.raises(ConfigError):
        http.endpoint_url(entry("ses", endpoint="email.us-west-2.amazonaws.com"), "https://x")


# ---------------------------------------------------------------- status table


@pytest.mark.parametrize(
    "status,kind",
    [
        (301, Kind.UNKNOWN),
        (302, Kind.UNKNOWN),
        (307, Kind.UNKNOWN),
        (401, Kind.REJECTED_BACKEND),
        (403, Kind.REJECTED_BACKEND),
        (404, Kind.REJECTED_BACKEND),
        (407, Kind.REJECTED_BACKEND),
        (408, Kind.TRANSIENT),
        (425, Kind.TRANSIENT),
        (429, Kind.TRANSIENT),
        (400, Kind.REJECTED_UNSCOPED),
        (413, Kind.REJECTED_UNSCOPED),
        (422, Kind.REJECTED_UNSCOPED),
        (503, Kind.TRANSIENT),
        (500, Kind.UNKNOWN),
        (502, Kind.UNKNOWN),
        (504, Kind.UNKNOWN),
    ],
)
def test_generic_status_table(status, kind):
    outcome = http.classify_status("sendgrid", http.HttpReply(status, {}, b'{"errors":[]}'), 0.0)
    assert outcome is not None and outcome.kind is kind
    assert outcome.cause.startswith(f"sendgrid: HTTP {status}: ")


def test_2xx_is_left_to_the_provider_receipt_rule():
    assert http.classify_status("x", http.HttpReply(202, {}, None), 0.0) is None


@given(st.integers(min_value=100, max_value=599), st.one_of(st.none(), st.binary(max_size=50)))
def test_no_status_is_ever_message_permanent(status, body):
    outcome = http.classify_status("x", http.HttpReply(status, {}, body), 0.0)
    if 200 <= status < 300:
        assert outcome is None
    else:
        assert outcome.kind is not Kind.REJECTED_MESSAGE
        assert outcome.kind is not Kind.ACCEPTED


def test_429_carries_retry_after_seconds_and_dates():
    delta = http.classify_status("x", http.HttpReply(429, {"retry-after": "7"}, b""), 100.0)
    assert delta.kind is Kind.TRANSIENT and delta.retry_after == 7.0
    when = datetime(2030, 1, 1, 0, 0, 30, tzinfo=UTC)
    now = datetime(2030, 1, 1, 0, 0, 0, tzinfo=UTC).timestamp()
    dated = http.classify_status(
        "x", http.HttpReply(503, {"retry-after": format_datetime(when, usegmt=True)}, b""), now
    )
    assert dated.kind is Kind.TRANSIENT and dated.retry_after == 30.0
    junk = http.classify_status("x", http.HttpReply(429, {"retry-after": "soon"}, b""), 0.0)
    assert junk.retry_after is None


def test_error_text_quotes_the_body_without_secrets():
    body = b'{"errors":[{"message":"bad key SG.secret-key-value"}]}  ' + b"x" * 500
    text = http.error_text("sendgrid", http.HttpReply(400, {}, body), ["SG.secret-key-value"])
    assert text.startswith('sendgrid: HTTP 400: {"errors":[{"message":"bad key [REDACTED]"}]}')
    assert "SG.secret" not in text
    assert len(text) < 260
    assert http.error_text("x", http.HttpReply(400, {}, None)) == "x: HTTP 400: (body unreadable)"


# ---------------------------------------------------------------- the bounded POST


def test_request_is_sent_as_given_and_redirects_are_not_followed():
    mem = MemoryHttp()
    d = run_post(mem, body=b'{"a":1}')
    line, headers, body = split_request(mem.connect().value())
    assert line == "POST /v3/mail/send HTTP/1.1"
    assert headers["content-type"] == "application/json"
    assert headers["content-length"] == "7"
    assert body == b'{"a":1}'
    mem.respond(response(302, b"", {"Location": "http://127.0.0.1:9/elsewhere"}))
    reply = reply_of(d)
    assert reply.status == 302
    assert mem.attempts == 1
    assert http.classify_status("x", reply, 0.0).kind is Kind.UNKNOWN


def test_deadline_while_connecting_is_not_submitted():
    mem = MemoryHttp()
    d = run_post(mem, deadline=3.0)
    mem.reactor.advance(2.9)
    assert not d.called
    mem.reactor.advance(0.1)
    failed = failure_of(d)
    assert failed.submitted is False
    assert "before the request was sent" in failed.reason
    assert http.failure_outcome("x", failed).kind is Kind.TRANSIENT


def test_deadline_after_the_request_was_written_is_unknown():
    mem = MemoryHttp()
    d = run_post(mem, deadline=3.0)
    mem.connect()
    assert mem.request_bytes().endswith(b"hello")
    mem.reactor.advance(3.0)
    failed = failure_of(d)
    assert failed.submitted is True
    assert http.failure_outcome("x", failed).kind is Kind.UNKNOWN
    assert mem.transport.disconnecting or mem.transport.disconnected


def test_headers_wait_is_capped_at_ten_seconds_and_total_at_twenty():
    mem = MemoryHttp()
    d = run_post(mem, deadline=600.0)
    mem.connect()
    mem.reactor.advance(http.HEADERS_TIMEOUT - 0.5)
    assert not d.called
    mem.reactor.advance(0.5)
    failed = failure_of(d)
    assert failed.submitted is True
    assert failed.reason == "deadline reached after the request was sent, no response"

    mem = MemoryHttp()
    d = run_post(mem, deadline=600.0)
    mem.connect()
    mem.respond(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    mem.reactor.advance(http.REQUEST_CAP - 0.5)
    assert not d.called
    mem.reactor.advance(0.5)
    reply = reply_of(d)
    assert reply.status == 200 and reply.body is None


@pytest.mark.parametrize(
    "reason",
    [
        error.ConnectionRefusedError("refused"),
        error.DNSLookupError("no such host"),
        error.TCPTimedOutError(),
        error.NoRouteError(),
    ],
)
def test_connect_failures_are_not_submitted(reason):
    mem = MemoryHttp()
    d = run_post(mem)
    mem.refuse(reason)
    failed = failure_of(d)
    assert failed.submitted is False
    assert http.failure_outcome("x", failed).kind is Kind.TRANSIENT


def test_connection_lost_after_the_request_is_unknown():
    mem = MemoryHttp()
    d = run_post(mem)
    mem.connect()
    mem.lose(error.ConnectionLost("reset"))
    failed = failure_of(d)
    assert failed.submitted is True and "no response" in failed.reason
    assert http.failure_outcome("x", failed).kind is Kind.UNKNOWN


def test_tls_failure_is_not_submitted_only_before_the_hand_over():
    # For https, "handed over" already means the handshake completed (the
    # real-TLS tests below cover that); a TLS error before it sent nothing.
    wrapped = ResponseNeverReceived([Failure(SSL.Error([("x", "", "wrong version number")]))])
    before = http.transport_failure(wrapped, handed_over=False, deadline_fired=False)
    assert before.submitted is False and before.reason == "TLS handshake failed"
    # After the hand-over the provider may hold the request: never resend it.
    mem = MemoryHttp()
    d = run_post(mem)
    mem.connect()
    mem.lose(SSL.Error([("SSL routines", "", "bad record mac")]))
    failed = failure_of(d)
    assert failed.submitted is True and "TLS error" in failed.reason
    assert http.failure_outcome("x", failed).kind is Kind.UNKNOWN


def test_cancel_before_and_after_submission():
    mem = MemoryHttp()
    d = run_post(mem)
    d.cancel()
    assert failure_of(d).submitted is False

    mem = MemoryHttp()
    d = run_post(mem)
    mem.connect()
    d.cancel()
    failed = failure_of(d)
    assert failed.submitted is True
    assert http.failure_outcome("x", failed).kind is Kind.UNKNOWN


def test_cancel_while_reading_the_body_keeps_the_status():
    mem = MemoryHttp()
    d = run_post(mem)
    mem.connect()
    mem.respond(b"HTTP/1.1 202 Accepted\r\nContent-Length: 10\r\nX-Message-Id: m\r\n\r\nab")
    d.cancel()
    reply = reply_of(d)
    assert reply.status == 202 and reply.body is None and reply.header("X-Message-Id") == "m"


def test_deadline_already_past_dials_nothing():
    mem = MemoryHttp()
    mem.reactor.advance(50)
    d = run_post(mem, deadline=50.0)
    assert failure_of(d).submitted is False
    assert mem.attempts == 0


@pytest.mark.parametrize(
    "size,readable", [(http.RESPONSE_LIMIT, True), (http.RESPONSE_LIMIT + 1, False)]
)
def test_response_body_is_read_up_to_64_kib(size, readable):
    mem = MemoryHttp()
    d = run_post(mem)
    mem.connect()
    mem.respond(response(200, b"x" * size))
    reply = reply_of(d)
    assert reply.status == 200
    assert (reply.body == b"x" * size) if readable else (reply.body is None)


def test_body_without_length_ends_with_the_connection():
    mem = MemoryHttp()
    d = run_post(mem)
    mem.connect()
    mem.respond(b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"id":"1"}')
    mem.lose(error.ConnectionDone())
    assert reply_of(d).body == b'{"id":"1"}'


def test_provider_request_repr_hides_credentials():
    request = http.ProviderRequest(
        url=URL, body=b"secret body", headers={"Authorization": "Bearer k"}
    )
    assert "Bearer" not in repr(request) and "secret body" not in repr(request)
    assert URL in repr(request)


# ---------------------------------------------------------------- real TLS on loopback


# Twisted's server-side CertificateOptions still hands pyOpenSSL objects over.
TWISTED_SERVER_TLS_WARNING = "ignore:Passing pyOpenSSL:DeprecationWarning"


class _Silent(Protocol):
    """Accepts TCP and never speaks: a TLS handshake against it stalls."""

    def __init__(self, heard: defer.Deferred) -> None:
        self._heard = heard

    def dataReceived(self, data: bytes) -> None:
        if not self._heard.called:
            self._heard.callback(data)


class _Stalling(Resource):
    """Takes the whole request, then never answers."""

    isLeaf = True

    def __init__(self, got: defer.Deferred) -> None:
        super().__init__()
        self._got = got

    def render_POST(self, request):
        if not self._got.called:
            self._got.callback(request.content.read())
        return NOT_DONE_YET


@asynccontextmanager
async def _trusting_client(reactor, port, cert_pem: bytes) -> AsyncIterator[tuple[Agent, str]]:
    """A client that trusts only ``cert_pem`` and the https URL of ``port``;
    the pool is closed and the port stopped afterwards."""
    policy = BrowserLikePolicyForHTTPS(trustRoot=ssl.Certificate.loadPEM(cert_pem))
    pool = HTTPConnectionPool(reactor, persistent=False)
    try:
        client = Agent(reactor, contextFactory=policy, pool=pool, connectTimeout=5)
        yield client, f"https://127.0.0.1:{port.getHost().port}/email"
    finally:
        await pool.closeCachedConnections()
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_real_tls_stalled_handshake_then_cancel_is_not_submitted():
    from twisted.internet import reactor

    heard: defer.Deferred = defer.Deferred()
    factory = Factory.forProtocol(lambda: _Silent(heard))
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    _key, cert = self_signed()
    async with _trusting_client(reactor, port, cert) as (client, url):
        d = defer.Deferred.fromCoroutine(
            http.post(
                client,
                reactor,
                url,
                body=b"secret body",
                headers={},
                deadline=reactor.seconds() + 30,
            )
        )
        hello = await heard.addTimeout(10, reactor)
        assert hello[:1] == b"\x16" and b"secret body" not in hello
        d.cancel()
        with pytest.raises(http.PostFailed) as caught:
            await d
        assert caught.value.submitted is False


@pytest.mark.filterwarnings(TWISTED_SERVER_TLS_WARNING)
@pytest_twisted.ensureDeferred
async def test_real_tls_request_delivered_then_cancel_is_unknown():
    from twisted.internet import reactor

    got: defer.Deferred = defer.Deferred()
    key, cert = self_signed()
    server_cert = ssl.PrivateCertificate.loadPEM(key + cert)
    site = Site(_Stalling(got))
    port = reactor.listenSSL(0, site, server_cert.options(), interface="127.0.0.1")
    async with _trusting_client(reactor, port, cert) as (client, url):
        d = defer.Deferred.fromCoroutine(
            http.post(
                client,
                reactor,
                url,
                body=b"the message",
                headers={},
                deadline=reactor.seconds() + 30,
            )
        )
        assert await got.addTimeout(10, reactor) == b"the message"
        d.cancel()
        with pytest.raises(http.PostFailed) as caught:
            await d
        assert caught.value.submitted is True


@pytest.mark.filterwarnings(TWISTED_SERVER_TLS_WARNING)
@pytest_twisted.ensureDeferred
async def test_real_tls_untrusted_certificate_is_not_submitted():
    from twisted.internet import reactor

    got: defer.Deferred = defer.Deferred()
    key, cert = self_signed()
    port = reactor.listenSSL(
        0,
        Site(_Stalling(got)),
        ssl.PrivateCertificate.loadPEM(key + cert).options(),
        interface="127.0.0.1",
    )
    _other_key, other_cert = self_signed()  # trusts a different certificate
    async with _trusting_client(reactor, port, other_cert) as (client, url):
        with pytest.raises(http.PostFailed) as caught:
            await defer.Deferred.fromCoroutine(
                http.post(
                    client, reactor, url, body=b"x", headers={}, deadline=reactor.seconds() + 30
                )
            )
        assert caught.value.submitted is False
        assert caught.value.reason == "TLS handshake failed"
        assert not got.called
