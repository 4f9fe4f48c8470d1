"""The smtp backend against an in-process SMTP server on 127.0.0.1:0."""

from __future__ import annotations

import base64
import email
import email.policy
import json

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from gorge.mailer.backends.base import BackendEntry
from gorge.mailer.backends.smtp import SmtpBackend, SmtpConfig, build
from gorge.mailer.backends.smtp_data import dot_stuff
from gorge.mailer.backends.smtp_reply import classify_reply
from gorge.mailer.outcome import Kind
from tests.mailer.conftest import TOKEN, make_harness
from tests.mailer.conftest import parsed_message as message
from tests.mailer.smtpserver import ScriptedFactory, ServerState, make_certificate
from tests.support.logcapture import logged_events


@pytest.fixture(scope="module")
def cert():
    return make_certificate()


@pytest.fixture
def reactor():
    from twisted.internet import reactor as global_reactor  # tests drive the real loop

    return global_reactor


@pytest.fixture
def server(reactor, cert):
    """Start a scripted server; returns a function (state, implicit_tls) -> port."""
    ports = []

    def start(state: ServerState, implicit_tls: bool = False) -> int:
        state.tls_options = cert.server_options
        factory = ScriptedFactory(state, implicit_tls)
        if implicit_tls:
            port = reactor.listenSSL(0, factory, cert.server_options, interface="127.0.0.1")
        else:
            port = reactor.listenTCP(0, factory, interface="127.0.0.1")
        ports.append(port)
        return port.getHost().port

    yield start
    for port in ports:
        port.stopListening()


def backend(reactor, cert, port, **cfg) -> SmtpBackend:
    cfg.setdefault("host", "127.0.0.1")
    return SmtpBackend(
        "smtp",
        1,
        SmtpConfig(port=port, helo="client.test", **cfg),
        reactor=reactor,
        trust_root=cert.trust_root,
    )


async def send(reactor, b: SmtpBackend, msg=None):
    return await b.send(msg or message(), deadline=reactor.seconds() + 10)


@pytest_twisted.ensureDeferred
async def test_plain_delivery_is_well_formed_mime(reactor, cert, server):
    state = ServerState()
    port = server(state)
    payload = bytes(range(256)) * 40
    msg = message(
        to=[{"name": "Doe, John", "address": "john@example.com"}],
        cc=[{"name": "", "address": "cc@example.com"}],
        bcc=[{"name": "", "address": "hidden@example.com"}],
        subject="Grüße from Phorge",
        textBody="line one\n.\nline three " + "x" * 2000,
        htmlBody="<p>hi</p>",
        headers=[
            {"name": "Message-ID", "value": "<thread-1@phorge.example>"},
            {"name": "Date", "value": "Tue, 01 Sep 2026 10:00:00 +0000"},
            {"name": "X-Evil", "value": "ok\r\nBcc: victim@example.com"},
            {"name": "In-Reply-To", "value": "<parent@phorge.example>"},
        ],
        attachments=[
            {
                "filename": "blob.bin",
                "mimeType": "application/x-test",
                "data": base64.b64encode(payload).decode(),
            },
            {"filename": 'naïve "q".txt', "mimeType": "text/plain", "data": "SGVsbG8="},
        ],
    )
    outcome = await send(reactor, backend(reactor, cert, port), msg)
    assert outcome.kind is Kind.ACCEPTED and outcome.message_id == ""
    [delivery] = state.deliveries
    assert delivery.mail_from == "noreply@example.com"
    assert delivery.rcpt_to == ["john@example.com", "cc@example.com", "hidden@example.com"]
    raw = delivery.data
    assert all(len(line) <= 998 for line in raw.split(b"\r\n"))
    assert b"\n" not in raw.replace(b"\r\n", b"")
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert parsed["Message-ID"] == "<thread-1@phorge.example>"
    assert parsed["Date"] == "Tue, 01 Sep 2026 10:00:00 +0000"
    assert parsed["To"] == '"Doe, John" <john@example.com>'
    assert str(parsed["Subject"]) == "Grüße from Phorge"
    assert parsed["Bcc"] is None and b"hidden@example.com" not in raw
    assert parsed["X-Evil"] == "okBcc: victim@example.com"
    assert parsed.get_content_type() == "multipart/mixed"
    body, blob, note = parsed.iter_parts()
    assert body.get_content_type() == "multipart/alternative"
    text, html = body.iter_parts()
    assert text.get_content().startswith("line one\n.\nline three")
    assert html.get_content() == "<p>hi</p>"
    assert blob.get_payload(decode=True) == payload
    assert blob.get_content_type() == "application/x-test"
    assert note.get_filename() == 'naïve "q".txt'
    assert note.get_payload(decode=True) == b"Hello"
    for line in raw.split(b"\r\n"):
        if line and not line.startswith((b"-", b" ")) and b":" not in line:
            assert len(line) <= 76  # base64 body lines are wrapped


