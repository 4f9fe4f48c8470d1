"""Benchmark: no-op tasks through gorge-taskqueue + gorge-worker on MySQL.

Starts a throwaway MariaDB (gorge.testing) and gorge-taskqueue as its own
twistd process, then in this process measures, on the same queue:

1. the queue-only cycle rate: a bare HTTP client leases and completes the
   tasks with the worker's batch size and concurrency (the raw bound);
2. the end-to-end rate: the real worker service drains the same number of
   tasks through its consume loop, registry and report path;
3. the pickup latency of one task enqueued into an idle worker (default poll
   interval), p50 and p99.

Usage: python bench/worker.py [--tasks 5000] [--lease-limit 32]
       [--max-workers 32] [--rounds 3] [--latency-samples 40] [--poll-ms 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
from gorge.testing.mariadb_server import MariaDBServer  # noqa: E402
from gorge.testing.procs import free_port  # noqa: E402

NAMESPACE = "bench"
TOKEN = "bench-token"
TASK_CLASS = "BenchNoopWorker"


def start_queue(db: MariaDBServer, workdir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {
        **os.environ,
        "GORGE_LISTEN_ADDR": f"127.0.0.1:{port}",
        "GORGE_SERVICE_TOKEN": TOKEN,
        "GORGE_TASKQUEUE_BACKEND": "mysql",
        "GORGE_TASKQUEUE_MYSQL_HOST": db.host,
        "GORGE_TASKQUEUE_MYSQL_PORT": str(db.port),
        "GORGE_TASKQUEUE_MYSQL_USER": db.user,
        "GORGE_TASKQUEUE_MYSQL_PASS": db.password,
        "GORGE_TASKQUEUE_NAMESPACE": NAMESPACE,
        "GORGE_LOG_LEVEL": "warn",
        "PYTHONPATH": str(ROOT),
    }
    twistd = str(Path(sys.executable).with_name("twistd"))
    argv = [twistd, "--nodaemon", "--pidfile=",
            "--logger=gorge.logging.observer_from_env", "gorge-taskqueue"]
    log = open(workdir / "taskqueue.log", "ab")
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    return proc, f"http://127.0.0.1:{port}"


def stop_queue(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


class Bench:
    def __init__(self, reactor, queue_url: str, args) -> None:
        from treq.client import HTTPClient
        from twisted.web.client import Agent, HTTPConnectionPool

        self.reactor = reactor
        self.url = queue_url
        self.args = args
        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.pool.maxPersistentPerHost = args.max_workers + 4
        self.http = HTTPClient(Agent(reactor, pool=self.pool))

    async def call(self, path: str, body: dict, headers: dict | None = None):
        response = await self.http.post(
            self.url + path, json.dumps(body).encode(),
            headers={"X-Service-Token": TOKEN, "Content-Type": "application/json",
                     **(headers or {})})
        data = json.loads(await response.content())
        if response.code != 200:
            raise RuntimeError(f"{path}: {response.code} {data}")
        return data["data"]

    async def wait_ready(self) -> None:
        for _ in range(600):
            try:
                response = await self.http.get(self.url + "/healthz")
                await response.content()
                if response.code == 200:
                    return
            except Exception:
                pass
            await deferLater(self.reactor, 0.1)
        raise RuntimeError("taskqueue did not come up")

    async def enqueue(self, count: int) -> None:
        sem = DeferredSemaphore(16)
        await gatherResults([
            sem.run(lambda: Deferred.fromCoroutine(
                self.call("/api/queue/enqueue", {"taskClass": TASK_CLASS, "data": "{}"})))
            for _ in range(count)
        ])

    async def queue_only(self, count: int) -> float:
        """Lease and complete ``count`` tasks with the worker's shape: one
        lease in flight, batches within free capacity, one complete each."""
        limit, cap = self.args.lease_limit, self.args.max_workers
        done = 0
        running: set[Deferred] = set()
        started = time.perf_counter()
        while done < count:
            free = cap - len(running)
            if free <= 0:
                await _first(running)
                continue
            tasks = await self.call("/api/queue/lease", {"limit": min(limit, free),
                                                         "taskClasses": [TASK_CLASS]},
                                    {"X-Lease-Owner": "bench:1:1:queue-only"})
            if not tasks and not running:
                if done >= count:
                    break
                raise RuntimeError(f"queue ran dry after {done} tasks")
            for task in tasks:
                d = Deferred.fromCoroutine(
                    self.call("/api/queue/complete", {"taskID": task["id"], "duration": 1}))
                running.add(d)

                def finished(result, d=d):
                    nonlocal done
                    running.discard(d)
                    done += 1
                    return result

                d.addCallback(finished)
            if not tasks:
                await _first(running)
        await gatherResults(list(running))
        return count / (time.perf_counter() - started)

    def build_worker(self, poll_ms: int, picked: list | None = None):
        from gorge.worker.service import build_worker_service
        from gorge.worker.settings import load_worker_settings

        env = {
            "GORGE_LISTEN_ADDR": "127.0.0.1:0",
            "GORGE_WORKER_TASK_QUEUE_URL": self.url,
            "GORGE_WORKER_TASK_QUEUE_TOKEN": TOKEN,
            "GORGE_WORKER_LEASE_LIMIT": str(self.args.lease_limit),
            "GORGE_WORKER_MAX_WORKERS": str(self.args.max_workers),
            "GORGE_WORKER_POLL_INTERVAL_MS": str(poll_ms),
            "GORGE_WORKER_TASK_CLASS_FILTER": TASK_CLASS,
        }
        if picked is None:
            # The worker's own no-op handler, as an operator configures it.
            env["GORGE_WORKER_NOOP_CLASSES"] = TASK_CLASS
            return build_worker_service(load_worker_settings(env), self.reactor)

        def record_pickup(task, data):
            picked.append(self.reactor.seconds())

        return build_worker_service(load_worker_settings(env), self.reactor,
                                    extra_handlers={TASK_CLASS: record_pickup})

    async def end_to_end(self, count: int) -> float:
        worker = self.build_worker(poll_ms=10)
        counters = worker.part("consumer").counters
        started = time.perf_counter()
        worker.startService()
        try:
            while counters.processed < count:
                if counters.unreported:
                    raise RuntimeError("worker left tasks unreported")
                await deferLater(self.reactor, 0.005)
            elapsed = time.perf_counter() - started
        finally:
            await worker.stopService()
        return count / elapsed

    async def pickup_latency(self, samples: int, poll_ms: int) -> list[float]:
        picked: list[float] = []
        worker = self.build_worker(poll_ms=poll_ms, picked=picked)
        worker.startService()
        latencies = []
        try:
            await deferLater(self.reactor, 1.5)  # idle: the loop is polling an empty queue
            for index in range(samples):
                # Spread enqueue times over the poll cycle.
                await deferLater(self.reactor, 0.137 * (index % 7) + 0.05)
                before = len(picked)
                sent = self.reactor.seconds()
                await self.call("/api/queue/enqueue", {"taskClass": TASK_CLASS, "data": "{}"})
                for _ in range(2000):
                    if len(picked) > before:
                        break
                    await deferLater(self.reactor, 0.002)
                latencies.append(picked[before] - sent)
        finally:
            await worker.stopService()
        return latencies


async def _first(pending: set[Deferred]) -> None:
    waiter: Deferred = Deferred()
    for d in list(pending):
        d.addBoth(lambda r: (waiter.called or waiter.callback(None), r)[1])
    await waiter


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


async def run(reactor, args, queue_url: str) -> None:
    bench = Bench(reactor, queue_url, args)
    await bench.wait_ready()
    print(f"tasks={args.tasks} lease_limit={args.lease_limit} max_workers={args.max_workers}")
    raws, e2es = [], []
    for round_no in range(1, args.rounds + 1):
        # Alternate the two measurements so load from elsewhere on the machine
        # hits both alike; the medians are the figures to compare.
        t0 = time.perf_counter()
        await bench.enqueue(args.tasks)
        enqueue_rate = args.tasks / (time.perf_counter() - t0)
        raws.append(await bench.queue_only(args.tasks))
        await bench.enqueue(args.tasks)
        e2es.append(await bench.end_to_end(args.tasks))
        print(f"round {round_no}: enqueue {enqueue_rate:6.0f}/s  queue only {raws[-1]:6.0f}/s  "
              f"worker e2e {e2es[-1]:6.0f}/s  ratio {e2es[-1] / raws[-1]:.2f}")
    raw, e2e = statistics.median(raws), statistics.median(e2es)
    print(f"queue only:     {raw:8.0f} tasks/s  (median; lease+complete, raw bound)")
    print(f"worker e2e:     {e2e:8.0f} tasks/s  (median) ratio {e2e / raw:.2f} "
          f"(targets: ratio >= 0.70, >= 1350 tasks/s)")
    latencies = await bench.pickup_latency(args.latency_samples, args.poll_ms)
    print(f"pickup latency (idle, poll {args.poll_ms} ms, {len(latencies)} samples): "
          f"p50 {percentile(latencies, 0.5) * 1000:.0f} ms, "
          f"p99 {percentile(latencies, 0.99) * 1000:.0f} ms")
    await bench.pool.closeCachedConnections()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--lease-limit", type=int, default=32)
    parser.add_argument("--max-workers", type=int, default=32)
    parser.add_argument("--latency-samples", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating queue-only / worker measurements (default 3)")
    parser.add_argument("--poll-ms", type=int, default=1000,
                        help="poll interval of the worker in the latency phase (default 1000)")
    args = parser.parse_args()
    globalLogBeginner.beginLoggingTo(
        [make_observer({"GORGE_LOG_LEVEL": "warn"}, sys.stderr)], redirectStandardIO=False)
    db = MariaDBServer()
    db.start()
    queue = None
    try:
        db.create_database("worker", name=f"{NAMESPACE}_worker")
        queue, url = start_queue(db, Path(db._dir))
        react(lambda reactor: Deferred.fromCoroutine(run(reactor, args, url)))
    finally:
        if queue is not None:
            stop_queue(queue)
        db.stop()


if __name__ == "__main__":
    main()
