"""The demo's SMTP sink: accepts mail on 127.0.0.1 and keeps it in memory.

Recipients in ``reject`` are refused at RCPT with ``550 5.1.1``, the reply a
real server gives for an unknown mailbox, so the mailer sees a permanent,
message-scoped rejection. Every accepted message and every refusal is
reported to ``on_event``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from email import message_from_bytes, policy

from twisted.internet.defer import succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import ServerFactory
from twisted.mail import smtp
from zope.interface import implementer

SINK_HOSTNAME = b"sink.gorge-demo.test"


@dataclass(frozen=True)
class SinkEvent:
    kind: str  # "accepted" | "rejected"
    recipients: tuple[str, ...]
    subject: str = ""


@dataclass
class SmtpSink:
    """What the sink saw; shared by every connection of one demo run."""

    reject: frozenset[str]
    on_event: Callable[[SinkEvent], None]
    accepted: list[SinkEvent] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)

    def refuse(self, address: str) -> None:
        self.rejected.append(address)
        self.on_event(SinkEvent("rejected", (address,)))

    def deliver(self, recipients: Iterable[str], raw: bytes) -> None:
        parsed = message_from_bytes(raw, policy=policy.default)
        event = SinkEvent("accepted", tuple(recipients), str(parsed.get("Subject", "")))
        self.accepted.append(event)
        self.on_event(event)


@implementer(smtp.IMessage)
class _Message:
    """Twisted builds one message per accepted recipient; only the first one
    (``primary``) records the transaction, so a message is counted once."""

    def __init__(self, sink: SmtpSink, recipients: list[str], primary: bool) -> None:
        self._sink = sink
        self._recipients = recipients
        self._primary = primary
        self._lines: list[bytes] = []

    def lineReceived(self, line: bytes) -> None:
        if self._primary:
            self._lines.append(line)

    def eomReceived(self):
        if self._primary:
            self._sink.deliver(self._recipients, b"\r\n".join(self._lines))
        return succeed(b"queued in the demo sink")

    def connectionLost(self) -> None:
        self._lines = []


@implementer(smtp.IMessageDelivery)
class _Delivery:
    """One per connection: collects the accepted recipients of the transaction."""

    def __init__(self, sink: SmtpSink) -> None:
        self._sink = sink
        self._recipients: list[str] = []

    def receivedHeader(self, helo, origin, recipients) -> bytes:
        return b"Received: from " + (helo[0] or b"unknown") + b" by " + SINK_HOSTNAME

    def validateFrom(self, helo, origin):
        self._recipients = []
        return origin

    def validateTo(self, user: smtp.User):
        address = str(user.dest).lower()
        if address in self._sink.reject:
            self._sink.refuse(address)
            raise smtp.SMTPBadRcpt(address, 550, f"5.1.1 <{address}>: mailbox unavailable")
        primary = not self._recipients
        self._recipients.append(address)
        recipients = self._recipients
        return lambda: _Message(self._sink, recipients, primary)


class SinkFactory(ServerFactory):
    """ESMTP without STARTTLS or AUTH: the mailer talks plain SMTP on loopback."""

    def __init__(self, sink: SmtpSink, clock: IReactorTime) -> None:
        self._sink = sink
        self._clock = clock

    def buildProtocol(self, addr):
        protocol = smtp.ESMTP(contextFactory=None)
        protocol.host = SINK_HOSTNAME
        protocol.factory = self
        protocol.delivery = _Delivery(self._sink)
        # idle timeout on the injected clock; TimeoutMixin.callLater is there to be replaced
        protocol.callLater = self._clock.callLater  # type: ignore[method-assign,assignment]
        return protocol
