"""Benchmark: no-op tasks through gorge-taskqueue + gorge-worker.

Starts a throwaway backend (gorge_testing), then gorge-taskqueue and
gorge-worker under twistd as an operator runs them (the worker at its
default settings unless told otherwise), and measures on the same queue:

1. the queue-only bound: a bare HTTP client in this process leases with the
   worker's batch size and concurrency and reports each lease's tasks in one
   call (``/api/queue/report``, single completes on a queue without it);
2. end to end: the same number of no-op tasks appear at once (written in one
   transaction, as Phorge writes rows) and the running worker drains them;
   the rate counts from the write to the worker's last report;
3. the pickup latency of one task given to an idle worker, enqueued through
   the queue's API and written straight to storage (Phorge's own inserts, or
   another replica), measured at an HTTP receiver the task posts to;
4. with ``--backlog N``: N tasks written before the worker starts, drained
   by it, with the peak memory of both daemons.

Every phase prints the load average; the daemons' peak memory is printed at
the end.

Usage: python bench/worker.py [--backend mysql] [--tasks 5000] [--rounds 3]
       [--lease-limit 32] [--max-workers 32] [--latency-samples 40] [--backlog 0]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemons import TOKEN, Daemon, load_average, start_backend, top_entries  # noqa: E402
from twisted.internet.defer import Deferred, gatherResults  # noqa: E402
from twisted.internet.task import deferLater, react  # noqa: E402
from twisted.logger import globalLogBeginner  # noqa: E402
from twisted.web.resource import Resource  # noqa: E402
from twisted.web.server import Site  # noqa: E402

from gorge.log.output import make_observer  # noqa: E402
from gorge.taskqueue.model import EnqueueRequest, Task  # noqa: E402

try:
    from gorge.worker.settings import (  # noqa: E402
        DEFAULT_LEASE_WAIT_SEC,
        DEFAULT_REPORT_BATCH,
        DEFAULT_REPORT_DELAY_MS,
    )
except ImportError:  # a tree from before long-poll and batched reports
    DEFAULT_LEASE_WAIT_SEC, DEFAULT_REPORT_BATCH, DEFAULT_REPORT_DELAY_MS = 0, 1, 0
try:
    from gorge.worker.settings import DEFAULT_LEASE_LIMIT, DEFAULT_MAX_WORKERS  # noqa: E402
except ImportError:  # a tree from before batches of 32
    DEFAULT_LEASE_LIMIT, DEFAULT_MAX_WORKERS = 4, 4

NOOP_CLASS = "BenchNoopWorker"
BOUND_CLASS = "BenchBoundWorker"
FEED_CLASS = "FeedPublisherHTTPWorker"
IMPORT_CHUNK = 2000


def noop_tasks(count: int, task_class: str, now: int) -> list[Task]:
    return [
        Task(
            id=0,
            task_class=task_class,
            lease_owner=None,
            lease_expires=None,
            failure_count=0,
            data_id=0,
            failure_time=None,
            priority=2000,
            object_phid=None,
            container_phid=None,
            date_created=now,
            date_modified=now,
            data="{}",
        )
        for _ in range(count)
    ]


class Receiver(Resource):
    """Where the pickup tasks post: the arrival time of each sample."""

    isLeaf = True

    def __init__(self, clock) -> None:
        super().__init__()
        self._clock = clock
        self.arrived: dict[str, float] = {}

    def render_POST(self, request):
        self.arrived[request.content.read().decode()] = self._clock.seconds()
        return b"ok"


class Bench:
    def __init__(self, reactor, args, backend, queue: Daemon) -> None:
        from treq.client import HTTPClient
        from twisted.web.client import Agent, HTTPConnectionPool

        self.reactor = reactor
        self.args = args
        self.queue = queue
        self.store = backend.store(reactor, "bench")
        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.pool.maxPersistentPerHost = args.max_workers + 4
        self.http = HTTPClient(Agent(reactor, pool=self.pool))
        self.batched_reports = True
        self.worker: Daemon | None = None

    async def call(self, url: str, body: dict | None = None, headers: dict | None = None):
        headers = {"X-Service-Token": TOKEN, "Content-Type": "application/json", **(headers or {})}
        if body is None:
            response = await self.http.get(url, headers=headers)
        else:
            response = await self.http.post(url, json.dumps(body).encode(), headers=headers)
        data = json.loads(await response.content())
        if response.code != 200:
            raise RuntimeError(f"{url}: {response.code} {data}")
        return data["data"]

    async def write_tasks(self, count: int, task_class: str, chunk: int | None = None) -> None:
        """``count`` tasks written as Phorge writes its rows (not through the
        queue's API), in one transaction unless ``chunk`` says otherwise."""
        now = int(self.reactor.seconds())
        chunk = chunk or count
        for start in range(0, count, chunk):
            n = min(chunk, count - start)
            await self.store.import_tasks(noop_tasks(n, task_class, now), "gorge-bench", 1)

    # -- 1. the bound ------------------------------------------------------------

    async def report(self, tasks: list[dict], owner: str) -> None:
        if self.batched_reports:
            try:
                await self.call(
                    self.queue.url + "/api/queue/report",
                    {
                        "reports": [
                            {"taskID": t["id"], "outcome": "complete", "duration": 1} for t in tasks
                        ]
                    },
                    {"X-Lease-Owner": owner},
                )
                return
            except RuntimeError as e:
                if ": 404 " not in str(e):
                    raise
                self.batched_reports = False  # an older queue
        await gatherResults(
            [
                Deferred.fromCoroutine(
                    self.call(
                        self.queue.url + "/api/queue/complete",
                        {"taskID": t["id"], "duration": 1},
                        {"X-Lease-Owner": owner},
                    )
                )
                for t in tasks
            ]
        )

    async def queue_only(self, count: int) -> float:
        """Lease and report ``count`` tasks with the worker's shape: one lease
        in flight, batches within free capacity, one report call per lease."""
        limit, cap = self.args.lease_limit, self.args.max_workers
        owner = "bench:1:1:queue-only"
        done = 0
        running: dict[Deferred, int] = {}
        await self.write_tasks(count, BOUND_CLASS)
        started = time.perf_counter()
        while done < count:
            free = cap - sum(running.values())
            if free <= 0:
                await _first(running)
                continue
            tasks = await self.call(
                self.queue.url + "/api/queue/lease",
                {"limit": min(limit, free), "taskClasses": [BOUND_CLASS]},
                {"X-Lease-Owner": owner},
            )
            if not tasks and not running:
                if done >= count:
                    break  # the last report finished while this lease was out
                raise RuntimeError(f"queue ran dry after {done} tasks")
            if tasks:
                d = Deferred.fromCoroutine(self.report(tasks, owner))
                running[d] = len(tasks)

                def finished(result, d=d):
                    nonlocal done
                    done += running.pop(d)
                    return result

                d.addCallback(finished)
            else:
                await _first(running)
        await gatherResults(list(running))
        return count / (time.perf_counter() - started)

    # -- 2. end to end -------------------------------------------------------------

    async def processed(self) -> int:
        stats = await self.call(self.worker.url + "/api/worker/stats")
        return int(stats["processed"])

    async def end_to_end(self, count: int) -> float:
        base = await self.processed()
        # The clock starts at the commit, as the bound's starts after its
        # write: the rows are invisible to the worker until then.
        await self.write_tasks(count, NOOP_CLASS)
        started = time.perf_counter()
        while await self.processed() < base + count:
            await deferLater(self.reactor, 0.02)
        return count / (time.perf_counter() - started)

    # -- 3. pickup latency -------------------------------------------------------

    async def pickup_latency(
        self, samples: int, receiver: Receiver, hook: str, direct: bool
    ) -> list[float]:
        latencies = []
        for index in range(samples):
            # An idle worker, its lease call held; spread over the wait.
            await deferLater(self.reactor, 0.05 + 0.113 * (index % 7))
            key = f"{'direct' if direct else 'api'}-{index}"
            data = json.dumps({"deliveryVersion": 1, "uri": hook, "body": key})
            sent = self.reactor.seconds()
            if direct:
                await self.store.enqueue(EnqueueRequest(FEED_CLASS, data))
            else:
                await self.call(
                    self.queue.url + "/api/queue/enqueue", {"taskClass": FEED_CLASS, "data": data}
                )
            for _ in range(5000):
                if key in receiver.arrived:
                    break
                await deferLater(self.reactor, 0.001)
            else:
                raise RuntimeError(f"pickup sample {key} never arrived")
            latencies.append(receiver.arrived[key] - sent)
        return latencies

    async def settle(self) -> None:
        """Wait until the worker's lease calls are the held ones. Its first call
        after start does not wait (readiness) and the held calls begin one poll
        interval later (docs/worker.md, Long-poll): a round measured before that
        charges the worker's start-up to its first burst."""
        deadline = time.monotonic() + 30
        while await self.lease_calls() < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("gorge-worker made no lease call within 30 s")
            await deferLater(self.reactor, 0.05)
        await deferLater(self.reactor, self.args.poll_ms / 1000 + 0.2)

    async def lease_calls(self) -> float:
        text = await (await self.http.get(self.worker.url + "/metrics")).text()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("gorge_worker_lease_requests_total{")
        )


