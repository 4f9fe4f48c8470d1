"""A loopback HTTP server that records requests byte for byte and answers
from a script: for wire-format tests where header order and exact bytes
matter (twisted.web would normalise both)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from twisted.internet.defer import Deferred
from twisted.internet.protocol import Factory, Protocol


@dataclass
class RawRequest:
    head: bytes
    body: bytes

    @property
    def request_line(self) -> str:
        return self.head.split(b"\r\n", 1)[0].decode()

    @property
    def headers(self) -> list[tuple[str, str]]:
        lines = self.head.split(b"\r\n")[1:]
        return [
            tuple(part.strip() for part in line.decode().split(":", 1)) for line in lines if line
        ]

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    hang: bool = False


class _RawProtocol(Protocol):
    def __init__(self, server: RawServer) -> None:
        self._server = server
        self._buffer = b""

    def dataReceived(self, data: bytes) -> None:
        self._buffer += data
        if b"\r\n\r\n" not in self._buffer:
            return
        head, _, rest = self._buffer.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        if len(rest) < length:
            return
        request = RawRequest(head + b"\r\n\r\n", rest[:length])
        self._buffer = b""
        answer = self._server.answer_for(request)
        self._server.record(request)
        if answer.hang:
            return
        reason = {200: b"OK", 500: b"Internal Server Error"}.get(answer.status, b"Status")
        self.transport.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s"
            % (answer.status, reason, answer.content_type.encode(), len(answer.body), answer.body)
        )
        self.transport.loseConnection()


class RawServer(Factory):
    def __init__(self, answer: Callable[[RawRequest], Answer] | Answer | None = None) -> None:
        self._answer = Answer() if answer is None else answer
        self.requests: list[RawRequest] = []
        self._waiters: list[tuple[int, Deferred]] = []
        self.port = None

    def buildProtocol(self, addr):
        return _RawProtocol(self)

    def answer_for(self, request: RawRequest) -> Answer:
        return self._answer(request) if callable(self._answer) else self._answer

    def record(self, request: RawRequest) -> None:
        self.requests.append(request)
        for count, waiter in list(self._waiters):
            if len(self.requests) >= count and not waiter.called:
                waiter.callback(request)

    def received(self, count: int = 1) -> Deferred:
        d: Deferred = Deferred()
        self._waiters.append((count, d))
        if len(self.requests) >= count:
            d.callback(self.requests[count - 1])
        return d

    def listen(self, reactor) -> str:
        self.port = reactor.listenTCP(0, self, interface="127.0.0.1")
        return f"http://127.0.0.1:{self.port.getHost().port}"

    def stop(self) -> Deferred:
        return self.port.stopListening()
