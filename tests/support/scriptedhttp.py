"""A scripted HTTP/1.1 server on 127.0.0.1, for the kept-alive clients' tests.

Each request (read by its ``Content-Length``) gets the next scripted answer:
``(bytes, hang_up)`` writes the bytes and, with ``hang_up``, closes the
connection; ``(None, _)`` holds the request, for the test to answer through
``held``. The server records every connection, every closed one and every
request as it arrived.
"""

from __future__ import annotations

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory, Protocol

#: A 200 with a two-byte body.
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
#: How long a test waits for a request or a close before it fails.
WAIT_BOUND = 10.0


class _Scripted(Protocol):
    factory: ScriptedServer

    def connectionMade(self):
        self.factory.connections.append(self)
        self.received = b""

    def dataReceived(self, data):
        self.received += data
        while b"\r\n\r\n" in self.received:
            head, _, rest = self.received.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(rest) < length:
                return
            self.received = rest[length:]
            self.factory.requests.append(head + b"\r\n\r\n" + rest[:length])
            answer, hang_up = self.factory.answers.pop(0)
            if answer is None:
                self.factory.held.append(self)
            else:
                self.transport.write(answer)
                if hang_up:
                    self.transport.loseConnection()
            _fire(self.factory.request_waiters)

    def connectionLost(self, reason):
        self.factory.closed.append(self)
        _fire(self.factory.close_waiters)


def _fire(waiters: list[Deferred]) -> None:
    # A waiter's callback may queue a new waiter: fire only those there now.
    current = list(waiters)
    waiters.clear()
    for waiter in current:
        waiter.callback(None)


class ScriptedServer(Factory):
    protocol = _Scripted
    noisy = False

    def __init__(self) -> None:
        self.connections: list[_Scripted] = []
        self.closed: list[_Scripted] = []
        self.requests: list[bytes] = []
        self.answers: list[tuple[bytes | None, bool]] = []
        self.held: list[_Scripted] = []
        self.request_waiters: list[Deferred] = []
        self.close_waiters: list[Deferred] = []
        self.port = None

    def listen(self) -> int:
        self.port = reactor.listenTCP(0, self, interface="127.0.0.1")
        return self.port.getHost().port

    def stop(self) -> Deferred:
        for connection in self.connections:
            connection.transport.abortConnection()
        return self.port.stopListening()

    def closing(self) -> Deferred:
        """Fires at the next close of a connection (within WAIT_BOUND)."""
        waiter: Deferred = Deferred()
        self.close_waiters.append(waiter)
        return waiter.addTimeout(WAIT_BOUND, reactor)

    def requested(self, count: int) -> Deferred:
        """Fires once ``count`` requests have arrived (within WAIT_BOUND)."""

        async def wait() -> None:
            while len(self.requests) < count:
                waiter: Deferred = Deferred()
                self.request_waiters.append(waiter)
                await waiter

        return Deferred.fromCoroutine(wait()).addTimeout(WAIT_BOUND, reactor)
