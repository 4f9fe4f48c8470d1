"""Benchmark: several replicas of one daemon sharing one store.

How the rate and the CPU per item change with the number of processes that
share the work, each a real ``twistd`` daemon at its default settings (only
addresses, tokens and the namespace are set):

* webhook: 1, 2 and 4 gorge-webhook replicas on one throwaway MariaDB
  (gorge_testing), one ``{namespace}_herald`` database per count. The
  replicas start and go idle; then N queued ``herald_webhookrequest`` rows
  over H hooks are committed in one transaction, as Phorge writes them, and
  the replicas deliver them to a receiver in this process (answers 200 at
  once and notes each object PHID, so a row POSTed twice shows). A count is
  done when every row is ``sent`` in the table.
* worker: one gorge-taskqueue (mysql backend, a queue of its own per count)
  and 1, 2 and 4 gorge-worker daemons leasing from it. The workers go idle
  (their lease calls held); then N no-op native tasks are committed in one
  transaction, as Phorge writes its rows, and the count is done when the
  workers together have reported N tasks (their ``/api/worker/stats``).

For each count it prints the rate from the commit to the last item, the bulk
rate between 10 % and 90 % of the items (webhooks: from the arrival times;
worker: from the polled progress), and the CPU per item: user + system time
from /proc of every gorge process of the run together (the replicas, and for
the worker the taskqueue too), and MariaDB's apart. The idle time between
the commit and the first poll that sees it is part of the first rate (a
poll interval is 1 s), so small sizes understate the bulk rate; use the
defaults, on a quiet machine, for figures to compare.

PHP tasks are not measured here: they need a Phorge checkout
(``bench/phorge.py --workloads php`` measures one worker against Phorge).

Usage: python bench/replicas.py [--counts 1,2,4] [--parts webhook,worker]
       [--rows 2000] [--hooks 50] [--tasks 5000] [--log-level info] [--quick]

``--quick`` is a smoke run (200 rows, 500 tasks); a size given beside it
still wins.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from twisted.internet.defer import Deferred  # noqa: E402
from twisted.internet.task import deferLater, react  # noqa: E402
from twisted.web.resource import Resource  # noqa: E402
from twisted.web.server import Site  # noqa: E402

from bench.daemons import TOKEN, Daemon, cpu_seconds, load_average, start_backend  # noqa: E402
from bench.webhook import properties  # noqa: E402
from bench.worker import NOOP_CLASS, noop_tasks  # noqa: E402
from gorge_testing.mariadb_server import MariaDBServer  # noqa: E402

PARTS = ("webhook", "worker")
QUICK = {"rows": 200, "tasks": 500}
DEFAULTS = {"rows": 2000, "tasks": 5000}
# How long a count may take before the run stops with what it saw.
DEADLINE = 600.0


@dataclass
class Result:
    part: str
    count: int
    items: int
    rate: float
    bulk_rate: float
    gorge_cpu: float
    db_cpu: float
    duplicates: int
    load: str

    @property
    def gorge_ms(self) -> float:
        return 1000 * self.gorge_cpu / self.items

    @property
    def db_ms(self) -> float:
        return 1000 * self.db_cpu / self.items


def bulk_rate(times: list[float]) -> float:
    """Items per second between the 10 % and the 90 % item, from sorted times."""
    if len(times) < 10:
        return len(times) / max(times[-1] - times[0], 1e-9) if len(times) > 1 else 0.0
    low, high = int(0.1 * len(times)), int(0.9 * len(times))
    span = times[high] - times[low]
    return (high - low) / span if span > 0 else 0.0


class Receiver(Resource):
    """Every POST answered 200 at once; the object PHID and the time of each."""

    isLeaf = True

    def __init__(self, clock) -> None:
        super().__init__()
        self._clock = clock
        self.arrivals: list[tuple[float, str]] = []

    def render_POST(self, request):
        body = json.loads(request.content.read())
        self.arrivals.append((self._clock.seconds(), body["object"]["phid"]))
        return b"ok"


async def wait_until(reactor, condition, what: str, step: float = 0.05) -> None:
    deadline = time.monotonic() + DEADLINE
    while not await condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench/replicas.py: {what} did not happen in {DEADLINE:.0f} s")
        await deferLater(reactor, step)


async def ready(http, daemons: list[Daemon]) -> bool:
    for daemon in daemons:
        response = await http.get(daemon.url + "/readyz")
        await response.content()
        if response.code != 200:
            return False
    return True


def gorge_cpu(daemons: list[Daemon]) -> float:
    return sum(daemon.cpu_seconds() for daemon in daemons)


# -- webhook -----------------------------------------------------------------


def add_hooks(db: MariaDBServer, name: str, base: str, hooks: int) -> list[str]:
    phids = [f"PHID-HWBH-bench{i:015d}" for i in range(hooks)]
    conn = db.connect(name)
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO herald_webhook (phid, name, webhookURI, viewPolicy, editPolicy, status,"
            " hmacKey, dateCreated, dateModified) VALUES (%s, %s, %s, 'users', 'users',"
            " 'enabled', %s, 1, 1)",
            [(p, f"hook {i}", f"{base}/hook/{i}", "k" * 32) for i, p in enumerate(phids)],
        )
    conn.close()
    return phids


def queue_requests(db: MariaDBServer, name: str, hooks: list[str], rows: int) -> None:
    """``rows`` queued requests, committed at once (one transaction)."""
    now = int(time.time())
    conn = db.connect(name)
    conn.autocommit(False)
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO herald_webhookrequest (phid, webhookPHID, objectPHID, status, properties,"
            " lastRequestResult, lastRequestEpoch, dateCreated, dateModified)"
            " VALUES (%s, %s, %s, 'queued', %s, 'none', 0, %s, %s)",
            [
                (
                    f"PHID-HWBR-bench{n:015d}",
                    hooks[n % len(hooks)],
                    f"PHID-TASK-{n:020d}",
                    properties(n),
                    now,
                    now,
                )
                for n in range(rows)
            ],
        )
    conn.commit()
    conn.close()


def sent_rows(db: MariaDBServer, name: str) -> int:
    conn = db.connect(name)
    with conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM herald_webhookrequest WHERE status = 'sent'")
        (count,) = cur.fetchone()
    conn.close()
    return int(count)


async def webhook_count(reactor, args, db, workdir: Path, http, count: int) -> Result:
    receiver = Receiver(reactor)
    port = reactor.listenTCP(0, Site(receiver), interface="127.0.0.1")
    namespace = f"replicas{count}"
    name = db.create_database("herald", f"{namespace}_herald")
    hooks = add_hooks(db, name, f"http://127.0.0.1:{port.getHost().port}", args.hooks)
    env = {
        "GORGE_LOG_LEVEL": args.log_level,
        "GORGE_WEBHOOK_MYSQL_HOST": db.host,
        "GORGE_WEBHOOK_MYSQL_PORT": str(db.port),
        "GORGE_WEBHOOK_MYSQL_USER": db.user,
        "GORGE_WEBHOOK_MYSQL_PASS": db.password,
        "GORGE_WEBHOOK_NAMESPACE": namespace,
        # The receiver is on the loopback, which Phorge's default list refuses.
        "GORGE_WEBHOOK_OUTBOUND_BLACKLIST": "none",
        # No Phorge here, so no phabricator.silent to read.
        "GORGE_WEBHOOK_SILENT_FROM": "none",
    }
    replicas = []
    try:
        for index in range(count):
            replica = Daemon("gorge-webhook", env, workdir / f"webhook-{count}-{index}")
            replica.workdir.mkdir(parents=True, exist_ok=True)
            replicas.append(replica.start())
        await wait_until(reactor, lambda: ready(http, replicas), "every replica ready")
        await deferLater(reactor, 1.5)  # idle: a poll or two with nothing queued
        cpu, db_cpu = gorge_cpu(replicas), cpu_seconds(db.pid)
        queue_requests(db, name, hooks, args.rows)
        committed = reactor.seconds()

        async def all_sent() -> bool:
            return len(receiver.arrivals) >= args.rows and sent_rows(db, name) >= args.rows

        await wait_until(reactor, all_sent, f"{args.rows} rows sent by {count} replica(s)", 0.1)
        cpu, db_cpu = gorge_cpu(replicas) - cpu, cpu_seconds(db.pid) - db_cpu
        times = sorted(t for t, _ in receiver.arrivals)
        objects = [phid for _, phid in receiver.arrivals]
        return Result(
            "webhook",
            count,
            args.rows,
            args.rows / (times[-1] - committed),
            bulk_rate(times),
            cpu,
            db_cpu,
            len(objects) - len(set(objects)),
            load_average(),
        )
    finally:
        for replica in replicas:
            replica.stop()
        await port.stopListening()


async def webhook_part(reactor, args, http) -> list[Result]:
    db = MariaDBServer()
    db.start()
    workdir = Path(tempfile.mkdtemp(prefix="gorge-bench-replicas-"))
    try:
        results = []
        for count in args.counts:
            result = await webhook_count(reactor, args, db, workdir, http, count)
            print(describe(result), flush=True)
            results.append(result)
        return results
    finally:
        db.stop()
        shutil.rmtree(workdir, ignore_errors=True)


# -- worker ------------------------------------------------------------------


async def processed(http, workers: list[Daemon]) -> int:
    total = 0
    for worker in workers:
        response = await http.get(
            worker.url + "/api/worker/stats", headers={"X-Service-Token": TOKEN}
        )
        total += int(json.loads(await response.content())["data"]["processed"])
    return total


async def worker_count(reactor, args, backend, http, count: int) -> Result:
    label = f"replicas{count}"
    store = backend.store(reactor, label)
    queue = Daemon(
        "gorge-taskqueue",
        {**backend.env(label), "GORGE_LOG_LEVEL": args.log_level},
        backend.workdir,
    )
    workers: list[Daemon] = []
    try:
        queue.start()
        env = {
            "GORGE_LOG_LEVEL": args.log_level,
            "GORGE_WORKER_TASK_QUEUE_URL": queue.url,
            "GORGE_WORKER_TASK_QUEUE_TOKEN": TOKEN,
            "GORGE_WORKER_NOOP_CLASSES": NOOP_CLASS,
            "GORGE_WORKER_TASK_CLASS_FILTER": NOOP_CLASS,
        }
        for index in range(count):
            workdir = backend.workdir / f"worker-{count}-{index}"
            workdir.mkdir(parents=True, exist_ok=True)
            workers.append(Daemon("gorge-worker", env, workdir).start())
        await wait_until(reactor, lambda: ready(http, workers), "every worker ready")
        await deferLater(reactor, 1.5)  # idle: the lease calls are the held ones
        daemons = [queue, *workers]
        cpu, db_cpu = gorge_cpu(daemons), cpu_seconds(backend.pid)
        await store.import_tasks(noop_tasks(args.tasks, NOOP_CLASS, int(time.time())), "bench", 1)
        committed = reactor.seconds()
        progress: list[tuple[float, int]] = []

        async def all_reported() -> bool:
            done = await processed(http, workers)
            progress.append((reactor.seconds(), done))
            return done >= args.tasks

        await wait_until(reactor, all_reported, f"{args.tasks} tasks run by {count} worker(s)")
        finished = reactor.seconds()
        cpu, db_cpu = gorge_cpu(daemons) - cpu, cpu_seconds(backend.pid) - db_cpu
        total = progress[-1][1]
        return Result(
            "worker",
            count,
            args.tasks,
            args.tasks / (finished - committed),
            polled_bulk_rate(progress, args.tasks),
            cpu,
            db_cpu,
            total - args.tasks,  # more runs than tasks: some ran twice
            load_average(),
        )
    finally:
        for daemon in reversed(workers):
            daemon.stop()
        queue.stop()
        await store.close()


def polled_bulk_rate(progress: list[tuple[float, int]], items: int) -> float:
    """10 % to 90 % from polled (time, done) pairs: the first poll past each."""

    def crossing(target: float) -> tuple[float, int]:
        return next(p for p in progress if p[1] >= target)

    (t_low, n_low), (t_high, n_high) = crossing(0.1 * items), crossing(0.9 * items)
    return (n_high - n_low) / (t_high - t_low) if t_high > t_low else 0.0


async def worker_part(reactor, args, http) -> list[Result]:
    backend = start_backend("mysql")
    try:
        results = []
        for count in args.counts:
            result = await worker_count(reactor, args, backend, http, count)
            print(describe(result), flush=True)
            results.append(result)
        return results
    finally:
        backend.stop()


# -- report ------------------------------------------------------------------


def describe(result: Result) -> str:
    unit = "replica(s)" if result.part == "webhook" else "worker(s)"
    return (
        f"{result.part} {result.count} {unit}: {result.items} items, {result.rate:.0f}/s from"
        f" the commit, {result.bulk_rate:.0f}/s bulk; CPU per item: gorge"
        f" {result.gorge_ms:.2f} ms, MariaDB {result.db_ms:.2f} ms;"
        f" duplicates {result.duplicates}; load {result.load}"
    )


def table(results: list[Result]) -> list[str]:
    lines = [
        "| part | processes | items | rate from commit | bulk rate (10-90 %) |"
        " gorge CPU per item | MariaDB CPU per item | duplicates |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.part} | {r.count} | {r.items} | {r.rate:.0f}/s | {r.bulk_rate:.0f}/s"
            f" | {r.gorge_ms:.2f} ms | {r.db_ms:.2f} ms | {r.duplicates} |"
        )
    return lines


async def run(reactor, args) -> None:
    from treq.client import HTTPClient
    from twisted.web.client import Agent, HTTPConnectionPool

    pool = HTTPConnectionPool(reactor, persistent=True)
    http = HTTPClient(Agent(reactor, pool=pool))
    print(f"load {load_average()} at the start", flush=True)
    results: list[Result] = []
    try:
        if "webhook" in args.parts:
            results += await webhook_part(reactor, args, http)
        if "worker" in args.parts:
            results += await worker_part(reactor, args, http)
    finally:
        await pool.closeCachedConnections()
    print()
    print(
        f"webhook: {args.rows} rows over {args.hooks} hooks; worker: {args.tasks} no-op tasks;"
        f" log level {args.log_level}; load {load_average()} at the end"
    )
    print("\n".join(table(results)))
    if any(r.duplicates for r in results):
        raise SystemExit("bench/replicas.py: an item was delivered or run twice")


def counts(text: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: positive integers, comma-separated")
    return values


def parts(text: str) -> list[str]:
    chosen = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in chosen if item not in PARTS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"{','.join(unknown) or repr(text)}; choose from {','.join(PARTS)}"
        )
    return chosen


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", type=counts, default=[1, 2, 4], help="default 1,2,4")
    parser.add_argument("--parts", type=parts, default=list(PARTS), help="webhook,worker")
    parser.add_argument("--rows", type=int, help=f"webhook rows (default {DEFAULTS['rows']})")
    parser.add_argument("--hooks", type=int, default=50)
    parser.add_argument("--tasks", type=int, help=f"worker tasks (default {DEFAULTS['tasks']})")
    parser.add_argument("--log-level", default="info", help="the daemons' (default info)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 200 rows, 500 tasks")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else DEFAULTS
    for name, value in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.rows < 1 or args.tasks < 1 or args.hooks < 1:
        parser.error("--rows, --tasks and --hooks must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    react(lambda reactor: Deferred.fromCoroutine(run(reactor, args)))


if __name__ == "__main__":
    main()