@pytest_twisted.ensureDeferred
async def test_generated_date_and_message_id(reactor, cert, server):
    state = ServerState()
    port = server(state)
    assert (await send(reactor, backend(reactor, cert, port))).is_accepted
    parsed = email.message_from_bytes(state.deliveries[0].data, policy=email.policy.default)
    assert parsed["Message-ID"].endswith("@example.com>")
    assert parsed["Date"] is not None
    assert parsed.get_content_type() == "text/plain"


@pytest_twisted.ensureDeferred
async def test_starttls_required_with_auth_plain(reactor, cert, server):
    state = ServerState(starttls=True, auth=("PLAIN", "LOGIN"), credentials=("u", "p"))
    port = server(state)
    b = backend(reactor, cert, port, mode="starttls", user="u", password="p")
    outcome = await send(reactor, b)
    assert outcome.kind is Kind.ACCEPTED
    [delivery] = state.deliveries
    assert delivery.secure and delivery.auth == ("u", "p")


@pytest_twisted.ensureDeferred
async def test_opportunistic_starttls_and_auth_login(reactor, cert, server):
    state = ServerState(starttls=True, auth=("LOGIN",), credentials=("u", "p"))
    port = server(state)
    outcome = await send(reactor, backend(reactor, cert, port, user="u", password="p"))
    assert outcome.kind is Kind.ACCEPTED
    assert state.deliveries[0].secure and state.deliveries[0].auth == ("u", "p")


@pytest_twisted.ensureDeferred
async def test_implicit_tls(reactor, cert, server):
    state = ServerState(auth=("PLAIN",), credentials=("u", "p"))
    port = server(state, implicit_tls=True)
    outcome = await send(reactor, backend(reactor, cert, port, mode="ssl", user="u", password="p"))
    assert outcome.kind is Kind.ACCEPTED and state.deliveries[0].secure


@pytest_twisted.ensureDeferred
async def test_untrusted_certificate_is_backend_scoped(reactor, server):
    other = make_certificate()
    state = ServerState(starttls=True)
    port = server(state, implicit_tls=True)
    b = SmtpBackend(
        "smtp",
        1,
        SmtpConfig(host="127.0.0.1", port=port, mode="ssl"),
        reactor=reactor,
        trust_root=other.trust_root,
    )
    outcome = await send(reactor, b)
    assert outcome.kind is Kind.REJECTED_BACKEND and "TLS" in outcome.cause
    assert state.deliveries == []


@pytest_twisted.ensureDeferred
async def test_tls_insecure_accepts_self_signed(reactor, server):
    state = ServerState(starttls=True)
    port = server(state)
    b = SmtpBackend(
        "smtp",
        1,
        SmtpConfig(host="127.0.0.1", port=port, mode="starttls", insecure=True),
        reactor=reactor,
    )
    assert (await send(reactor, b)).is_accepted and state.deliveries[0].secure


@pytest_twisted.ensureDeferred
async def test_starttls_required_but_not_offered(reactor, cert, server):
    state = ServerState(starttls=False)
    port = server(state)
    outcome = await send(reactor, backend(reactor, cert, port, mode="starttls"))
    assert outcome.kind is Kind.REJECTED_BACKEND and "STARTTLS" in outcome.cause
    assert "MAIL" not in state.commands


