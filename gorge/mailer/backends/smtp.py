"""The ``smtp`` backend (spec/mailer.md §10.2).

A small SMTP client state machine on ``LineReceiver`` instead of
``twisted.mail.smtp.ESMTPSender``: the classification needs the stage of
every reply, the moment the terminating dot is handed to the transport, an
abort on the first rejected RCPT, PLAIN-then-LOGIN authentication and a
cancel that always yields a classified outcome -- each an override of the
stock client (spec §15), and together its whole control flow.
"""

from __future__ import annotations

import base64
import ipaddress
import re
import socket
from dataclasses import dataclass, field
from io import BytesIO
from typing import Any

from OpenSSL import SSL
from twisted.internet import ssl
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import ClientFactory
from twisted.protocols.basic import FileSender, LineReceiver
from twisted.python.failure import Failure

from ..message import Message
from ..mime import build_mime
from ..outcome import Outcome
from .base import BackendEntry

ATTEMPT_CAP = 60.0
CONNECT_CAP = 30.0
PROTOCOLS = ("", "none", "plain", "ssl", "smtps", "tls", "starttls")

_ENHANCED = re.compile(r"^([245])\.(\d{1,3})\.(\d{1,3})(?:\s|$)")
_BACKEND_ENHANCED = {(1, 7), (1, 8), (7, 4), (7, 8), (7, 9), (7, 10), (7, 11)}
_STAGE_NAMES = {
    "greeting": "greeting", "ehlo": "EHLO", "helo": "HELO", "starttls": "STARTTLS",
    "tls-ehlo": "EHLO after STARTTLS", "auth": "AUTH", "mail": "MAIL FROM",
    "rcpt": "RCPT TO", "data": "DATA", "content": "message content",
    "dot": "end of DATA",
}


@dataclass(frozen=True)
class SmtpConfig:
    host: str = "localhost"
    port: int = 25
    user: str = ""
    password: str = field(default="", repr=False)
    #: "plain" (opportunistic STARTTLS), "starttls" (required) or "ssl" (implicit).
    mode: str = "plain"
    helo: str = "localhost"
    insecure: bool = False


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_tls_failure(reason: Failure) -> bool:
    """An OpenSSL error, or a certificate that verified but names another
    host: Twisted reports the latter with service_identity's exceptions."""
    return bool(reason.check(SSL.Error)) or type(reason.value).__module__.startswith(
        "service_identity")


