"""Interoperability: the smtp backend against twisted.mail's own ESMTP server
(an implementation we did not write) on 127.0.0.1:0: plain, STARTTLS and
AUTH PLAIN/LOGIN."""

from __future__ import annotations

import base64
import email
import email.policy

import pytest
import pytest_twisted
from twisted.cred.checkers import InMemoryUsernamePasswordDatabaseDontUse
from twisted.cred.portal import IRealm, Portal
from twisted.internet import defer
from twisted.internet.protocol import Factory
from twisted.mail import smtp
from twisted.mail.imap4 import LOGINCredentials, PLAINCredentials
from zope.interface import implementer

from gorge.mailer.backends.smtp import SmtpBackend, SmtpConfig
from gorge.mailer.outcome import Kind
from tests.mailer.conftest import parsed_message
from tests.mailer.smtpserver import make_certificate


@implementer(smtp.IMessage)
class Collect:
    def __init__(self, sink: list, envelope: dict) -> None:
        self.sink, self.envelope, self.lines = sink, envelope, []

    def lineReceived(self, line: bytes) -> None:
        self.lines.append(line)

    def eomReceived(self):
        self.sink.append((dict(self.envelope), b"\r\n".join(self.lines) + b"\r\n"))
        return defer.succeed(None)

    def connectionLost(self) -> None:
        pass


@implementer(smtp.IMessageDelivery)
class Delivery:
    def __init__(self, sink: list, user: bytes | None = None) -> None:
        self.sink, self.user, self.envelope = sink, user, {"to": []}

    def receivedHeader(self, helo, origin, recipients):
        return None

    def validateFrom(self, helo, origin):
        self.envelope.update({"from": str(origin), "helo": helo[0], "user": self.user})
        return origin

    def validateTo(self, user):
        if str(user.dest).startswith("reject"):
            raise smtp.SMTPBadRcpt(user)
        self.envelope["to"].append(str(user.dest))
        return lambda: Collect(self.sink, self.envelope)


@implementer(IRealm)
class Realm:
    def __init__(self, sink: list) -> None:
        self.sink = sink

    def requestAvatar(self, avatar_id, mind, *interfaces):
        return smtp.IMessageDelivery, Delivery(self.sink, avatar_id), lambda: None


class ServerFactory(Factory):
    def __init__(self, sink: list, tls=None, auth: bool = False) -> None:
        self.sink, self.tls, self.auth = sink, tls, auth

    def buildProtocol(self, addr):
        p = smtp.ESMTP(contextFactory=self.tls)
        p.host = b"twisted.test"
        p.factory = self
        if self.auth:
            checker = InMemoryUsernamePasswordDatabaseDontUse(u=b"p")
            p.portal = Portal(Realm(self.sink), [checker])
            p.challengers = {b"PLAIN": PLAINCredentials, b"LOGIN": LOGINCredentials}
        else:
            p.delivery = Delivery(self.sink)
            p.challengers = {}
        return p


@pytest.fixture(scope="module")
def cert():
    return make_certificate()


@pytest.fixture
def listen(cert):
    from twisted.internet import reactor

    ports = []

    def start(**kw) -> int:
        port = reactor.listenTCP(0, ServerFactory(**kw), interface="127.0.0.1")
        ports.append(port)
        return port.getHost().port

    yield start
    for port in ports:
        port.stopListening()


async def send(cert, port, overrides=None, **cfg):
    from twisted.internet import reactor

    message = parsed_message(**(overrides or {}))
    backend = SmtpBackend(
        "smtp",
        1,
        SmtpConfig(host="127.0.0.1", port=port, helo="client.test", **cfg),
        reactor=reactor,
        trust_root=cert.trust_root,
    )
    return await backend.send(message, deadline=reactor.seconds() + 10)


@pytest_twisted.ensureDeferred
async def test_plain_delivery(cert, listen):
    sink = []
    port = listen(sink=sink)
    payload = bytes(range(256)) * 10
    outcome = await send(
        cert,
        port,
        {
            "textBody": ".leading dot\n..two",
            "attachments": [{"filename": "b.bin", "data": base64.b64encode(payload).decode()}],
        },
    )
    assert outcome.kind is Kind.ACCEPTED
    [(envelope, data)] = sink
    assert envelope["from"] == "noreply@example.com" and envelope["to"] == ["alice@example.com"]
    assert envelope["helo"] == b"client.test"
    parsed = email.message_from_bytes(data, policy=email.policy.default)
    body, attachment = parsed.iter_parts()
    assert body.get_content() == ".leading dot\n..two"
    assert attachment.get_payload(decode=True) == payload


@pytest_twisted.ensureDeferred
async def test_starttls_and_auth_plain(cert, listen):
    sink = []
    port = listen(sink=sink, tls=cert.server_options, auth=True)
    outcome = await send(cert, port, mode="starttls", user="u", password="p")
    assert outcome.kind is Kind.ACCEPTED
    assert sink[0][0]["user"] == b"u"


@pytest_twisted.ensureDeferred
async def test_bad_password_is_backend_scoped(cert, listen):
    sink = []
    port = listen(sink=sink, tls=cert.server_options, auth=True)
    outcome = await send(cert, port, mode="starttls", user="u", password="nope")
    assert outcome.kind is Kind.REJECTED_BACKEND and sink == []


@pytest_twisted.ensureDeferred
async def test_rejected_recipient_aborts(cert, listen):
    sink = []
    port = listen(sink=sink)
    outcome = await send(
        cert, port, {"to": [{"address": "ok@example.com"}, {"address": "reject@example.com"}]}
    )
    # twisted.mail answers a bad recipient with a bare 550 (no enhanced code).
    assert outcome.kind is Kind.REJECTED_UNSCOPED and sink == []