@pytest_twisted.ensureDeferred
async def test_wrong_credentials_are_backend_scoped(reactor, cert, server):
    state = ServerState(starttls=True, auth=("PLAIN",), credentials=("u", "p"))
    port = server(state)
    outcome = await send(reactor, backend(reactor, cert, port, user="u", password="wrong"))
    assert outcome.kind is Kind.REJECTED_BACKEND and "wrong" not in outcome.cause


@pytest_twisted.ensureDeferred
async def test_server_without_auth(reactor, cert, server):
    state = ServerState(starttls=True)
    port = server(state)
    outcome = await send(reactor, backend(reactor, cert, port, user="u", password="p"))
    assert outcome.kind is Kind.REJECTED_BACKEND and "AUTH" in outcome.cause


@pytest_twisted.ensureDeferred
async def test_any_rejected_rcpt_aborts_before_data(reactor, cert, server):
    state = ServerState(script={"rcpt:bad@example.com": "550 5.1.1 no such user"})
    port = server(state)
    msg = message(to=[{"address": "good@example.com"}, {"address": "bad@example.com"}])
    outcome = await send(reactor, backend(reactor, cert, port), msg)
    assert outcome.kind is Kind.REJECTED_MESSAGE and "5.1.1" in outcome.cause
    assert "DATA" not in state.commands and state.deliveries == []


@pytest_twisted.ensureDeferred
async def test_pipelined_rejected_rcpt_sends_no_content(reactor, cert, server):
    state = ServerState(pipelining=True, script={"rcpt:bad@example.com": "550 5.1.1 no such user"})
    port = server(state)
    msg = message(to=[{"address": "good@example.com"}, {"address": "bad@example.com"}])
    outcome = await send(reactor, backend(reactor, cert, port), msg)
    assert outcome.kind is Kind.REJECTED_MESSAGE and "5.1.1" in outcome.cause
    await _until(reactor, lambda: state.disconnects >= 1)
    assert state.deliveries == [] and state.content_lines == 0
    assert state.commands[-4:] == ["MAIL", "RCPT", "RCPT", "DATA"]


@pytest_twisted.ensureDeferred
async def test_pipelined_delivery(reactor, cert, server):
    state = ServerState(pipelining=True)
    port = server(state)
    msg = message(to=[{"address": "a@example.com"}], cc=[{"address": "b@example.com"}])
    assert (await send(reactor, backend(reactor, cert, port), msg)).is_accepted
    assert state.deliveries[0].rcpt_to == ["a@example.com", "b@example.com"]


REPLIES = [
    ({"greeting": "554 no SMTP service"}, Kind.REJECTED_BACKEND),
    ({"greeting": "421 4.3.2 try later"}, Kind.TRANSIENT),
    ({"ehlo": "421 4.3.2 closing"}, Kind.TRANSIENT),
    ({"mail": "550 5.7.1 relay denied"}, Kind.REJECTED_BACKEND),
    ({"mail": "552 5.3.4 message too big"}, Kind.REJECTED_MESSAGE),
    ({"mail": "530 5.7.0 authentication required"}, Kind.REJECTED_BACKEND),
    ({"mail": "451 4.3.0 local error"}, Kind.TRANSIENT),
    ({"rcpt": "550 5.1.1 unknown user"}, Kind.REJECTED_MESSAGE),
    ({"rcpt": "550 5.1.8 bad sender domain"}, Kind.REJECTED_BACKEND),
    ({"rcpt": "552 5.2.2 mailbox full"}, Kind.TRANSIENT),
    ({"rcpt": "452 4.5.3 too many recipients"}, Kind.TRANSIENT),
    ({"rcpt": "550 5.7.1 relaying denied"}, Kind.REJECTED_UNSCOPED),
    ({"rcpt": "550 5.4.1 recipient rejected"}, Kind.REJECTED_UNSCOPED),
    ({"rcpt": "553 sorry, no"}, Kind.REJECTED_UNSCOPED),
    ({"data": "554 5.6.0 content rejected"}, Kind.REJECTED_MESSAGE),
    ({"data": "554 transaction failed"}, Kind.REJECTED_UNSCOPED),
    ({"dot": "554 5.7.1 spam"}, Kind.REJECTED_UNSCOPED),
    ({"dot": "552 5.3.4 too big"}, Kind.REJECTED_MESSAGE),
    ({"dot": "451 4.7.1 greylisted"}, Kind.TRANSIENT),
    ({"dot": "250 2.0.0 ok"}, Kind.ACCEPTED),
    ({"greeting": "drop"}, Kind.TRANSIENT),
    ({"mail": "drop"}, Kind.TRANSIENT),
    ({"dot": "drop"}, Kind.UNKNOWN),
]