def enhanced_code(text: str) -> tuple[int, int, int] | None:
    """The RFC 3463 code at the start of a reply text, if any."""
    m = _ENHANCED.match(text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def classify_reply(stage: str, code: int, text: str) -> Outcome:
    """Outcome of a non-2xx reply at ``stage`` (§10.2 table, top to bottom).

    ``stage`` is one of greeting, ehlo, helo, starttls, tls-ehlo, auth,
    mail, rcpt, data, dot."""
    where = _STAGE_NAMES.get(stage, stage)
    cause = f"smtp: {where}: {code} {text}".rstrip()
    after_dot = stage == "dot"
    if not 400 <= code < 600:
        return (Outcome.unknown if after_dot else Outcome.transient)(
            f"smtp: {where}: unexpected reply {code}")
    if code < 500:
        return Outcome.transient(cause)
    if code == 530:
        return Outcome.rejected_backend(cause)
    if stage in ("greeting", "ehlo", "helo", "starttls", "tls-ehlo", "auth"):
        return Outcome.rejected_backend(cause)
    enhanced = enhanced_code(text)
    if enhanced is not None and enhanced[0] != 5:
        enhanced = None
    sub = enhanced[1:] if enhanced is not None else None
    if stage == "mail":
        if sub == (3, 4):
            return Outcome.rejected_message(cause)
        return Outcome.rejected_backend(cause)
    if (code == 552 and sub is None and stage == "rcpt") or sub == (5, 3):
        return Outcome.transient(cause)
    if sub == (2, 2):
        return Outcome.transient(cause)
    if sub is not None:
        subject, detail = sub
        if subject == 1 and detail not in (7, 8):
            return Outcome.rejected_message(cause)
        if subject == 2 or sub == (3, 4) or subject == 6:
            return Outcome.rejected_message(cause)
        if sub in _BACKEND_ENHANCED:
            return Outcome.rejected_backend(cause)
    return Outcome.rejected_unscoped(cause)


def dot_stuff(data: bytes, *, terminate: bool = True) -> bytes:
    """Dot-stuffed DATA content ending in CRLF, followed by the terminating
    ``.\\r\\n`` unless ``terminate`` is false. ``data`` must already use CRLF
    line ends only, as :func:`gorge.mailer.mime.build_mime` guarantees."""
    if data.startswith(b"."):
        data = b"." + data
    data = data.replace(b"\r\n.", b"\r\n..")
    if not data.endswith(b"\r\n"):
        data += b"\r\n"
    return data + b".\r\n" if terminate else data


def stuff_mime(data: bytes) -> bytes:
    """:func:`dot_stuff` (without the dot) for :func:`build_mime` output.

    Only the top header block can hold a line starting with ``.`` (a custom
    header name may); below it every line is a boundary, one of our part
    headers or base64, none of which can. Stuffing just the head spares a
    scan of a multi-megabyte body."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return dot_stuff(data, terminate=False)
    head = dot_stuff(data[: end + 2], terminate=False)
    body = data[end + 2 :]
    return head + (body if body.endswith(b"\r\n") else body + b"\r\n")


class _ContentSender(FileSender):
    # The transport pulls the next chunk only once it flushed the previous
    # one; large chunks keep a 1 MiB message to a handful of reactor turns.
    CHUNK_SIZE = 256 * 1024


class _Session(LineReceiver):
    """One SMTP transaction. ``done`` fires with an :class:`Outcome`."""

    delimiter = b"\r\n"
    MAX_LENGTH = 65536

    def __init__(self, cfg: SmtpConfig, tls: Any, sender: str, recipients: list[str],
                 content: bytes) -> None:
        self.cfg = cfg
        self.tls_options = tls
        self.sender = sender
        self.recipients = recipients
        self.content = content
        self.done: Deferred = Deferred(lambda _: self.abort("cancelled"))
        self.stage = "connect" if cfg.mode != "ssl" else "tls-connect"
        self.dot_sent = False
        self.pipelined = False
        self.secure = cfg.mode == "ssl"
        self.extensions: dict[str, str] = {}
        self._lines: list[str] = []
        self._rcpt_index = 0
        self._login_step = 0
        self.connector: Any = None

    # --- plumbing -------------------------------------------------------
    def connectionMade(self) -> None:
        self.stage = "greeting"
        # SMTP is lock-step; Nagle would hold each short command (and the
        # final dot behind the content) until the previous segment's ACK.
        try:
            self.transport.setTcpNoDelay(True)
        except (AttributeError, OSError):
            pass

    def finish(self, outcome: Outcome) -> None:
        if self.done.called:
            return
        self.done.callback(outcome)
        if self.transport is not None and self.connected:
            # A verdict came back (or the peer broke the protocol): leave
            # politely. QUIT failures after acceptance no longer matter.
            # After a pipelined DATA the server may be reading content, so
            # a failure there just hangs up: without the dot nothing is sent.
            if outcome.is_accepted or not self.pipelined:
                self.sendLine(b"QUIT")
            self.transport.loseConnection()

    def abort(self, why: str) -> None:
        """Deadline or cancel: classify by how far we got, then hang up."""
        if self.done.called:
            return
        if self.dot_sent:
            outcome = Outcome.unknown(f"smtp: {why} after the message was sent, no reply")
        else:
            outcome = Outcome.transient(f"smtp: {why} during {self._where()}")
        self.done.callback(outcome)
        if self.transport is not None:
            self.transport.abortConnection()
        elif self.connector is not None:
            self.connector.disconnect()

    def _where(self) -> str:
        return _STAGE_NAMES.get(self.stage, self.stage)

    def connectionLost(self, reason: Failure = Failure(ConnectionDone())) -> None:
        self.connected = False
        if self.done.called:
            return
        if _is_tls_failure(reason) and self.stage in ("tls-connect", "greeting", "tls-ehlo"):
            self.finish(Outcome.rejected_backend(f"smtp: TLS handshake failed ({self._where()})"))
        elif self.dot_sent:
            self.finish(Outcome.unknown("smtp: connection lost after the message was sent"))
        else:
            self.finish(Outcome.transient(f"smtp: connection lost during {self._where()}"))

    def connectFailed(self, reason: Failure) -> None:
        self.finish(Outcome.transient(f"smtp: cannot connect to {self.cfg.host}:{self.cfg.port}"
                                      f" ({reason.type.__name__})"))

    def send(self, line: str) -> None:
        self.sendLine(line.encode("utf-8"))

    def lineReceived(self, line: bytes) -> None:
        if self.done.called:
            return
        text = line.decode("utf-8", "replace")
        code_text, sep, rest = text[:3], text[3:4], text[4:]
        if not code_text.isdigit() or sep not in ("-", " ", ""):
            outcome = Outcome.unknown if self.dot_sent else Outcome.transient
            self.finish(outcome(f"smtp: {self._where()}: malformed reply"))
            return
        self._lines.append(rest)
        if sep == "-":
            return
        lines, self._lines = self._lines, []
        getattr(self, "on_" + self.stage.replace("-", "_"))(int(code_text), lines)

    def lineLengthExceeded(self, line: bytes) -> None:
        outcome = Outcome.unknown if self.dot_sent else Outcome.transient
        self.finish(outcome(f"smtp: {self._where()}: reply line too long"))

    def fail_reply(self, code: int, lines: list[str]) -> None:
        self.finish(classify_reply(self.stage, code, " ".join(lines)[:300]))

    # --- states ---------------------------------------------------------
    def on_greeting(self, code: int, lines: list[str]) -> None:
        if code // 100 != 2:
            return self.fail_reply(code, lines)
        self.stage = "ehlo"
        self.send(f"EHLO {self.cfg.helo}")

    def on_ehlo(self, code: int, lines: list[str]) -> None:
        if code // 100 == 5 and not self.cfg.user and self.cfg.mode == "plain":
            self.stage = "helo"
            self.send(f"HELO {self.cfg.helo}")
            return
        if code // 100 != 2:
            return self.fail_reply(code, lines)
        self.extensions = {}
        for item in lines[1:]:
            word, _, params = item.partition(" ")
            self.extensions[word.upper()] = params.upper()
        if not self.secure and self.cfg.mode in ("plain", "starttls"):
            if "STARTTLS" in self.extensions:
                self.stage = "starttls"
                self.send("STARTTLS")
                return
            if self.cfg.mode == "starttls":
                return self.finish(Outcome.rejected_backend(
                    "smtp: STARTTLS required but not offered by the server"))
        self.authenticate()

    on_tls_ehlo = on_ehlo

    def on_helo(self, code: int, lines: list[str]) -> None:
        if code // 100 != 2:
            return self.fail_reply(code, lines)
        self.mail_from()

    def on_starttls(self, code: int, lines: list[str]) -> None:
        if code != 220:
            return self.fail_reply(code, lines)
        self.transport.startTLS(self.tls_options)
        self.secure = True
        self.stage = "tls-ehlo"
        self.send(f"EHLO {self.cfg.helo}")

    def authenticate(self) -> None:
        cfg = self.cfg
        if not cfg.user:
            return self.mail_from()
        if not self.secure and not _is_loopback(cfg.host):
            return self.finish(Outcome.rejected_backend(
                "smtp: refusing to send credentials over an unencrypted connection"))
        mechanisms = self.extensions.get("AUTH", "").split()
        self.stage = "auth"
        if "PLAIN" in mechanisms:
            token = f"\0{cfg.user}\0{cfg.password}".encode("utf-8")
            self.send("AUTH PLAIN " + base64.b64encode(token).decode("ascii"))
        elif "LOGIN" in mechanisms:
            self._login_step = 1
            self.send("AUTH LOGIN")
        elif "AUTH" not in self.extensions:
            self.finish(Outcome.rejected_backend("smtp: server does not offer AUTH"))
        else:
            self.finish(Outcome.rejected_backend(
                "smtp: no supported AUTH mechanism (PLAIN, LOGIN) offered"))

    def on_auth(self, code: int, lines: list[str]) -> None:
        if code == 334 and self._login_step in (1, 2):
            value = self.cfg.user if self._login_step == 1 else self.cfg.password
            self._login_step += 1
            self.sendLine(base64.b64encode(value.encode("utf-8")))
            return
        if code // 100 != 2:
            return self.fail_reply(code, lines)
        self.mail_from()

    def mail_from(self) -> None:
        self.stage = "mail"
        if "PIPELINING" in self.extensions:
            # RFC 2920: MAIL, every RCPT and DATA in one write; the replies
            # still arrive one per command, in order, and are classified
            # exactly as in lock-step mode.
            self.pipelined = True
            commands = [f"MAIL FROM:<{self.sender}>"]
            commands += [f"RCPT TO:<{r}>" for r in self.recipients]
            commands.append("DATA")
            self.transport.write("".join(c + "\r\n" for c in commands).encode("utf-8"))
            return
        self.send(f"MAIL FROM:<{self.sender}>")

    def on_mail(self, code: int, lines: list[str]) -> None:
        if code // 100 != 2:
            return self.fail_reply(code, lines)
        self.stage = "rcpt"
        if not self.pipelined:
            self.send(f"RCPT TO:<{self.recipients[0]}>")

    def on_rcpt(self, code: int, lines: list[str]) -> None:
        # Any rejected recipient ends the transaction before the content
        # (§10.2); pipelined, DATA may already be out, but no content or
        # dot ever follows, so nothing can be delivered.
        if code // 100 != 2:
            return self.fail_reply(code, lines)
        self._rcpt_index += 1
        if self._rcpt_index < len(self.recipients):
            if not self.pipelined:
                self.send(f"RCPT TO:<{self.recipients[self._rcpt_index]}>")
            return
        self.stage = "data"
        if not self.pipelined:
            self.send("DATA")

    def on_data(self, code: int, lines: list[str]) -> None:
        if code != 354:
            return self.fail_reply(code, lines)
        content = stuff_mime(self.content)
        if len(content) <= _ContentSender.CHUNK_SIZE:
            # Small enough to hand over at once: content and dot together.
            self.stage = "dot"
            self.transport.write(content + b".\r\n")
            self.dot_sent = True
            return
        self.stage = "content"
        # Stream the content (the transport pulls as its buffer drains) and
        # hand over the terminating dot only once all of it was taken: a
        # connection lost before that provably delivered nothing.
        sender = _ContentSender()
        d = sender.beginFileTransfer(BytesIO(content), self.transport)
        d.addCallbacks(self._content_sent, lambda _: None)

    def on_content(self, code: int, lines: list[str]) -> None:
        # The server answered before our terminating dot (typically an
        # error followed by a hang-up): nothing was accepted.
        self.stage = "data"
        self.fail_reply(code, lines)

    def _content_sent(self, _: object) -> None:
        if self.done.called or not self.connected:
            return
        self.stage = "dot"
        self.transport.write(b".\r\n")
        # From here on the server may have the whole message: no verdict
        # means "outcome unknown", never "safe to resend".
        self.dot_sent = True

    def on_dot(self, code: int, lines: list[str]) -> None:
        if code // 100 != 2:
            return self.fail_reply(code, lines)
        self.finish(Outcome.accepted(""))


class _Factory(ClientFactory):
    noisy = False

    def __init__(self, session: _Session) -> None:
        self.session = session

    def buildProtocol(self, addr):
        self.session.factory = self
        return self.session

    def clientConnectionFailed(self, connector, reason: Failure) -> None:
        self.session.connectFailed(reason)


class SmtpBackend:
    type = "smtp"

    def __init__(self, key: str, priority: int, cfg: SmtpConfig, *, reactor: Any,
                 trust_root: Any = None) -> None:
        self.key = key
        self.priority = priority
        self.cfg = cfg
        self._reactor = reactor
        if cfg.insecure:
            self._tls = ssl.CertificateOptions(verify=False,
                                               raiseMinimumTo=ssl.TLSVersion.TLSv1_2)
        else:
            self._tls = ssl.optionsForClientTLS(
                cfg.host, trustRoot=trust_root,
                extraCertificateOptions={"raiseMinimumTo": ssl.TLSVersion.TLSv1_2})

    async def send(self, message: Message, *, deadline: float) -> Outcome:
        clock = self._reactor
        now = clock.seconds()
        budget = min(ATTEMPT_CAP, deadline - now)
        if budget <= 0:
            return Outcome.transient("smtp: deadline reached before start")
        recipients = message.recipients()
        if not all(a.isascii() for a in [message.from_.address, *recipients]):
            return Outcome.rejected_backend(
                "smtp: non-ASCII address needs SMTPUTF8, which this backend does not speak")
        content = build_mime(message, now=now)
        session = _Session(self.cfg, self._tls, message.from_.address, recipients, content)
        factory = _Factory(session)
        cfg = self.cfg
        connect_timeout = max(1, int(min(CONNECT_CAP, budget)))
        if cfg.mode == "ssl":
            session.connector = self._reactor.connectSSL(cfg.host, cfg.port, factory, self._tls,
                                                         timeout=connect_timeout)
        else:
            session.connector = self._reactor.connectTCP(cfg.host, cfg.port, factory,
                                                         timeout=connect_timeout)
        timer = clock.callLater(budget, session.abort, "timeout")
        try:
            return await session.done
        finally:
            if timer.active():
                timer.cancel()


def parse_mode(entry: BackendEntry, port: int) -> str:
    protocol = entry.choice("protocol", "", PROTOCOLS)
    if protocol in ("ssl", "smtps"):
        return "ssl"
    if protocol in ("tls", "starttls"):
        # Old configs wrote "tls" for implicit TLS on the submissions port.
        return "ssl" if protocol == "tls" and port == 465 else "starttls"
    return "plain"


#: The option keys this backend reads; others are ignored (logged at debug).
OPTIONS = frozenset(("host", "port", "user", "password", "protocol", "helo", "tls-insecure"))


def build(entry: BackendEntry, *, reactor: Any, http_client: Any = None) -> SmtpBackend:
    port = entry.port("port", 25)
    host = entry.str("host", "localhost").strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]  # an IPv6 literal written as in a URL
    cfg = SmtpConfig(
        host=host,
        port=port,
        user=entry.str("user", ""),
        password=entry.str("password", ""),
        mode=parse_mode(entry, port),
        helo=entry.str("helo", "") or socket.gethostname() or "localhost",
        insecure=entry.bool("tls-insecure", False),
    )
    return SmtpBackend(entry.key, entry.priority, cfg, reactor=reactor)