async def _first(pending) -> None:
    waiter: Deferred = Deferred()
    for d in list(pending):
        d.addBoth(lambda r: (waiter.called or waiter.callback(None), r)[1])
    await waiter


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def worker_env(args, queue: Daemon) -> dict:
    return {
        "GORGE_LOG_LEVEL": args.log_level,
        "GORGE_WORKER_TASK_QUEUE_URL": queue.url,
        "GORGE_WORKER_TASK_QUEUE_TOKEN": TOKEN,
        "GORGE_WORKER_LEASE_LIMIT": str(args.lease_limit),
        "GORGE_WORKER_MAX_WORKERS": str(args.max_workers),
        "GORGE_WORKER_POLL_INTERVAL_MS": str(args.poll_ms),
        "GORGE_WORKER_LEASE_WAIT_SEC": str(args.lease_wait),
        "GORGE_WORKER_REPORT_BATCH": str(args.report_batch),
        "GORGE_WORKER_REPORT_DELAY_MS": str(args.report_delay_ms),
        "GORGE_WORKER_NOOP_CLASSES": NOOP_CLASS,
        "GORGE_WORKER_TASK_CLASS_FILTER": f"{NOOP_CLASS},{FEED_CLASS}",
    }


async def run(reactor, args) -> None:
    backend = start_backend(args.backend)
    queue = worker = None
    monitor = None
    try:
        profiles = Path(args.profile) if args.profile else None
        queue = Daemon(
            "gorge-taskqueue",
            {**backend.env("bench"), "GORGE_LOG_LEVEL": args.log_level},
            backend.workdir,
            profile=profiles / "taskqueue.txt" if profiles else None,
        ).start()
        bench = Bench(reactor, args, backend, queue)
        worker = Daemon(
            "gorge-worker",
            worker_env(args, queue),
            backend.workdir,
            profile=profiles / "worker.txt" if profiles else None,
        )

        def sample() -> None:
            for daemon in (queue, worker):
                if daemon.proc is not None:
                    daemon.sample_memory()

        from twisted.internet.task import LoopingCall

        monitor = LoopingCall(sample)
        monitor.clock = reactor
        monitor.start(0.5)
        print(
            f"backend {args.backend}: lease_limit={args.lease_limit} "
            f"max_workers={args.max_workers} lease_wait={args.lease_wait}s "
            f"report_batch={args.report_batch} report_delay={args.report_delay_ms}ms "
            f"log_level={args.log_level}"
        )
        if args.backlog:
            started = time.perf_counter()
            await bench.write_tasks(args.backlog, NOOP_CLASS, chunk=IMPORT_CHUNK)
            written = time.perf_counter() - started
            bench.worker = worker.start()
            started = time.perf_counter()
            while await bench.processed() < args.backlog:
                await deferLater(reactor, 0.5)
            drained = time.perf_counter() - started
            print(
                f"backlog {args.backlog}: written in {written:.0f} s, drained in "
                f"{drained:.0f} s ({args.backlog / drained:.0f} tasks/s), load "
                f"{load_average()}; peak RSS so far: taskqueue {queue.peak_mb:.0f} MB, "
                f"worker {worker.peak_mb:.0f} MB"
            )
        else:
            bench.worker = worker.start()
            await bench.settle()
        raws, e2es = [], []
        for round_no in range(1, args.rounds + 1):
            # Alternate the two measurements so load from elsewhere on the
            # machine hits both alike; the medians are the figures to compare.
            raws.append(await bench.queue_only(args.tasks))
            e2es.append(await bench.end_to_end(args.tasks))
            print(
                f"round {round_no}: queue only {raws[-1]:6.0f}/s  worker e2e "
                f"{e2es[-1]:6.0f}/s  ratio {e2es[-1] / raws[-1]:.2f}  load {load_average()}"
            )
        raw, e2e = statistics.median(raws), statistics.median(e2es)
        print(f"queue only:     {raw:8.0f} tasks/s  (median; lease + report, the bound)")
        print(
            f"worker e2e:     {e2e:8.0f} tasks/s  (median) ratio {e2e / raw:.2f} "
            f"(target: ratio >= 0.9)"
        )
        if args.latency_samples:
            receiver = Receiver(reactor)
            port = reactor.listenTCP(0, Site(receiver), interface="127.0.0.1")
            hook = f"http://127.0.0.1:{port.getHost().port}/hook"
            try:
                await deferLater(reactor, 1.0)  # idle: the worker's lease call is held
                calls_before = await bench.lease_calls()
                for direct in (False, True):
                    latencies = await bench.pickup_latency(
                        args.latency_samples, receiver, hook, direct
                    )
                    how = (
                        "written to storage directly"
                        if direct
                        else "enqueued through the queue's API"
                    )
                    print(
                        f"pickup latency, {how} ({len(latencies)} samples): "
                        f"p50 {percentile(latencies, 0.5) * 1000:.1f} ms, "
                        f"p99 {percentile(latencies, 0.99) * 1000:.1f} ms  "
                        f"load {load_average()}"
                    )
                calls = await bench.lease_calls() - calls_before
                print(
                    f"lease calls during the pickup phase: {calls:.0f} for "
                    f"{2 * args.latency_samples} tasks"
                )
                if args.idle_seconds:
                    before = await bench.lease_calls()
                    await deferLater(reactor, args.idle_seconds)
                    idle = await bench.lease_calls() - before
                    print(
                        f"idle worker: {idle:.0f} lease calls in {args.idle_seconds:g} s "
                        f"(lease wait {args.lease_wait} s)"
                    )
            finally:
                await port.stopListening()
        sample()
        print(
            f"peak RSS: gorge-taskqueue {queue.peak_mb:.0f} MB, "
            f"gorge-worker {worker.peak_mb:.0f} MB (limit 120 MB)"
        )
        print(
            f"CPU so far: gorge-taskqueue {queue.cpu_seconds():.1f} s, "
            f"gorge-worker {worker.cpu_seconds():.1f} s"
        )
        await bench.pool.closeCachedConnections()
        await bench.store.close()
    finally:
        if monitor is not None and monitor.running:
            monitor.stop()
        for daemon in (worker, queue):
            if daemon is not None:
                daemon.stop()
        backend.stop()
    if args.profile:
        for name in ("taskqueue", "worker"):
            print(f"\nwhere gorge-{name} spends its time: own %, with callees %")
            for own, total, frame in top_entries(Path(args.profile) / f"{name}.txt"):
                print(f"  {own:5.1f} {total:5.1f}  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="mysql", choices=("mysql", "redis", "sqlite"))
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="alternating queue-only / worker measurements (default 3)",
    )
    parser.add_argument(
        "--lease-limit",
        type=int,
        default=DEFAULT_LEASE_LIMIT,
        help=f"GORGE_WORKER_LEASE_LIMIT (default: the worker's, {DEFAULT_LEASE_LIMIT})",
    )
    parser.add_argument(
        "--max-workers",
        type=int,
        default=DEFAULT_MAX_WORKERS,
        help=f"GORGE_WORKER_MAX_WORKERS (default: the worker's, {DEFAULT_MAX_WORKERS})",
    )
    parser.add_argument("--lease-wait", type=int, default=DEFAULT_LEASE_WAIT_SEC)
    parser.add_argument("--report-batch", type=int, default=DEFAULT_REPORT_BATCH)
    parser.add_argument("--report-delay-ms", type=int, default=DEFAULT_REPORT_DELAY_MS)
    parser.add_argument("--poll-ms", type=int, default=1000)
    parser.add_argument("--latency-samples", type=int, default=40)
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=0,
        help="also count the lease calls of an idle worker this long",
    )
    parser.add_argument(
        "--backlog",
        type=int,
        default=0,
        help="tasks written before the worker starts, drained first",
    )
    parser.add_argument("--log-level", default="warn")
    parser.add_argument(
        "--profile", default="", help="directory for py-spy samples of both daemons (needs py-spy)"
    )
    args = parser.parse_args()
    globalLogBeginner.beginLoggingTo(
        [make_observer({"GORGE_LOG_LEVEL": "warn"}, sys.stderr)], redirectStandardIO=False
    )
    react(lambda reactor: Deferred.fromCoroutine(run(reactor, args)))


if __name__ == "__main__":
    main()
