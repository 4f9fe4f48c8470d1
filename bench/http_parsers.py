"""Benchmark: gorge's HTTP/1.1 readers, in this process, without sockets.

Three measurements, each the best of ``--rounds`` rounds of ``--requests``
(rate and CPU per request side by side; CPU is the process's user + system
time, which a loaded machine disturbs less than the rate):

1. ``inbound hot``: a worker's lease call (its real head and body) answered
   through a site's hot channel, the path of the busiest calls;
2. ``inbound twisted.web``: the same request through twisted.web's channel
   (``GORGE_HTTP_FAST=off``), for the ratio between the two;
3. ``client answer``: the queue's answer to that call read by the kept-alive
   client's parser, fed as one piece.

Run it in two checkouts (before and after a change) and compare the lines.
``--profile FILE`` runs the hot channel once more under py-spy and prints its
top entries.

Usage: python bench/http_parsers.py [--requests 20000] [--rounds 5] [--profile FILE]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry  # noqa: E402
from twisted.internet import task  # noqa: E402
from twisted.internet.address import IPv4Address  # noqa: E402
from twisted.internet.testing import StringTransport  # noqa: E402

from gorge.client.keepalive import ResponseParser  # noqa: E402
from gorge.web.envelope import ok, read_json_object  # noqa: E402
from gorge.web.site import GorgeChannel, build_site  # noqa: E402

LEASE = b"/api/queue/lease"
BODY = b'{"limit":10,"leaseSeconds":7200}'
REQUEST = (
    b"POST /api/queue/lease HTTP/1.1\r\nConnection: keep-alive\r\nHost: 127.0.0.1:8090\r\n"
    b"User-Agent: gorge-worker\r\nContent-Type: application/json\r\n"
    b"X-Service-Token: bench-token\r\nX-Lease-Owner: host-1:4242:1\r\n"
    b"X-Request-Id: 5d0c4b7e9a1f4e3c8b2a6d9e0f1a2b3c\r\nContent-Length: %d\r\n\r\n" % len(BODY)
) + BODY
LEASED = (
    b'{"data":[{"id":41,"taskClass":"PhabricatorSearchWorker","leaseOwner":"host-1:4242:1",'
    b'"leaseExpires":1796296800,"failureCount":0,"dataID":41,"objectPHID":null,'
    b'"priority":3000,"containerPHID":null,"data":{"documentPHID":"PHID-TASK-a"}}]}'
)
ANSWER = (
    b"HTTP/1.1 200 OK\r\nX-Request-Id: 5d0c4b7e9a1f4e3c8b2a6d9e0f1a2b3c\r\n"
    b"Server: TwistedWeb/26.10.0\r\nDate: Thu, 03 Dec 2026 11:00:00 GMT\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(LEASED)
) + LEASED
PEER = IPv4Address("TCP", "127.0.0.1", 40000)


class Sink(StringTransport):
    """A connection whose written bytes are counted and dropped."""

    def __init__(self) -> None:
        super().__init__(peerAddress=PEER)
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def writeSequence(self, data) -> None:
        self.written += sum(map(len, data))


async def lease(request) -> bytes:
    read_json_object(request)
    return ok(request, [])


def channel(hot: bool):
    async def ready():
        return None

    from klein import Klein

    site = build_site(
        api_resource=Klein().resource(),
        prefix="/api/queue/",
        token="bench-token",
        body_limit=2 * 1024 * 1024,
        readiness=ready,
        registry=CollectorRegistry(),
        clock=task.Clock(),
        access_log=False,
        hot_routes={LEASE: lease},
    )
    if not hot:
        site.protocol = GorgeChannel
    site.reactor = task.Clock()
    protocol = site.buildProtocol(PEER)
    transport = Sink()
    protocol.makeConnection(transport)
    return protocol, transport


def measure(run, count: int, rounds: int) -> tuple[float, float]:
    """(requests per second, CPU microseconds per request), the best round."""
    best_rate, best_cpu = 0.0, float("inf")
    for _ in range(rounds):
        cpu = time.process_time()
        started = time.perf_counter()
        run(count)
        wall = time.perf_counter() - started
        used = time.process_time() - cpu
        best_rate = max(best_rate, count / wall)
        best_cpu = min(best_cpu, used / count * 1e6)
    return best_rate, best_cpu


def inbound(hot: bool):
    def run(count: int) -> None:
        protocol, transport = channel(hot)
        for _ in range(count):
            protocol.dataReceived(REQUEST)
        assert transport.written > count * 100, "the requests were not answered"

    return run


def client(count: int) -> None:
    for _ in range(count):
        parser = ResponseParser(keep=64 * 1024)
        assert parser.feed(ANSWER) and parser.reusable and not parser.extra


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", type=Path)
    parser.add_argument("--only", choices=["hot"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only == "hot":
        inbound(True)(args.requests)
        return
    for name, run in (
        ("inbound hot", inbound(True)),
        ("inbound twisted.web", inbound(False)),
        ("client answer", client),
    ):
        rate, cpu = measure(run, args.requests, args.rounds)
        print(f"{name:22} {rate:10.0f}/s {cpu:8.2f} us CPU per request")
    if args.profile is not None:
        spy = str(Path(sys.executable).with_name("py-spy"))
        argv = [sys.executable, __file__, "--only", "hot", "--requests", str(args.requests * 10)]
        subprocess.run(
            [spy, "record", "--format", "raw", "--rate", "500", "-o", str(args.profile), "--"]
            + argv,
            check=True,
            capture_output=True,
        )
        from daemons import top_entries  # noqa: PLC0415

        print("hot channel, top entries (self %, total %):")
        for own, total, function in top_entries(args.profile, 12):
            print(f"  {own:5.1f} {total:5.1f}  {function}")


if __name__ == "__main__":
    main()
