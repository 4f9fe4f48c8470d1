"""The smtp backend's client as a subclass of twisted.mail's ESMTPClient:
the overrides it relies on, driven over an in-memory transport, and the
envelope as it reaches a real server."""

from __future__ import annotations

import base64
import inspect

import pytest
import pytest_twisted
from twisted.internet.testing import StringTransport
from twisted.mail.smtp import ESMTPClient

from gorge.mailer.backends.smtp import SmtpBackend, SmtpConfig, _Session
from gorge.mailer.outcome import Kind
from tests.mailer.conftest import parsed_message
from tests.mailer.smtpserver import ScriptedFactory, ServerState


class StartTLSTransport(StringTransport):
    """Records the STARTTLS upgrade instead of performing one."""

    tls_options = None

    def startTLS(self, options) -> None:
        self.tls_options = options


def _hooks() -> list[str]:
    own = vars(_Session)
    return [
        name
        for name in own
        if inspect.isfunction(own[name]) and not name.startswith("_") and hasattr(ESMTPClient, name)
    ]


def test_every_stock_hook_the_session_overrides_still_exists():
    # The classification lives in overrides of ESMTPClient's state methods;
    # one renamed in a new Twisted would silently fall back to the stock
    # behaviour (DATA after a rejected RCPT, a second AUTH PLAIN, ...).
    expected = {
        "connectionMade",
        "connectionLost",
        "lineReceived",
        "lineLengthExceeded",
        "sendLine",
        "sendError",
        "smtpConnectionFailed",
        "esmtpEHLORequired",
        "smtpState_helo",
        "tryTLS",
        "esmtpTLSRequired",
        "esmtpTLSFailed",
        "esmtpState_starttls",
        "authenticate",
        "smtpState_toOrData",
        "smtpTransferFailed",
        "getMailFrom",
        "getMailTo",
        "getMailData",
        "smtpState_data",
        "transformChunk",
        "finishedFileTransfer",
        "smtpState_msgSent",
    }
    missing = sorted(name for name in expected if not hasattr(ESMTPClient, name))
    assert missing == [], f"twisted.mail.smtp.ESMTPClient no longer has {missing}"
    assert set(_hooks()) == expected


def _session(**cfg) -> tuple[_Session, StartTLSTransport]:
    session = _Session(SmtpConfig(**cfg), object(), "a@example.com", ["d@example.com"], b"x")
    transport = StartTLSTransport()
    session.makeConnection(transport)
    return session, transport


def _take(transport: StringTransport) -> bytes:
    value = transport.value()
    transport.clear()
    return value


def test_auth_plain_first_after_starttls_to_a_remote_host_and_a_rejection_is_final():
    session, transport = _session(host="mail.example.com", user="u", password="p", mode="starttls")
    session.dataReceived(b"220 hi\r\n")
    assert _take(transport) == b"EHLO localhost\r\n"
    session.dataReceived(b"250-mx\r\n250-STARTTLS\r\n250 AUTH CRAM-MD5 LOGIN PLAIN\r\n")
    assert _take(transport) == b"STARTTLS\r\n"
    session.dataReceived(b"220 go ahead\r\n")
    assert transport.tls_options is not None
    assert _take(transport) == b"EHLO localhost\r\n"
    session.dataReceived(b"250-mx\r\n250 AUTH CRAM-MD5 LOGIN PLAIN\r\n")
    # PLAIN although CRAM-MD5 and LOGIN come first; no authorization identity.
    assert _take(transport) == b"AUTH PLAIN " + base64.b64encode(b"\0u\0p") + b"\r\n"
    session.dataReceived(b"535 5.7.8 bad credentials\r\n")
    outcome = session.done.result
    assert outcome.kind is Kind.REJECTED_BACKEND and "535" in outcome.cause
    # The stock client would offer the credentials again in another form.
    assert b"AUTH" not in transport.value()


def test_an_empty_password_is_still_offered():
    session, transport = _session(host="127.0.0.1", user="u", password="")
    session.dataReceived(b"220 hi\r\n250-mx\r\n250 AUTH PLAIN\r\n")
    assert transport.value().endswith(b"AUTH PLAIN " + base64.b64encode(b"\0u\0") + b"\r\n")


def test_auth_login_gives_up_after_the_password():
    session, transport = _session(host="127.0.0.1", user="u", password="p")
    session.dataReceived(b"220 hi\r\n250-mx\r\n250 AUTH LOGIN\r\n")
    assert _take(transport).endswith(b"AUTH LOGIN\r\n")
    session.dataReceived(b"334 VXNlcm5hbWU6\r\n334 UGFzc3dvcmQ6\r\n")
    assert _take(transport) == base64.b64encode(b"u") + b"\r\n" + base64.b64encode(b"p") + b"\r\n"
    session.dataReceived(b"334 UGFzc3dvcmQ6\r\n")
    assert session.done.result.kind is Kind.TRANSIENT
    assert b"cA==" not in transport.value()  # the password is not sent again


@pytest.mark.parametrize("pipelining", [False, True], ids=["lockstep", "pipelined"])
@pytest_twisted.ensureDeferred
async def test_envelope_addresses_go_out_verbatim(pipelining):
    # twisted.mail's quoteaddr would re-parse "a,b@example.com" into "<a>".
    from twisted.internet import reactor

    state = ServerState(pipelining=pipelining)
    port = reactor.listenTCP(0, ScriptedFactory(state), interface="127.0.0.1")
    try:
        backend = SmtpBackend(
            "smtp", 1, SmtpConfig(host="127.0.0.1", port=port.getHost().port), reactor=reactor
        )
        message = parsed_message(
            **{"from": {"address": "x(y)@example.com"}, "to": [{"address": "a,b@example.com"}]}
        )
        outcome = await backend.send(message, deadline=reactor.seconds() + 10)
    finally:
        await port.stopListening()
    assert outcome.kind is Kind.ACCEPTED, outcome.cause
    [delivery] = state.deliveries
    assert delivery.mail_from == "x(y)@example.com"
    assert delivery.rcpt_to == ["a,b@example.com"]
