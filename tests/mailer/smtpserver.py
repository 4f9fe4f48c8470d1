"""A scripted ESMTP server on 127.0.0.1:0 for the smtp backend tests, and a
self-signed certificate made at test time.

Speaks enough SMTP for a real client: EHLO/HELO, STARTTLS, AUTH PLAIN and
LOGIN, MAIL, RCPT, DATA (dot-unstuffing), RSET, QUIT. ``script`` maps a
stage (greeting, ehlo, starttls, auth, mail, rcpt, data, dot) to a reply
line to send instead of the normal one, or to ``"drop"`` to close the
connection at that point. At ``dot`` also ``"hang"`` (never answer, nothing
delivered) and ``"hold"`` (the message is delivered, and the ``250`` waits
until ``ServerState.release`` fires: a server slower than its client).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

from twisted.internet import ssl
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory
from twisted.protocols.basic import LineReceiver

from tests.support.certs import self_signed


@dataclass
class Delivery:
    mail_from: str
    rcpt_to: list[str]
    data: bytes
    secure: bool
    auth: tuple[str, str] | None


@dataclass
class ServerState:
    script: dict[str, str] = field(default_factory=dict)
    starttls: bool = False
    auth: tuple[str, ...] = ()
    credentials: tuple[str, str] | None = None
    enhanced: bool = True
    pipelining: bool = False
    content_lines: int = 0
    dot_received: bool = False
    disconnects: int = 0
    deliveries: list[Delivery] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    tls_options: object = None
    #: What a "hold" at ``dot`` waits for; fire it to let the replies go.
    release: Deferred = field(default_factory=Deferred)
    #: Messages delivered whose reply is held.
    held: int = 0


class ScriptedSMTP(LineReceiver):
    delimiter = b"\r\n"
    MAX_LENGTH = 1 << 24

    def __init__(self, state: ServerState, implicit_tls: bool) -> None:
        self.state = state
        self.secure = implicit_tls
        self.in_data = False
        self.lines: list[bytes] = []
        self.mail_from = None
        self.rcpts: list[str] = []
        self.authed: tuple[str, str] | None = None
        self.login: list[str] | None = None

    def reply(self, stage: str, default: str) -> bool:
        """Send the scripted or default reply; False if the script dropped."""
        scripted = self.state.script.get(stage)
        if scripted == "drop":
            self.transport.loseConnection()
            return False
        self.sendLine((scripted or default).encode())
        return scripted is None or scripted.startswith(("2", "3"))

    def connectionMade(self) -> None:
        self.reply("greeting", "220 test.example ESMTP ready")

    def connectionLost(self, reason=None) -> None:
        self.state.disconnects += 1

    def lineReceived(self, line: bytes) -> None:
        if self.in_data:
            return self.data_line(line)
        if self.login is not None:
            return self.login_line(line)
        text = line.decode("utf-8", "replace")
        self.state.commands.append(
            text.split(" ")[0].upper() if not text.startswith("AUTH") else "AUTH"
        )
        verb, _, arg = text.partition(" ")
        verb = verb.upper()
        if verb == "EHLO":
            scripted = self.state.script.get("ehlo")
            if scripted:
                self.reply("ehlo", "")
                return
            caps = ["250-test.example"]
            if self.state.starttls and not self.secure:
                caps.append("250-STARTTLS")
            if self.state.auth:
                caps.append("250-AUTH " + " ".join(self.state.auth))
            if self.state.enhanced:
                caps.append("250-ENHANCEDSTATUSCODES")
            if self.state.pipelining:
                caps.append("250-PIPELINING")
            caps.append("250 8BITMIME")
            for c in caps:
                self.sendLine(c.encode())
        elif verb == "HELO":
            self.reply("helo", "250 test.example")
        elif verb == "STARTTLS":
            if self.reply("starttls", "220 2.0.0 go ahead"):
                self.transport.startTLS(self.state.tls_options)
                self.secure = True
        elif verb == "AUTH":
            mech, _, initial = arg.partition(" ")
            if mech.upper() == "PLAIN":
                _, user, password = base64.b64decode(initial).decode().split("\0")
                self.finish_auth(user, password)
            elif mech.upper() == "LOGIN":
                self.login = []
                self.sendLine(b"334 VXNlcm5hbWU6")
            else:
                self.sendLine(b"504 5.5.4 unrecognised mechanism")
        elif verb == "MAIL":
            if self.reply("mail", "250 2.1.0 ok"):
                self.mail_from = arg[len("FROM:") :].strip("<>")
        elif verb == "RCPT":
            address = arg[len("TO:") :].strip("<>")
            script = self.state.script.get("rcpt:" + address)
            if script:
                self.sendLine(script.encode())
                return
            if self.reply("rcpt", "250 2.1.5 ok"):
                self.rcpts.append(address)
        elif verb == "DATA":
            if self.reply("data", "354 end with <CRLF>.<CRLF>"):
                self.in_data = True
                self.lines = []
        elif verb == "RSET":
            self.sendLine(b"250 2.0.0 ok")
        elif verb == "QUIT":
            self.sendLine(b"221 2.0.0 bye")
            self.transport.loseConnection()
        else:
            self.sendLine(b"502 5.5.2 unknown command")

    def held_reply(self, passed: object) -> object:
        if self.connected:
            self.sendLine(b"250 2.0.0 queued")
        return passed

    def login_line(self, line: bytes) -> None:
        assert self.login is not None
        self.login.append(base64.b64decode(line).decode())
        if len(self.login) == 1:
            self.sendLine(b"334 UGFzc3dvcmQ6")
        else:
            user, password = self.login
            self.login = None
            self.finish_auth(user, password)

    def finish_auth(self, user: str, password: str) -> None:
        scripted = self.state.script.get("auth")
        if scripted:
            self.reply("auth", "")
            return
        if self.state.credentials == (user, password):
            self.authed = (user, password)
            self.sendLine(b"235 2.7.0 authenticated")
        else:
            self.sendLine(b"535 5.7.8 authentication credentials invalid")

    def data_line(self, line: bytes) -> None:
        if line == b".":
            self.in_data = False
            self.state.dot_received = True
            data = b"".join(line + b"\r\n" for line in self.lines)
            if self.state.script.get("dot") == "drop":
                self.transport.loseConnection()
                return
            if self.state.script.get("dot") == "hang":
                return
            if self.state.script.get("dot") == "hold":
                self.state.deliveries.append(
                    Delivery(self.mail_from or "", list(self.rcpts), data, self.secure, self.authed)
                )
                self.state.held += 1
                self.state.release.addCallback(self.held_reply)
                return
            scripted = self.state.script.get("dot")
            if scripted is None or scripted.startswith("2"):
                self.state.deliveries.append(
                    Delivery(self.mail_from or "", list(self.rcpts), data, self.secure, self.authed)
                )
            self.sendLine((scripted or "250 2.0.0 queued").encode())
            return
        if self.state.script.get("content") == "drop":
            self.transport.loseConnection()
            return
        self.state.content_lines += 1
        self.lines.append(line[1:] if line.startswith(b".") else line)


class ScriptedFactory(Factory):
    noisy = False

    def __init__(self, state: ServerState, implicit_tls: bool = False) -> None:
        self.state = state
        self.implicit_tls = implicit_tls

    def buildProtocol(self, addr):
        p = ScriptedSMTP(self.state, self.implicit_tls)
        p.factory = self
        return p


@dataclass(frozen=True)
class TestCertificate:
    __test__ = False
    server_options: object  # CertificateOptions for listenSSL/startTLS
    trust_root: object  # Certificate for optionsForClientTLS(trustRoot=...)
    pem: bytes


def make_certificate(
    names: tuple[str, ...] = ("localhost",), ips: tuple[str, ...] = ("127.0.0.1",)
) -> TestCertificate:
    key_pem, cert_pem = self_signed(names, ips)
    server = ssl.PrivateCertificate.loadPEM(cert_pem + key_pem)
    return TestCertificate(server.options(), ssl.Certificate.loadPEM(cert_pem), cert_pem)
