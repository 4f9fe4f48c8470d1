"""Helpers for the HTTP provider tests (no tests of its own).

* :func:`message` -- a validated :class:`Message` from the wire shape.
* :func:`entry` -- a backend list element.
* :func:`from_backend_list` -- a backend built the way the service builds
  it, from a ``GORGE_MAILER_CONFIG`` list.
* :class:`MemoryHttp` -- a real ``Agent`` on a
  ``MemoryReactorClock``: the test decides when the TCP connection comes up,
  reads the exact bytes the client wrote and scripts the server's answer,
  so deadlines before and after submission are deterministic.
* :class:`LoopbackServer` -- a real HTTP server on 127.0.0.1 (free port)
  that records each request and answers from a script, for end-to-end
  sends through the real reactor (``async with`` starts and stops it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from twisted.internet import defer, task
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.resource import Resource
from twisted.web.server import Site

from gorge.mailer.backends import build_backend
from gorge.mailer.backends.base import BackendEntry
from gorge.mailer.message import Message
from gorge.mailer.outcome import Outcome
from gorge.mailer.settings import parse_backend_list
from tests.mailer.conftest import parsed_message
from tests.support import certs
from tests.support.memoryhttp import MemoryHttp as BaseMemoryHttp

message = parsed_message


def full_message() -> Message:
    """Every field a provider maps, with names that need quoting."""
    return message(
        **{
            "from": {"name": "Phorge", "address": "noreply@example.com"},
            "replyTo": {"name": "", "address": "reply@example.com"},
            "to": [
                {"name": "Alice", "address": "alice@example.com"},
                {"name": "", "address": "carol@example.com"},
            ],
            "cc": [{"name": "Doe, John", "address": "bob@example.com"}],
            "bcc": [{"name": "", "address": "hidden@example.com"}],
            "textBody": "plain text",
            "htmlBody": "<p>html</p>",
            "headers": [
                {"name": "X-Phabricator-Sent-This-Message", "value": "Yes"},
                {"name": "In-Reply-To", "value": "<thread@example.com>"},
            ],
            "attachments": [
                {"filename": "note.txt", "mimeType": "text/plain", "data": "SGVsbG8sIGdvcmdlIQ=="},
                {"filename": "blob.bin", "mimeType": None, "data": "AAEC"},
            ],
        }
    )


def entry(type_: str, key: str = "p", priority: int = 10, **options: str) -> BackendEntry:
    return BackendEntry(
        key=key,
        type=type_,
        priority=priority,
        options={k.replace("_", "-"): v for k, v in options.items()},
    )


def from_backend_list(type_: str, key: str, options: dict) -> Any:
    doc = json.dumps([{"key": key, "type": type_, "options": options}])
    (parsed,) = parse_backend_list(doc, "GORGE_MAILER_CONFIG")
    return build_backend(parsed, reactor=task.Clock(), http_client=None)


class MemoryHttp(BaseMemoryHttp):
    """:class:`tests.support.memoryhttp.MemoryHttp` that also sends mail."""

    def outcome_past_deadline(self, backend: Any, deadline: float, *, connect: bool) -> Outcome:
        """Send :func:`message` through ``backend`` (built on this client), bring
        the TCP connection up first if ``connect``, and let ``deadline`` pass."""
        d = defer.Deferred.fromCoroutine(backend.send(message(), deadline=deadline))
        if connect:
            self.connect()
        self.reactor.advance(deadline - self.reactor.seconds())
        return d.result


def split_request(raw: bytes) -> tuple[str, dict[str, str], bytes]:
    """(request line, lower-cased headers, body) of a raw HTTP/1.1 request."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return lines[0], headers, body


def response(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@dataclass
class Recorded:
    method: bytes
    path: bytes
    headers: dict[str, str]
    body: bytes


@dataclass
class Scripted:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


class _Recorder(Resource):
    isLeaf = True

    def __init__(self, server: LoopbackServer) -> None:
        super().__init__()
        self._server = server

    def render(self, request: Any) -> bytes:
        self._server.requests.append(
            Recorded(
                method=request.method,
                path=request.uri,
                headers={
                    k.decode().lower(): v[-1].decode("latin-1")
                    for k, v in request.requestHeaders.getAllRawHeaders()
                },
                body=request.content.read(),
            )
        )
        answer = self._server.answer
        request.setResponseCode(answer.status)
        for name, value in answer.headers.items():
            request.setHeader(name, value)
        return answer.body


class LoopbackServer:
    """A real HTTP server on 127.0.0.1 and a real client to reach it."""

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor
        self.requests: list[Recorded] = []
        self.answer = Scripted()
        self.port: Any = None
        self.pool = HTTPConnectionPool(reactor, persistent=False)
        self.client = Agent(reactor, pool=self.pool, connectTimeout=5)

    def start(self) -> None:
        site = Site(_Recorder(self))
        site.noisy = False
        self.port = self.reactor.listenTCP(0, site, interface="127.0.0.1")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port.getHost().port}"

    async def stop(self) -> None:
        await self.pool.closeCachedConnections()
        await defer.maybeDeferred(self.port.stopListening)

    async def __aenter__(self) -> LoopbackServer:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


def self_signed(ip: str = "127.0.0.1") -> tuple[bytes, bytes]:
    """(key PEM, certificate PEM) for ``ip`` (as an IP SAN)."""
    return certs.self_signed(ips=(ip,))