@pytest.mark.parametrize("pipelining", [False, True], ids=["lockstep", "pipelined"])
@pytest.mark.parametrize("script,kind", REPLIES, ids=[str(s) for s, _ in REPLIES])
@pytest_twisted.ensureDeferred
async def test_reply_classification(reactor, cert, server, script, kind, pipelining):
    state = ServerState(script=script, pipelining=pipelining)
    port = server(state)
    outcome = await send(reactor, backend(reactor, cert, port))
    assert outcome.kind is kind, outcome.cause


@pytest.mark.parametrize(
    "script,kind",
    [
        ({"rcpt": "552 too many recipients"}, Kind.TRANSIENT),
        ({"rcpt": "550 mailbox unavailable"}, Kind.REJECTED_UNSCOPED),
        ({"dot": "554 5.7.1 go away"}, Kind.REJECTED_UNSCOPED),
    ],
)
@pytest_twisted.ensureDeferred
async def test_classification_without_enhanced_codes(reactor, cert, server, script, kind):
    state = ServerState(script=script, enhanced=False)
    port = server(state)
    assert (await send(reactor, backend(reactor, cert, port))).kind is kind


@pytest_twisted.ensureDeferred
async def test_drop_during_content_is_transient(reactor, cert, server):
    # Big enough that the server hangs up long before the client could have
    # handed the terminating dot to its transport.
    state = ServerState(script={"content": "drop"})
    port = server(state)
    msg = message(textBody="y" * (24 * 1024 * 1024))
    outcome = await send(reactor, backend(reactor, cert, port), msg)
    assert outcome.kind is Kind.TRANSIENT, outcome.cause


@pytest_twisted.ensureDeferred
async def test_connection_refused_is_transient(reactor, cert, server):
    server(ServerState())
    # Find a closed port: start and stop a listener.
    from twisted.internet.protocol import Factory

    p = reactor.listenTCP(0, Factory(), interface="127.0.0.1")
    closed = p.getHost().port
    await p.stopListening()
    outcome = await send(reactor, backend(reactor, cert, closed))
    assert outcome.kind is Kind.TRANSIENT and "cannot connect" in outcome.cause


@pytest_twisted.ensureDeferred
async def test_cancel_after_dot_is_unknown_and_before_is_transient(reactor, cert, server):
    hang_after = ServerState(script={"dot": "hang"})
    port = server(hang_after)
    b = backend(reactor, cert, port)
    d = Deferred.fromCoroutine(send(reactor, b))
    await _until(reactor, lambda: hang_after.dot_received)
    d.cancel()
    assert (await d).kind is Kind.UNKNOWN

    hang_before = ServerState(script={"greeting": "220-still greeting"})
    port = server(hang_before)
    d = Deferred.fromCoroutine(send(reactor, backend(reactor, cert, port)))
    await _tick(reactor)
    d.cancel()
    assert (await d).kind is Kind.TRANSIENT


@pytest_twisted.ensureDeferred
async def test_deadline_already_past_does_not_dial(reactor, cert):
    b = backend(reactor, cert, 1)
    outcome = await b.send(message(), deadline=reactor.seconds() - 1)
    assert outcome.kind is Kind.TRANSIENT


@pytest_twisted.ensureDeferred
async def test_non_ascii_envelope_address_is_backend_scoped(reactor, cert):
    msg = message(to=[{"address": "jörg@example.com"}])
    outcome = await send(reactor, backend(reactor, cert, 1), msg)
    assert outcome.kind is Kind.REJECTED_BACKEND and "SMTPUTF8" in outcome.cause


