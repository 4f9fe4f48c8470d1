"""Throughput of gorge-mailer against a local SMTP sink, next to the bound.

    .venv/bin/python bench/mailer.py [--count 2000] [--large-count 2000] [--concurrency 16]

Three processes: an SMTP sink, the mailer service (its real Site and smtp
backend, listening on 127.0.0.1), and this driver. For each workload
(small text message; 1 MiB attachment) the driver

1. measures the bound: the same messages, already rendered as MIME, sent
   straight to the sink with Twisted's stock SMTP client at the same
   concurrency;
2. measures gorge: the messages POSTed to /api/mailer/send with treq;

and prints messages/s for both and the ratio. Every send must succeed.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
import time
from io import BytesIO

from twisted.web.iweb import IBodyProducer
from zope.interface import implementer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SINK = "sink"
MAILER = "mailer"


# --- the sink: minimal, fast SMTP receiver ------------------------------------


def run_sink() -> None:
    from twisted.internet import reactor
    from twisted.internet.protocol import Factory, Protocol

    class Sink(Protocol):
        def connectionMade(self):
            self.buffer = b""
            self.in_data = False
            self.transport.write(b"220 sink ESMTP\r\n")

        def dataReceived(self, data):
            self.buffer += data
            while True:
                if self.in_data:
                    end = self.buffer.find(b"\r\n.\r\n")
                    if end < 0:
                        # Keep only what could still hold the terminator.
                        if len(self.buffer) > 8:
                            self.buffer = self.buffer[-8:]
                        return
                    self.buffer = self.buffer[end + 5 :]
                    self.in_data = False
                    self.transport.write(b"250 2.0.0 queued\r\n")
                    continue
                end = self.buffer.find(b"\r\n")
                if end < 0:
                    return
                line, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
                verb = line[:4].upper()
                if verb == b"EHLO":
                    self.transport.write(b"250-sink\r\n250-PIPELINING\r\n250 8BITMIME\r\n")
                elif verb == b"DATA":
                    self.in_data = True
                    self.buffer = b"\r\n" + self.buffer
                    self.transport.write(b"354 go\r\n")
                elif verb == b"QUIT":
                    self.transport.write(b"221 bye\r\n")
                    self.transport.loseConnection()
                else:
                    self.transport.write(b"250 ok\r\n")

    port = reactor.listenTCP(0, Factory.forProtocol(Sink), interface="127.0.0.1", backlog=256)
    print(port.getHost().port, flush=True)
    reactor.run()


# --- the mailer service in its own process --------------------------------------


def run_mailer(sink_port: int) -> None:
    from twisted.internet import reactor

    from gorge.mailer.service import build_mailer_service
    from gorge.mailer.settings import load_mailer_settings

    mailers = [
        {
            "key": "sink",
            "type": "smtp",
            "options": {"host": "127.0.0.1", "port": sink_port, "helo": "bench"},
        }
    ]
    settings = load_mailer_settings(
        {
            "GORGE_MAILER_CONFIG": json.dumps(mailers),
            "GORGE_SERVICE_TOKEN": "bench-token",
            "GORGE_MAILER_MAX_RETRIES": "0",
        }
    )
    service = build_mailer_service(settings, reactor, listen=False)
    service.startService()
    port = reactor.listenTCP(0, service.part("site"), interface="127.0.0.1", backlog=256)
    print(port.getHost().port, flush=True)
    profile_to = os.environ.get("GORGE_BENCH_PROFILE")
    if profile_to:
        import cProfile
        import signal

        profiler = cProfile.Profile()
        signal.signal(signal.SIGTERM, lambda *_: reactor.callFromThread(reactor.stop))
        profiler.enable()
        reactor.run()
        profiler.disable()
        profiler.dump_stats(profile_to)
        return
    reactor.run()


# --- the driver ------------------------------------------------------------------


def message_json(i: int, attachment: bytes | None) -> dict:
    message = {
        "from": {"name": "Phorge", "address": "noreply@example.com"},
        "to": [{"name": "Alice", "address": f"alice{i}@example.com"}],
        "subject": f"[Differential] D{i}: Fix the thing",
        "textBody": "Hello,\n\nthis is a small benchmark message.\n" * 4,
        "headers": [
            {"name": "X-Phabricator-Sent-This-Message", "value": "Yes"},
            {"name": "X-Phabricator-Mail-ID", "value": str(i)},
        ],
    }
    if attachment is not None:
        message["attachments"] = [
            {
                "filename": "blob.bin",
                "mimeType": "application/octet-stream",
                "data": base64.b64encode(attachment).decode(),
            }
        ]
    return {"message": message}


@implementer(IBodyProducer)
class OneShotBody:
    """A request body handed to the transport in one write (treq's default
    producer feeds 64 KiB per cooperator step, which would make the driver,
    not the service, the bottleneck for 1 MiB messages)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.length = len(data)

    def startProducing(self, consumer):
        from twisted.internet.defer import succeed

        consumer.write(self.data)
        return succeed(None)

    def pauseProducing(self):
        pass

    def resumeProducing(self):
        pass

    def stopProducing(self):
        pass


