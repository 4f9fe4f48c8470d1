"""A real ``Agent`` whose network is a ``MemoryReactorClock``: the test
decides when the TCP connection comes up, reads the exact bytes the client
wrote and scripts the server's answer, so deadlines before and after the
request went out are deterministic."""

from __future__ import annotations

from typing import Any

from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure
from twisted.web.client import Agent


class TcpStringTransport(StringTransport):
    """What the HTTP client protocol expects of a TCP transport."""

    def setTcpNoDelay(self, enabled: bool) -> None:
        pass

    def setTcpKeepAlive(self, enabled: bool) -> None:
        pass


class MemoryHttp:
    """``client`` is the Agent; ``reactor`` its clock and network."""

    def __init__(self) -> None:
        self.reactor = MemoryReactorClock()
        self.client = Agent(self.reactor, connectTimeout=5)
        self.transport: StringTransport | None = None
        self.protocol: Any = None

    @property
    def attempts(self) -> int:
        return len(self.reactor.tcpClients)

    def connect(self) -> StringTransport:
        """Complete the last TCP connection; the client then writes its request."""
        _host, _port, factory, _timeout, _bind = self.reactor.tcpClients[-1]
        self.protocol = factory.buildProtocol(None)
        self.transport = TcpStringTransport()
        self.protocol.makeConnection(self.transport)
        return self.transport

    def refuse(self, reason: Exception) -> None:
        connector = self.reactor.connectors[-1]
        _host, _port, factory, _timeout, _bind = self.reactor.tcpClients[-1]
        factory.clientConnectionFailed(connector, Failure(reason))
        # HostnameEndpoint gives up once its next-address timer (0.3 s) ran out.
        self.reactor.advance(0.5)

    def respond(self, raw: bytes) -> None:
        self.protocol.dataReceived(raw)

    def lose(self, reason: Exception) -> None:
        self.protocol.connectionLost(Failure(reason))

    def request_bytes(self) -> bytes:
        assert self.transport is not None
        return self.transport.value()