async def _until(reactor, condition, limit: int = 1000):
    """Let the reactor run until ``condition()`` holds (bounded)."""
    for _ in range(limit):
        if condition():
            return
        await _tick(reactor)
    raise AssertionError("condition not reached")


async def _tick(reactor):
    d = Deferred()
    reactor.callLater(0.01, d.callback, None)
    await d


def test_dot_stuffing():
    assert dot_stuff(b".a\r\nb\r\n.\r\n") == b"..a\r\nb\r\n..\r\n.\r\n"
    assert dot_stuff(b"x") == b"x\r\n.\r\n"


def test_classify_reply_non_smtp_code():
    assert classify_reply("dot", 999, "").kind is Kind.UNKNOWN
    assert classify_reply("rcpt", 999, "").kind is Kind.TRANSIENT


@pytest.mark.parametrize(
    "options,mode",
    [
        ({}, "plain"),
        ({"protocol": "SSL"}, "ssl"),
        ({"protocol": "smtps"}, "ssl"),
        ({"protocol": "tls"}, "starttls"),
        ({"protocol": "starttls"}, "starttls"),
        ({"protocol": "tls", "port": "465"}, "ssl"),
        ({"protocol": "none"}, "plain"),
    ],
)
def test_protocol_modes(options, mode):
    b = build(BackendEntry("k", "smtp", 1, options), reactor=None)
    assert b.cfg.mode == mode


def test_bracketed_ipv6_host():
    b = build(BackendEntry("k", "smtp", 1, {"host": "[::1]"}), reactor=None)
    assert b.cfg.host == "::1"


@pytest.mark.parametrize(
    "options,field",
    [
        ({"protocol": "tlsv2"}, "protocol"),
        ({"port": "abc"}, "port"),
        ({"port": "0"}, "port"),
        ({"tls-insecure": "maybe"}, "tls-insecure"),
    ],
)
def test_bad_options_name_the_entry_and_field(options, field):
    from gorge.config import ConfigError

    with pytest.raises(ConfigError) as e:
        build(BackendEntry("primary", "smtp", 1, options), reactor=None)
    assert e.value.setting == f"GORGE_MAILER_CONFIG [primary].{field}"


# --- the HTTP answers through the real site -------------------------