class NoDelayEndpoints:
    """Agent endpoint factory whose connections set TCP_NODELAY, as a
    latency-minded HTTP client (and the bound's SMTP client) does."""

    def __init__(self, reactor) -> None:
        self.reactor = reactor

    def endpointForURI(self, uri):
        from twisted.internet.endpoints import TCP4ClientEndpoint

        inner = TCP4ClientEndpoint(self.reactor, uri.host, uri.port, timeout=5)

        class Endpoint:
            def connect(self, factory):
                def nodelay(protocol):
                    protocol.transport.setTcpNoDelay(True)
                    return protocol

                return inner.connect(factory).addCallback(nodelay)

        return Endpoint()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a child process (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def peak_rss_mb(pid: int) -> float:
    """The most memory a child process has held so far (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0


async def run_pool(count: int, concurrency: int, one) -> float:
    """Run ``one(i)`` for i in range(count) with ``concurrency`` workers;
    returns elapsed seconds."""
    from twisted.internet.defer import Deferred, gatherResults

    counter = iter(range(count))

    async def worker():
        for i in counter:
            await one(i)

    started = time.perf_counter()
    cpu = time.process_time()
    await gatherResults([Deferred.fromCoroutine(worker()) for _ in range(concurrency)])
    elapsed = time.perf_counter() - started
    if os.environ.get("GORGE_BENCH_VERBOSE"):
        print(f"  driver cpu {time.process_time() - cpu:.2f}s of {elapsed:.2f}s", flush=True)
    return elapsed


async def bench(reactor, args) -> None:
    from treq.client import HTTPClient
    from twisted.internet.defer import Deferred
    from twisted.mail.smtp import ESMTPSender, ESMTPSenderFactory

    class NoDelaySender(ESMTPSender):
        # Same socket option as gorge's client, so the bound is not held
        # back by Nagle's algorithm on the lock-step SMTP commands.
        def connectionMade(self):
            self.transport.setTcpNoDelay(True)
            super().connectionMade()

    from twisted.web.client import Agent, HTTPConnectionPool

    from gorge.mailer.message import parse_send_request
    from gorge.mailer.mime import build_mime

    sink = subprocess.Popen([sys.executable, __file__, "--role", SINK], stdout=subprocess.PIPE)
    sink_port = int(sink.stdout.readline())
    mailer = subprocess.Popen(
        [sys.executable, __file__, "--role", MAILER, "--sink-port", str(sink_port)],
        stdout=subprocess.PIPE,
    )
    mailer_port = int(mailer.stdout.readline())
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = args.concurrency
    client = HTTPClient(Agent.usingEndpointFactory(reactor, NoDelayEndpoints(reactor), pool=pool))
    url = f"http://127.0.0.1:{mailer_port}/api/mailer/send".encode()
    results = []
    try:
        workloads = [
            ("small text", args.count, None),
            ("1 MiB attachment", args.large_count, os.urandom(1024 * 1024)),
        ]
        for name, count, attachment in workloads:
            bodies = [json.dumps(message_json(i, attachment)).encode() for i in range(count)]
            mimes = [
                build_mime(parse_send_request(json.loads(b)).message, now=time.time())
                for b in bodies[: min(count, 64)]
            ]

            async def direct(i, nodelay=True, mimes=mimes):
                done: Deferred = Deferred()
                factory = ESMTPSenderFactory(
                    None,
                    None,
                    "noreply@example.com",
                    [f"alice{i}@example.com"],
                    BytesIO(mimes[i % len(mimes)]),
                    done,
                    retries=0,
                    timeout=30,
                    requireAuthentication=False,
                    requireTransportSecurity=False,
                )
                factory.noisy = False
                if nodelay:
                    factory.protocol = NoDelaySender
                reactor.connectTCP("127.0.0.1", sink_port, factory)
                await done.addTimeout(60, reactor)

            async def via_gorge(i, bodies=bodies):
                response = await client.post(
                    url,
                    data=OneShotBody(bodies[i]),
                    headers={
                        b"Content-Type": [b"application/json"],
                        b"X-Service-Token": [b"bench-token"],
                    },
                )
                body = await response.content()
                if response.code != 200:
                    raise RuntimeError(f"send {i}: {response.code} {body[:200]!r}")

            before = cpu_seconds(mailer.pid), cpu_seconds(sink.pid)
            stock = await run_pool(count, args.concurrency, lambda i: direct(i, nodelay=False))
            bound = await run_pool(count, args.concurrency, direct)
            middle = cpu_seconds(mailer.pid), cpu_seconds(sink.pid)
            gorge = await run_pool(count, args.concurrency, via_gorge)
            after = cpu_seconds(mailer.pid), cpu_seconds(sink.pid)
            if os.environ.get("GORGE_BENCH_VERBOSE"):
                print(
                    f"  {name}: sink cpu {middle[1] - before[1]:.2f}s (bound) "
                    f"{after[1] - middle[1]:.2f}s (gorge); mailer cpu "
                    f"{(after[0] - middle[0]) * 1000 / count:.2f} ms/message",
                    flush=True,
                )
            results.append((name, count, count / stock, count / bound, count / gorge))
    finally:
        await pool.closeCachedConnections()
        mailer_peak = peak_rss_mb(mailer.pid)
        for proc in (mailer, sink):
            proc.terminate()
            proc.wait(timeout=10)

    print("bound = stock twisted.mail client with TCP_NODELAY; the stock client without it is")
    print("shown for context (Nagle's algorithm stalls its lock-step SMTP commands).")
    print(
        f"{'workload':<18} {'messages':>8} {'stock msg/s':>12} {'bound msg/s':>12} "
        f"{'gorge msg/s':>12} {'ratio':>6}"
    )
    for name, count, stock_rate, bound_rate, gorge_rate in results:
        print(
            f"{name:<18} {count:>8} {stock_rate:>12.1f} {bound_rate:>12.1f} {gorge_rate:>12.1f} "
            f"{gorge_rate / bound_rate:>6.2f}"
        )
    print(f"peak RSS: gorge mailer {mailer_peak:.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=[SINK, MAILER], help=argparse.SUPPRESS)
    parser.add_argument("--sink-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=2000, help="small messages")
    parser.add_argument("--large-count", type=int, default=2000, help="1 MiB messages")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    if args.role == SINK:
        return run_sink()
    if args.role == MAILER:
        return run_mailer(args.sink_port)
    from twisted.internet import task

    task.react(
        lambda r: __import__(
            "twisted.internet.defer", fromlist=["Deferred"]
        ).Deferred.fromCoroutine(bench(r, args))
    )


if __name__ == "__main__":
    main()
