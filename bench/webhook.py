"""Benchmark: Herald webhook deliveries through gorge-webhook on MySQL.

Starts a throwaway MariaDB (tests/support) and a minimal receiver in its own
process (answers 200 at once), then, in this process and with the same
concurrency (GORGE_WEBHOOK_MAX_CONCURRENT, default 8):

1. raw HTTP bound: the N signed bodies POSTed by a bare treq client, no database;
2. raw SQL bound: the claim + finish statements (plus the candidate query per
   batch) issued directly for N queued rows, no HTTP;
3. the daemon: one gorge-webhook service drains N queued rows over H hooks;
4. pickup latency: single rows inserted into the idle daemon at random moments
   (default 1 s poll interval), time from the INSERT's commit to the receiver.

Prints deliveries/s next to both bounds and the ratio to the lower one.

Usage: python bench/webhook.py [--rows 2000] [--hooks 50] [--latency-samples 30]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from twisted.internet.defer import Deferred, DeferredSemaphore, gatherResults  # noqa: E402
from twisted.internet.task import deferLater, react  # noqa: E402
from twisted.logger import globalLogBeginner  # noqa: E402

from gorge.logging import make_observer  # noqa: E402
from tests.support.mariadb_server import MariaDBServer  # noqa: E402

RECEIVER = r"""
import sys, time
from twisted.internet import reactor
from twisted.web import resource, server

class Hook(resource.Resource):
    isLeaf = True
    def render_POST(self, request):
        request.content.read()
        if request.path.startswith(b"/pickup"):
            sys.stdout.write("%.6f\n" % time.time())
            sys.stdout.flush()
        return b"ok"

