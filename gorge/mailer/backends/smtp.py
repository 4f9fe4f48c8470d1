"""The ``smtp`` backend: twisted.mail's ESMTP client with its replies classified.

``_Session`` is :class:`twisted.mail.smtp.ESMTPClient` with the overrides
the outcome classification needs (docs/mailer.md, Backends):

* every reply is classified with the stage it answers, which is the last
  command the client issued;
* a rejected RCPT ends the transaction before the content (the stock client
  sends DATA once any recipient was accepted);
* the moment the terminating dot is handed to the transport is recorded:
  from then on no verdict means "outcome unknown";
* AUTH PLAIN, else LOGIN (the stock order starts with CRAM-MD5), never over
  plaintext to a remote host, and a rejected AUTH is final (the stock client
  offers PLAIN credentials a second time);
* MAIL, every RCPT and DATA go out in one write when the server offers
  PIPELINING (RFC 2920), which the stock client does not do;
* a deadline or cancel always yields a classified outcome."""

from __future__ import annotations

import ipaddress
import socket
from collections import deque
from dataclasses import dataclass, field
from typing import Any, cast

from OpenSSL import SSL
from twisted.internet import ssl
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator, ITCPTransport
from twisted.internet.protocol import ClientFactory, connectionDone
from twisted.mail.smtp import (
    Address,
    ESMTPClient,
    IClientAuthentication,
    SMTPClientError,
    quoteaddr,
)
from twisted.python.failure import Failure
from zope.interface import implementer

from gorge.mailer.backends.base import BackendEntry
from gorge.mailer.backends.smtp_data import CHUNK_SIZE, _Content, stuff_mime
from gorge.mailer.backends.smtp_reply import _STAGE_NAMES, classify_reply
from gorge.mailer.message import Message
from gorge.mailer.mime import build_mime
from gorge.mailer.outcome import Outcome

ATTEMPT_CAP = 60.0
CONNECT_CAP = 30.0
PROTOCOLS = ("", "none", "plain", "ssl", "smtps", "tls", "starttls")
#: The stage a command's reply belongs to, by the first four bytes of the
#: command as the stock client writes it (STARTTLS included).
_COMMAND_STAGES = {
    b"EHLO": "ehlo",
    b"HELO": "helo",
    b"STAR": "starttls",
    b"AUTH": "auth",
    b"MAIL": "mail",
    b"RCPT": "rcpt",
    b"DATA": "data",
}
#: LOGIN asks for the user name, then the password; a third challenge is a failure.
_LOGIN_CHALLENGES = 2


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
        "service_identity"
    )


class _Verbatim(Address):
    """An envelope address that ``quoteaddr`` writes exactly as given.

    ``quoteaddr`` re-parses a plain string with ``email.utils.parseaddr``,
    which turns ``a,b@example.com`` into ``<a>``; an :class:`Address` goes
    out as its bytes. The message parser already checked the address."""

    def __init__(self, address: str) -> None:
        self.addrstr = address.encode("ascii")

    def __bytes__(self) -> bytes:
        return self.addrstr


@dataclass(frozen=True)
class _Credentials:
    """The client's ``secret``, handed to the authenticators. An object, so
    that an empty password is still offered (the stock client offers
    credentials only when ``secret`` is true)."""

    user: bytes
    password: bytes = field(repr=False)


@implementer(IClientAuthentication)
class _Plain:
    """AUTH PLAIN without an authorization identity (the stock one sends the
    user name as one)."""

    def getName(self) -> bytes:
        return b"PLAIN"

    def challengeResponse(self, secret: _Credentials, chal: object) -> bytes:
        return b"\0" + secret.user + b"\0" + secret.password


@implementer(IClientAuthentication)
class _Login:
    def __init__(self) -> None:
        self.answered = 0

    def getName(self) -> bytes:
        return b"LOGIN"

    def challengeResponse(self, secret: _Credentials, chal: object) -> bytes:
        self.answered += 1
        return secret.user if self.answered == 1 else secret.password