@pytest.mark.parametrize(
    "script,status,code",
    [
        ({}, 200, None),
        ({"rcpt": "550 5.1.1 unknown user"}, 422, "ERR_PERMANENT_FAILURE"),
        ({"rcpt": "550 5.7.1 denied"}, 422, "ERR_PERMANENT_FAILURE"),
        ({"mail": "550 5.7.1 relay denied"}, 502, "ERR_SEND_FAILED"),
        ({"rcpt": "450 4.2.1 try later"}, 502, "ERR_SEND_FAILED"),
        ({"dot": "drop"}, 502, "ERR_OUTCOME_UNKNOWN"),
        ({"greeting": "drop"}, 502, "ERR_SEND_FAILED"),
        ({"data": "drop"}, 502, "ERR_SEND_FAILED"),
        ({"dot": "554 5.6.0 content refused"}, 422, "ERR_PERMANENT_FAILURE"),
        ({"dot": "451 4.3.0 try again"}, 502, "ERR_SEND_FAILED"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_http_answer_through_the_site(reactor, cert, server, script, status, code):
    state = ServerState(script=script)
    port = server(state)
    mailers = [
        {
            "key": "relay",
            "type": "smtp",
            "options": {"host": "127.0.0.1", "port": port, "helo": "client.test"},
        }
    ]
    h = make_harness(
        {
            "GORGE_SERVICE_TOKEN": TOKEN,
            "GORGE_MAILER_MAX_RETRIES": "1",
            "GORGE_MAILER_RETRY_WAIT": "0",
            "GORGE_MAILER_CONFIG": json.dumps(mailers),
        },
        clock=reactor,
    )
    got_status, doc = await h.send()
    assert got_status == status
    if code is None:
        assert doc == {"data": {"mailerKey": "relay"}}
        assert len(state.deliveries) == 1
    else:
        assert doc["error"]["code"] == code and "data" not in doc
    # A transient answer was retried exactly once (MaxRetries=1).
    if status == 502 and code == "ERR_SEND_FAILED" and "rcpt" in script:
        assert state.commands.count("MAIL") == 2
    await h.service.stopService() if h.service.running else None


@pytest_twisted.ensureDeferred
async def test_starttls_with_untrusted_certificate_is_backend_scoped(reactor, server):
    other = make_certificate()
    state = ServerState(starttls=True)
    port = server(state)
    b = SmtpBackend(
        "smtp",
        1,
        SmtpConfig(host="127.0.0.1", port=port),
        reactor=reactor,
        trust_root=other.trust_root,
    )
    outcome = await send(reactor, b)
    assert outcome.kind is Kind.REJECTED_BACKEND and "TLS" in outcome.cause
    assert "MAIL" not in state.commands  # never fell back to plaintext


def test_no_credentials_over_plaintext_to_a_remote_host():
    from twisted.internet.testing import StringTransport

    from gorge.mailer.backends.smtp import _Session

    cfg = SmtpConfig(host="mail.example.com", user="u", password="secret")
    session = _Session(cfg, None, "a@b.c", ["d@e.f"], b"x")
    transport = StringTransport()
    session.makeConnection(transport)
    session.dataReceived(b"220 hi\r\n250-mail.example.com\r\n250 AUTH PLAIN LOGIN\r\n")
    outcome = session.done.result
    assert outcome.kind is Kind.REJECTED_BACKEND and "unencrypted" in outcome.cause
    assert b"AUTH" not in transport.value() and b"secret" not in transport.value()


@pytest_twisted.ensureDeferred
async def test_rejected_credentials_never_reach_logs_or_answers(reactor, cert, server):
    from twisted.logger import formatEvent

    state = ServerState(starttls=True, auth=("PLAIN",), credentials=("u", "right"))
    port = server(state)
    mailers = [
        {
            "key": "relay",
            "type": "smtp",
            "options": {
                "host": "127.0.0.1",
                "port": port,
                "user": "u",
                "password": "hunter2-secret",
                "tls-insecure": True,
            },
        }
    ]
    with logged_events() as observer:
        h = make_harness(
            {
                "GORGE_SERVICE_TOKEN": TOKEN,
                "GORGE_MAILER_MAX_RETRIES": "0",
                "GORGE_MAILER_CONFIG": json.dumps(mailers),
            },
            clock=reactor,
        )
        status, doc = await h.send()
    assert status == 502 and doc["error"]["code"] == "ERR_SEND_FAILED"
    assert "535" in doc["error"]["message"] and "hunter2" not in json.dumps(doc)
    logged = " ".join(formatEvent(e) + repr(e) for e in observer)
    assert "MAILER_SEND_FAILED" in logged and "hunter2" not in logged


@pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning")
@pytest.mark.parametrize("implicit_tls", [False, True])
@pytest_twisted.ensureDeferred
async def test_certificate_for_another_host_is_backend_scoped(reactor, implicit_tls):
    # A verification failure (here a trusted certificate naming some
    # other host, which Twisted reports through service_identity rather than
    # as an OpenSSL error) is REJECTED_BACKEND, like an untrusted one -- not
    # a transient "connection lost" that would be retried on the same relay.
    other = make_certificate(names=("mail.elsewhere.test",), ips=())
    state = ServerState(starttls=True)
    state.tls_options = other.server_options
    factory = ScriptedFactory(state, implicit_tls)
    if implicit_tls:
        port = reactor.listenSSL(0, factory, other.server_options, interface="127.0.0.1")
    else:
        port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    try:
        mode = "ssl" if implicit_tls else "starttls"
        b = SmtpBackend(
            "smtp",
            1,
            SmtpConfig(host="127.0.0.1", port=port.getHost().port, mode=mode),
            reactor=reactor,
            trust_root=other.trust_root,
        )
        outcome = await send(reactor, b)
    finally:
        await port.stopListening()
    assert outcome.kind is Kind.REJECTED_BACKEND and "TLS" in outcome.cause
    assert state.deliveries == [] and "MAIL" not in state.commands