site = server.Site(Hook())
site.log = lambda request: None
port = reactor.listenTCP(0, site, interface="127.0.0.1")
sys.stdout.write("%d\n" % port.getHost().port)
sys.stdout.flush()
reactor.run()
"""

PHORGE_RATE = 270.0  # deliveries/s of Phorge's PHP worker on the same kind of machine
PHORGE_PICKUP = 0.8  # seconds, median pickup of Phorge's worker
POLL = 1.0  # the default poll interval, used by the daemon under test


def start_receiver() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, bufsize=1)
    return proc, int(proc.stdout.readline())


def properties(n: int) -> str:
    return json.dumps({"retry": "forever",
                       "transactionPHIDs": [f"PHID-XACT-TASK-{n:015d}a", f"PHID-XACT-TASK-{n:015d}b"],
                       "triggerPHIDs": ["PHID-HRUL-cccccccccccccccccccc"],
                       "silent": False, "secure": False}, separators=(",", ":"))


def seed(db: MariaDBServer, name: str, base: str, rows: int, hooks: int, now: int) -> list[str]:
    conn = db.connect(name)
    phids = [f"PHID-HWBH-bench{i:015d}" for i in range(hooks)]
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO herald_webhook (phid, name, webhookURI, viewPolicy, editPolicy, status,"
            " hmacKey, dateCreated, dateModified) VALUES (%s, %s, %s, 'users', 'users',"
            " 'enabled', %s, %s, %s)",
            [(p, f"hook {i}", f"{base}/hook/{i}", "k" * 32, now, now) for i, p in enumerate(phids)])
        cur.executemany(
            "INSERT INTO herald_webhookrequest (phid, webhookPHID, objectPHID, status, properties,"
            " lastRequestResult, lastRequestEpoch, dateCreated, dateModified)"
            " VALUES (%s, %s, %s, 'queued', %s, 'none', 0, %s, %s)",
            [(f"PHID-HWBR-bench{n:015d}", phids[n % hooks], f"PHID-TASK-{n:020d}", properties(n),
              now, now) for n in range(rows)])
    conn.close()
    return phids


class Bench:
    def __init__(self, reactor, db: MariaDBServer, base: str, args) -> None:
        self.reactor = reactor
        self.db = db
        self.base = base
        self.args = args
        self.concurrency = int(os.environ.get("GORGE_WEBHOOK_MAX_CONCURRENT") or 8)

    def settings(self, database: str, **overrides):
        from gorge.config import HttpSettings
        from gorge.webhook.settings import WebhookSettings

        values = dict(http=HttpSettings("127.0.0.1:0", "tcp:0:interface=127.0.0.1"),
                      mysql=self.db.settings(database), max_concurrent=self.concurrency,
                      outbound_blacklist=())
        values.update(overrides)
        return WebhookSettings(**values)

    async def raw_http(self) -> float:
        """Bare treq, same bodies and signatures, same concurrency, no database."""
        from treq.client import HTTPClient
        from twisted.web.client import Agent, HTTPConnectionPool

        from gorge.webhook import payload

        pool = HTTPConnectionPool(self.reactor, persistent=True)
        pool.maxPersistentPerHost = self.concurrency
        client = HTTPClient(Agent(self.reactor, pool=pool))
        bodies = []
        for n in range(self.args.rows):
            body = payload.build_body(f"PHID-TASK-{n:020d}", 1, payload.parse_properties(properties(n)))
            bodies.append((f"{self.base}/hook/{n % self.args.hooks}", body,
                           {"Content-Type": "application/json",
                            payload.SIGNATURE_HEADER: payload.sign("k" * 32, body)}))
        semaphore = DeferredSemaphore(self.concurrency)

        async def post(url, body, headers):
            response = await client.post(url, data=body, headers=headers)
            await response.content()

        started = time.perf_counter()
        await gatherResults([semaphore.run(lambda a=a: Deferred.fromCoroutine(post(*a)))
                             for a in bodies])
        elapsed = time.perf_counter() - started
        await pool.closeCachedConnections()
        return self.args.rows / elapsed

    async def raw_sql(self) -> float:
        """The candidate query per batch, then claim + finish per row, issued directly."""
        from gorge.webhook import payload
        from gorge.webhook.store import WebhookStore

        name = self.db.create_database("herald", "rawsql_herald")
        seed(self.db, name, self.base, self.args.rows, self.args.hooks, int(time.time()) - 5)
        store = WebhookStore.mysql(self.db.settings(name), self.reactor)
        semaphore = DeferredSemaphore(self.concurrency)
        batch = self.concurrency * 8

        async def one(candidate):
            if await store.claim(candidate):
                await store.finish(candidate, "sent", "okay",
                                   payload.with_outcome(json.loads(candidate.properties), "http", 200))

        started = time.perf_counter()
        while True:
            rows = await store.candidates(limit=batch, lease=30, backoff=60)
            if not rows:
                break
            await gatherResults([semaphore.run(lambda c=c: Deferred.fromCoroutine(one(c)))
                                 for c in rows])
        elapsed = time.perf_counter() - started
        store.close()
        return self.args.rows / elapsed

    async def daemon(self) -> tuple[float, tuple[list[float], list[float]]]:
        from prometheus_client import CollectorRegistry

        from gorge.webhook.service import build_webhook_service

        name = self.db.create_database("herald", "daemon_herald")
        seed(self.db, name, self.base, self.args.rows, self.args.hooks, int(time.time()) - 5)
        registry = CollectorRegistry()
        service = build_webhook_service(self.settings(name), self.reactor, registry=registry)

        def delivered() -> float:
            return registry.get_sample_value("gorge_webhook_deliveries_total",
                                             {"outcome": "sent"}) or 0.0

        started = time.perf_counter()
        service.startService()
        while delivered() < self.args.rows:
            await deferLater(self.reactor, 0.005)
        rate = self.args.rows / (time.perf_counter() - started)
        latencies = await self.pickup(name, service)
        await service.stopService()
        return rate, latencies

    async def pickup(self, name: str, service) -> tuple[list[float], list[float]]:
        """Rows inserted into the idle daemon at phases spread evenly over one poll interval.

        Each sample waits for a tick, then inserts at tick + phase (phases
        (i + 0.5) / n in random order, so the n samples cover the interval
        like uniform arrivals, without the sampling noise of n random
        draws). Returns (insert -> POST arrival, tick start -> POST arrival
        for the tick that picked the row up).
        """
        ticks: list[float] = []
        tick = service.dispatcher.tick

        async def timed_tick() -> None:
            ticks.append(time.time())
            await tick()

        service.dispatcher.tick = timed_tick
        conn = self.db.connect(name)
        with conn.cursor() as cur:
            cur.execute("INSERT INTO herald_webhook (phid, name, webhookURI, viewPolicy,"
                        " editPolicy, status, hmacKey, dateCreated, dateModified) VALUES"
                        " ('PHID-HWBH-pickup', 'p', %s, 'u', 'u', 'enabled', %s, 1, 1)",
                        (f"{self.base}/pickup", "k" * 32))
        samples = self.args.latency_samples
        phases = [(i + 0.5) / samples for i in range(samples)]
        random.shuffle(phases)
        latencies, after_tick = [], []
        for n, phase in enumerate(phases):
            seen = len(ticks)
            while len(ticks) == seen:
                await deferLater(self.reactor, 0.002)
            await deferLater(self.reactor, max(ticks[-1] + phase * POLL - time.time(), 0))
            now = int(time.time())
            with conn.cursor() as cur:
                cur.execute(
                    "INSERT INTO herald_webhookrequest (phid, webhookPHID, objectPHID, status,"
                    " properties, lastRequestResult, lastRequestEpoch, dateCreated, dateModified)"
                    " VALUES (%s, 'PHID-HWBH-pickup', 'PHID-TASK-pickup', 'queued', '{}', 'none',"
                    " 0, %s, %s)", (f"PHID-HWBR-pickup{n:010d}", now, now))
            inserted = time.time()
            arrived = await self.reactor_readline()
            latencies.append(arrived - inserted)
            after_tick.append(arrived - max(t for t in ticks if t <= arrived))
        conn.close()
        return latencies, after_tick

    async def reactor_readline(self) -> float:
        # The receiver prints the arrival time of each /pickup POST; read it off the reactor thread.
        from twisted.internet.threads import deferToThread

        line = await deferToThread(self.receiver_stdout.readline)
        return float(line)


async def main(reactor, args) -> None:
    log_stream = open(os.devnull, "w")
    # A deployment logs at info: one line per delivery is part of the cost measured.
    globalLogBeginner.beginLoggingTo(
        [make_observer({"GORGE_LOG_LEVEL": args.log_level}, log_stream)],
        redirectStandardIO=False)
    db = MariaDBServer()
    db.start()
    receiver, port = start_receiver()
    try:
        bench = Bench(reactor, db, f"http://127.0.0.1:{port}", args)
        bench.receiver_stdout = receiver.stdout
        http_rate = await bench.raw_http()
        sql_rate = await bench.raw_sql()
        daemon_rate, (latencies, after_tick) = await bench.daemon()
    finally:
        receiver.terminate()
        receiver.wait(10)
        db.stop()
    lower = min(http_rate, sql_rate)
    latencies.sort()
    p50 = statistics.median(latencies)
    p90 = latencies[int(0.9 * (len(latencies) - 1))]
    poll = POLL
    print(f"rows={args.rows} hooks={args.hooks} concurrency={bench.concurrency}"
          f" log_level={args.log_level}")
    print(f"raw HTTP bound (bare treq, no DB):     {http_rate:8.0f} POST/s")
    print(f"raw SQL bound (claim+finish, no HTTP): {sql_rate:8.0f} rows/s")
    print(f"gorge-webhook (one daemon):            {daemon_rate:8.0f} deliveries/s")
    print(f"ratio to the lower bound:              {daemon_rate / lower:8.2f}"
          f"   (target >= 0.5; Phorge PHP worker ~{PHORGE_RATE:.0f}/s,"
          f" x{daemon_rate / PHORGE_RATE:.1f})")
    print(f"pickup latency (poll {poll:.1f} s): p50 {p50 * 1000:.0f} ms, p90 {p90 * 1000:.0f} ms,"
          f" max {latencies[-1] * 1000:.0f} ms   (target p50 < {(poll / 2 + 0.02) * 1000:.0f} ms;"
          f" Phorge ~{PHORGE_PICKUP * 1000:.0f} ms)")
    print(f"  of which after the tick (select, claim, POST): p50"
          f" {statistics.median(after_tick) * 1000:.0f} ms, max {max(after_tick) * 1000:.0f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--hooks", type=int, default=50)
    parser.add_argument("--latency-samples", type=int, default=40)
    parser.add_argument("--log-level", default="info")
    react(main, (parser.parse_args(),))
