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
                    self.buffer = self.buffer[end + 5:]
                    self.in_data = False
                    self.transport.write(b"250 2.0.0 queued\r\n")
                    continue
                end = self.buffer.find(b"\r\n")
                if end < 0:
                    return
                line, self.buffer = self.buffer[:end], self.buffer[end + 2:]
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

    mailers = [{"key": "sink", "type": "smtp",
                "options": {"host": "127.0.0.1", "port": sink_port, "helo": "bench"}}]
    settings = load_mailer_settings({"GORGE_MAILER_CONFIG": json.dumps(mailers),
                                     "GORGE_SERVICE_TOKEN": "bench-token",
                                     "GORGE_MAILER_MAX_RETRIES": "0"})
    service = build_mailer_service(settings, reactor, listen=False)
    service.startService()
    port = reactor.listenTCP(0, service.site, interface="127.0.0.1", backlog=256)
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
        "headers": [{"name": "X-Phabricator-Sent-This-Message", "value": "Yes"},
                    {"name": "X-Phabricator-Mail-ID", "value": str(i)}],
    }
    if attachment is not None:
        message["attachments"] = [{"filename": "blob.bin", "mimeType": "application/octet-stream",
                                   "data": base64.b64encode(attachment).decode()}]
    return {"message": message}


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
    from twisted.mail.smtp import ESMTPSenderFactory
    from twisted.web.client import Agent, HTTPConnectionPool

    from gorge.mailer.message import parse_send_request
    from gorge.mailer.mime import build_mime

    sink = subprocess.Popen([sys.executable, __file__, "--role", SINK], stdout=subprocess.PIPE)
    sink_port = int(sink.stdout.readline())
    mailer = subprocess.Popen([sys.executable, __file__, "--role", MAILER,
                               "--sink-port", str(sink_port)], stdout=subprocess.PIPE)
    mailer_port = int(mailer.stdout.readline())
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = args.concurrency
    client = HTTPClient(Agent(reactor, pool=pool, connectTimeout=5))
    url = f"http://127.0.0.1:{mailer_port}/api/mailer/send".encode()
    results = []
    try:
        workloads = [("small text", args.count, None),
                     ("1 MiB attachment", args.large_count, os.urandom(1024 * 1024))]
        for name, count, attachment in workloads:
            bodies = [json.dumps(message_json(i, attachment)).encode() for i in range(count)]
            mimes = [build_mime(parse_send_request(json.loads(b)).message, now=time.time())
                     for b in bodies[: min(count, 64)]]

            async def direct(i):
                done: Deferred = Deferred()
                factory = ESMTPSenderFactory(
                    None, None, "noreply@example.com", [f"alice{i}@example.com"],
                    BytesIO(mimes[i % len(mimes)]), done, retries=0, timeout=30,
                    requireAuthentication=False, requireTransportSecurity=False)
                factory.noisy = False
                reactor.connectTCP("127.0.0.1", sink_port, factory)
                await done.addTimeout(60, reactor)

            async def via_gorge(i):
                response = await client.post(
                    url, data=bodies[i], headers={b"Content-Type": [b"application/json"],
                                                  b"X-Service-Token": [b"bench-token"]})
                body = await response.content()
                if response.code != 200:
                    raise RuntimeError(f"send {i}: {response.code} {body[:200]!r}")

            bound = await run_pool(count, args.concurrency, direct)
            gorge = await run_pool(count, args.concurrency, via_gorge)
            results.append((name, count, count / bound, count / gorge))
    finally:
        await pool.closeCachedConnections()
        for proc in (mailer, sink):
            proc.terminate()
            proc.wait(timeout=10)

    print(f"{'workload':<18} {'messages':>8} {'bound msg/s':>12} {'gorge msg/s':>12} {'ratio':>6}")
    for name, count, bound_rate, gorge_rate in results:
        print(f"{name:<18} {count:>8} {bound_rate:>12.1f} {gorge_rate:>12.1f} "
              f"{gorge_rate / bound_rate:>6.2f}")


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
    from twisted.internet import reactor, task

    task.react(lambda r: __import__("twisted.internet.defer", fromlist=["Deferred"])
               .Deferred.fromCoroutine(bench(r, args)))


if __name__ == "__main__":
    main()
