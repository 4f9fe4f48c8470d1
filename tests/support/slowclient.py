"""A raw HTTP/1.1 client that sends a request in parts, when the test says so."""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol


class SlowClient(Protocol):
    """Writes what it is told when it is told; :attr:`closed` fires with all it received."""

    def __init__(self) -> None:
        self.received = b""
        self.closed: Deferred = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason) -> None:
        self.closed.callback(self.received)

    def send(self, data: bytes) -> None:
        self.transport.write(data)


async def connect(reactor, port: int, protocol: Protocol | None = None) -> SlowClient:
    """``protocol`` (a new :class:`SlowClient` by default) connected to 127.0.0.1:``port``."""
    protocol = protocol if protocol is not None else SlowClient()
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=10)
    await connectProtocol(endpoint, protocol)
    return protocol


def post(path: str, body: bytes) -> tuple[bytes, bytes]:
    """A JSON POST split in two: the head, and the body."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii"), body


def parse_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, lower-cased headers and body of one complete response."""
    head, separator, body = raw.partition(b"\r\n\r\n")
    assert separator, f"no complete response head: {raw[:200]!r}"
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body