class _Session(ESMTPClient):
    """One SMTP transaction. ``done`` fires with an :class:`Outcome`."""

    # The stock client keeps a log of the exchange, credentials included;
    # the outcome is classified from the replies alone.
    debug = False
    MAX_LENGTH = 65536
    # ESMTPClient sends every attribute write (about a hundred a message)
    # through a Python __setattr__ that only warns about its deprecated
    # ``tlsMode``, a name this client never uses.
    __setattr__ = object.__setattr__

    def __init__(
        self, cfg: SmtpConfig, tls: Any, sender: str, recipients: list[str], content: bytes
    ) -> None:
        credentials = (
            _Credentials(cfg.user.encode("utf-8"), cfg.password.encode("utf-8"))
            if cfg.user
            else None
        )
        super().__init__(credentials, None if cfg.mode == "ssl" else tls, cfg.helo.encode("utf-8"))
        self.registerAuthenticator(_Plain())  # tried in this order
        self.registerAuthenticator(_Login())
        self.heloFallback = not cfg.user and cfg.mode == "plain"
        self.requireAuthentication = bool(cfg.user)
        self.requireTransportSecurity = cfg.mode == "starttls"
        self.cfg = cfg
        self.sender = _Verbatim(sender)
        self.recipients = [_Verbatim(r) for r in recipients]
        self.content = content
        self.done: Deferred = Deferred(lambda _: self.abort("cancelled"))
        self.stage = "connect" if cfg.mode != "ssl" else "tls-connect"
        self.started_tls = False
        self.dot_sent = False
        self.pipelined = False
        self.extensions: dict[bytes, bytes | None] = {}
        self.auth_mechanism = b""
        self.auth_challenges = 0
        self.connector: Any = None
        self._ahead: deque[bytes] = deque()
        self._reader: _Content | None = None

    @property
    def secure(self) -> bool:
        return self.cfg.mode == "ssl" or self.started_tls

    # --- outcome ----------------------------------------------------------
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
                self.transport.write(b"QUIT\r\n")
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
            cast(ITCPTransport, self.transport).abortConnection()
        elif self.connector is not None:
            self.connector.disconnect()

    def fail_reply(self, code: int, resp: bytes | None) -> None:
        text = (resp or b"").decode("utf-8", "replace").replace("\n", " ")
        self.finish(classify_reply(self.stage, code, text[:300]))

    def _where(self) -> str:
        return _STAGE_NAMES.get(self.stage, self.stage)

    def connectFailed(self, reason: Failure) -> None:
        assert reason.type is not None  # a Failure always carries its exception type
        self.finish(
            Outcome.transient(
                f"smtp: cannot connect to {self.cfg.host}:{self.cfg.port} ({reason.type.__name__})"
            )
        )

    # --- connection -------------------------------------------------------
    def connectionMade(self) -> None:
        self.stage = "greeting"
        # SMTP is lock-step; Nagle would hold each short command (and the
        # final dot behind the content) until the previous segment's ACK.
        try:
            cast(ITCPTransport, self.transport).setTcpNoDelay(True)
        except (AttributeError, OSError):
            pass
        super().connectionMade()

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        super().connectionLost(reason)
        self.connected = False
        if self.done.called:
            return
        if _is_tls_failure(reason) and self.stage in ("tls-connect", "greeting", "tls-ehlo"):
            self.finish(Outcome.rejected_backend(f"smtp: TLS handshake failed ({self._where()})"))
        elif self.dot_sent:
            self.finish(Outcome.unknown("smtp: connection lost after the message was sent"))
        else:
            self.finish(Outcome.transient(f"smtp: connection lost during {self._where()}"))

    # --- the wire ---------------------------------------------------------
    def lineReceived(self, line: bytes) -> None:
        if self.done.called:
            return
        code, sep = line[:3], line[3:4]
        if not code.isdigit() or sep not in (b"-", b" ", b""):
            outcome = Outcome.unknown if self.dot_sent else Outcome.transient
            return self.finish(outcome(f"smtp: {self._where()}: malformed reply"))
        if sep != b"-" and self.stage == "auth" and not self._auth_goes_on(int(code)):
            return self.fail_reply(int(code), b"\n".join([*self.resp, line[4:]]))
        super().lineReceived(line)

    def _auth_goes_on(self, code: int) -> bool:
        if code == 334 and self.auth_mechanism == b"LOGIN":
            self.auth_challenges += 1
            return self.auth_challenges <= _LOGIN_CHALLENGES
        return code == 235

    def lineLengthExceeded(self, line: bytes) -> None:
        outcome = Outcome.unknown if self.dot_sent else Outcome.transient
        self.finish(outcome(f"smtp: {self._where()}: reply line too long"))

    def sendLine(self, line: bytes) -> None:
        if self.done.called:
            return
        self._note_stage(line)
        if self._ahead and line == self._ahead[0]:
            self._ahead.popleft()  # already written with the pipelined batch
            return
        if line.startswith(b"MAIL FROM:") and b"PIPELINING" in self.extensions:
            # RFC 2920: MAIL, every RCPT and DATA in one write. The stock
            # client still walks its lock-step states as the replies come
            # back in order; its writes of RCPT and DATA are dropped above.
            self.pipelined = True
            self._ahead.extend([*(b"RCPT TO:" + quoteaddr(r) for r in self.recipients), b"DATA"])
            assert self.transport is not None
            self.transport.write(b"".join(c + b"\r\n" for c in [line, *self._ahead]))
            return
        super().sendLine(line)

    def _note_stage(self, line: bytes) -> None:
        if self.stage == "auth" and not line.startswith(b"MAIL FROM:"):
            return  # SASL responses: still the AUTH exchange
        stage = _COMMAND_STAGES.get(line[:4])
        if stage == "ehlo" and self.started_tls:
            stage = "tls-ehlo"
        if stage == "auth":
            self.auth_mechanism = line.split(b" ")[1].upper()
        if stage is not None:
            self.stage = stage

    # --- replies the stock client counts as failures ---------------------
    def sendError(self, exc: Exception) -> None:
        if self.done.called:
            return
        if isinstance(exc, SMTPClientError) and exc.code > 0:
            return self.fail_reply(exc.code, exc.resp)
        # The content transfer stopped: the connection is going away, and
        # connectionLost classifies by how far we got.
        if self.transport is not None:
            self.transport.loseConnection()

    def smtpConnectionFailed(self, code: int, resp: bytes) -> None:
        if code // 100 == 2:
            return self.esmtpState_ehlo(code, resp)  # any 2xx greets
        self.fail_reply(code, resp)

    def esmtpEHLORequired(self, code: int = -1, resp: bytes | None = None) -> None:
        self.fail_reply(code, resp)

    def smtpState_helo(self, code: int, resp: bytes) -> None:
        # The stock client answers any failed EHLO (and any failed HELO)
        # with HELO; only a 5xx to EHLO means "no ESMTP here".
        if self.stage == "helo" or code // 100 != 5:
            return self.fail_reply(code, resp)
        super().smtpState_helo(code, resp)

    def tryTLS(self, code: int, resp: bytes, items: dict) -> None:
        self.extensions = {k.upper(): v for k, v in items.items()}
        super().tryTLS(code, resp, self.extensions)

    def esmtpTLSRequired(self, code: int = -1, resp: bytes | None = None) -> None:
        self.finish(
            Outcome.rejected_backend("smtp: STARTTLS required but not offered by the server")
        )

    def esmtpTLSFailed(self, code: int = -1, resp: bytes | None = None) -> None:
        self.fail_reply(code, resp)

    def esmtpState_starttls(self, code: int, resp: bytes) -> None:
        self.started_tls = True
        super().esmtpState_starttls(code, resp)

    def authenticate(self, code: int, resp: bytes, items: dict) -> None:
        if not self.cfg.user:
            return super().authenticate(code, resp, items)
        if not self.secure and not _is_loopback(self.cfg.host):
            return self.finish(
                Outcome.rejected_backend(
                    "smtp: refusing to send credentials over an unencrypted connection"
                )
            )
        if b"AUTH" not in items:
            return self.finish(Outcome.rejected_backend("smtp: server does not offer AUTH"))
        offered = (items[b"AUTH"] or b"").upper().split()
        if not any(a.getName() in offered for a in self.authenticators):
            return self.finish(
                Outcome.rejected_backend("smtp: no supported AUTH mechanism (PLAIN, LOGIN) offered")
            )
        super().authenticate(code, resp, items)

    def smtpState_toOrData(self, code: int, resp: bytes) -> None:
        # Any rejected recipient ends the transaction before the content;
        # pipelined, DATA may already be out, but no content or dot ever
        # follows, so nothing can be delivered.
        if self.lastAddress is not None and code // 100 != 2:
            return self.fail_reply(code, resp)
        super().smtpState_toOrData(code, resp)

    def smtpTransferFailed(self, code: int, resp: bytes) -> None:
        if self.stage == "mail" and code // 100 == 2:
            return self.smtpState_to(code, resp)  # any 2xx accepts the sender
        if self.stage == "content":
            # The server answered before our terminating dot (typically an
            # error followed by a hang-up): nothing was accepted.
            self.stage = "data"
        self.fail_reply(code, resp)

    # --- content and the terminating dot ---------------------------------
    def getMailFrom(self) -> Address:
        return self.sender

    def getMailTo(self) -> list[_Verbatim]:
        return self.recipients

    def getMailData(self) -> _Content:
        content = stuff_mime(self.content)
        self._reader = _Content(content, terminate=len(content) <= CHUNK_SIZE)
        return self._reader

    def smtpState_data(self, code: int, resp: bytes) -> None:
        self.stage = "content"
        super().smtpState_data(code, resp)

    def transformChunk(self, chunk: bytes) -> bytes:
        # Already CRLF and dot-stuffed (stuff_mime).
        if self._reader is not None and self._reader.dot_taken and not self.dot_sent:
            self._handed_over_dot()
        return chunk

    def finishedFileTransfer(self, lastsent: bytes) -> None:
        # Streamed content: the terminating dot is handed over only once the
        # transport took all of it, so a connection lost before that
        # provably delivered nothing.
        if self.dot_sent or self.done.called or not self.connected:
            return
        super().finishedFileTransfer(lastsent)
        self._handed_over_dot()

    def _handed_over_dot(self) -> None:
        # From here on the server may have the whole message: no verdict
        # means "outcome unknown", never "safe to resend".
        self.stage = "dot"
        self.dot_sent = True

    def smtpState_msgSent(self, code: int, resp: bytes) -> None:
        if not self.dot_sent:
            self.stage = "data"
            return self.fail_reply(code, resp)
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

    def __init__(
        self, key: str, priority: int, cfg: SmtpConfig, *, reactor: Any, trust_root: Any = None
    ) -> None:
        self.key = key
        self.priority = priority
        self.cfg = cfg
        self._reactor = reactor
        if cfg.insecure:
            self._tls: ssl.CertificateOptions | IOpenSSLClientConnectionCreator
            self._tls = ssl.CertificateOptions(verify=False, raiseMinimumTo=ssl.TLSVersion.TLSv1_2)
        else:
            self._tls = ssl.optionsForClientTLS(
                cfg.host,
                trustRoot=trust_root,
                extraCertificateOptions={"raiseMinimumTo": ssl.TLSVersion.TLSv1_2},
            )

    async def send(self, message: Message, *, deadline: float) -> Outcome:
        clock = self._reactor
        now = clock.seconds()
        budget = min(ATTEMPT_CAP, deadline - now)
        if budget <= 0:
            return Outcome.transient("smtp: deadline reached before start")
        recipients = message.recipients()
        if not all(a.isascii() for a in [message.from_.address, *recipients]):
            return Outcome.rejected_backend(
                "smtp: non-ASCII address needs SMTPUTF8, which this backend does not speak"
            )
        content = build_mime(message, now=now)
        session = _Session(self.cfg, self._tls, message.from_.address, recipients, content)
        factory = _Factory(session)
        cfg = self.cfg
        connect_timeout = max(1, int(min(CONNECT_CAP, budget)))
        if cfg.mode == "ssl":
            session.connector = self._reactor.connectSSL(
                cfg.host, cfg.port, factory, self._tls, timeout=connect_timeout
            )
        else:
            session.connector = self._reactor.connectTCP(
                cfg.host, cfg.port, factory, timeout=connect_timeout
            )
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
