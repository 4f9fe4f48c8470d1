"""Benchmark: gorge against Phorge's own PHP daemons, on one machine, in one run.

Needs a Phorge checkout with Arcanist beside it (``GORGE_PHORGE_ROOT``, as for
tests/phorge); without it, it prints one skip line and exits 0. It starts a
throwaway MariaDB and a throwaway Phorge on it (gorge_testing.phorge: its own
storage namespace, ``bin/storage upgrade``, ``security.outbound-blacklist``
empty so Phorge may call the loopback receiver), and a receiver in its own
process that answers every POST with 200 and notes when it arrived. The
sides work the same Phorge databases, one after the other, in alternating
order per round (``--workloads`` picks the workloads; all by default):

* tasks: N ``PhabricatorTestWorker`` tasks (no work), scheduled by Phorge's
  own ``PhabricatorWorker::scheduleTask`` in one transaction while the
  consumer is already running and idle, so all of them become visible at
  once. Drained by one Phorge taskmaster (``bin/phd launch
  PhabricatorTaskmasterDaemon``), then by one gorge-taskqueue (mysql backend
  on Phorge's worker database) + one gorge-worker (native test worker).
* webhooks: N Herald webhook requests made as Phorge's transaction editor
  makes them (a ``HeraldWebhookRequest`` row and its ``HeraldWebhookWorker``
  task, via ``queueCall()``), spread over H hooks, committed at once.
  Delivered by Phorge's ``HeraldWebhookWorker`` through one taskmaster, then
  by one gorge-webhook, with gorge-taskqueue + gorge-worker completing the
  ``HeraldWebhookWorker`` tasks without delivering
  (``GORGE_WORKER_WEBHOOK_OWNER=gorge-webhook``), as a switched-over site
  runs. A delivery counts when the receiver has it.
* few-hooks: the same, over F hooks (4 by default): the common shape of a
  real site, where most traffic goes to a CI trigger, a chat bridge and an
  automation hook. Each hook has at most one POST in flight on either side,
  so this workload measures the cycle per hook, not the fan-out.
* php: N ``PhabricatorTestWorker`` tasks scheduled the same way, but run in
  PHP on every side, as a site's PHP-only tasks are: by Phorge's default
  pool of four taskmasters (``bin/phd launch 4 PhabricatorTaskmasterDaemon``,
  one overseer); by gorge-taskqueue + gorge-worker with local PHP executors
  (``GORGE_WORKER_PHORGE_ROOT``, the pool at its default size, children of
  the worker); and by gorge-taskqueue + gorge-worker calling
  ``worker.execute`` on the site's web server (PHP's built-in server with 4
  workers, running for the whole benchmark; the site then loads the gorge
  library, phorge/src, which adds the method). The worker runs with
  ``GORGE_WORKER_NATIVE_TEST_WORKER=0``. Each side starts
  and loads Phorge before the run, and the run begins once its processes
  are idle.
* idle pickup: single tasks scheduled into the idle queue at spread-out
  moments; the time from their commit until the row is in
  ``worker_archivetask``.

gorge's daemons run as real twistd processes at their default settings (only
addresses, tokens, the namespace, the native test worker and the webhook
owner are set). For each run it prints the bulk rate (between 10% and 90%
done), the rate from the commit, CPU per item (utime + stime from
/proc/<pid>/stat: every gorge process together against Phorge's daemon and
its overseer, and MariaDB's apart) and the RSS of each process; then the
medians over the rounds, the ratios gorge/Phorge and the targets. For the
php workload CPU counts every process involved: the four taskmasters and the
overseer; taskqueue, worker and every executor; taskqueue, worker, the web
server and its PHP workers. Children are read live and, once they have
ended, through their parent's cutime + cstime, so an executor recycled
during a run still counts.

``--plot FILE.png`` draws completed items over time for every side, one panel
per workload (needs matplotlib: the ``bench`` extra). ``--profile DIR``
records the gorge processes with py-spy during one more run after the
measured rounds (the no-op ``tasks`` workload, or the one
``--profile-workload`` names), and prints their top functions.

Usage: GORGE_PHORGE_ROOT=/srv/phorge python bench/phorge.py [--tasks 3000]
       [--webhooks 2000] [--hooks 50] [--few-hooks 4] [--php-tasks 2000]
       [--rounds 3] [--pickup-samples 5]
       [--workloads tasks,webhooks,few-hooks,php,pickup]
       [--plot FILE.png] [--profile DIR] [--quick] [--keep]

``--quick`` is a smoke run (200 tasks, 100 webhooks over 5 hooks and over 2,
100 PHP tasks, one round, 2 pickups); a size given beside it still wins, so
``--quick --workloads php`` runs the PHP workload alone in well under a
minute.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from twisted.internet.defer import Deferred  # noqa: E402
from twisted.internet.task import LoopingCall, deferLater, react  # noqa: E402

from gorge_testing.gorge_stack import GorgeStack  # noqa: E402
from gorge_testing.mariadb_server import MariaDBServer  # noqa: E402
from gorge_testing.phorge import (  # noqa: E402
    CHECKOUT_SCRIPT,
    ROOT_VARIABLE,
    PhorgeSite,
    find_checkout,
)

SKIP_LINE = (
    f"bench/phorge.py: skipped: no Phorge checkout ({ROOT_VARIABLE} is not set and "
    f"the cache has none; make it with {CHECKOUT_SCRIPT})"
)
TEST_WORKER = "PhabricatorTestWorker"
WEBHOOK_WORKER = "HeraldWebhookWorker"
TASKMASTER = "PhabricatorTaskmasterDaemon"
PHP_TASKMASTERS = 4  # Phorge's default taskmaster pool (phd.taskmasters)
EXECUTORS = "gorge executors"  # gorge-worker running PHP tasks in local executors
CONDUIT = "gorge conduit"  # ... and through worker.execute on the web server
# The gorge library for Phorge: worker.execute, for the conduit side.
GORGE_LIBRARY = ROOT / "phorge" / "src"
WORKLOADS = ("tasks", "webhooks", "few-hooks", "php", "pickup")
# The workloads that deliver Herald webhooks, and the ones a run drains.
WEBHOOK_WORKLOADS = ("webhooks", "few-hooks")
DRAINED = ("tasks", *WEBHOOK_WORKLOADS, "php")
BOT = "bench-bot"
SUCCESS = 0  # worker_archivetask.result
SAMPLE_SEC = 0.02  # completion curve resolution
PICKUP_POLL_SEC = 0.003
SETTLE_WINDOW = 0.5  # MariaDB counts as idle after a window with
SETTLE_CPU = 0.05  # at most this share of a core used,
SETTLE_BOUND = 60.0  # waited for at most this long before a run
RUN_BOUND = 900.0  # the slowest run of a full benchmark takes well under a minute
TICK = os.sysconf("SC_CLK_TCK")

# Targets of the takeover, at the daemons' default settings.
TARGET_TASKS = 2.0
TARGET_WEBHOOKS = 8.0  # for 50 hooks and for 4 alike
ITEM = {"tasks": "task", "webhooks": "webhook", "few-hooks": "webhook", "php": "task"}
TARGET_PICKUP_MS = 30.0
TARGET_PHP = 2.0  # gorge's executors against Phorge's four taskmasters

RECEIVER = r"""
import json, sys, time
from twisted.internet import reactor
from twisted.web import resource, server

times = []

class Receiver(resource.Resource):
    isLeaf = True
    def render_POST(self, request):
        request.content.read()
        times.append(time.time())
        return b"ok"
    def render_GET(self, request):
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(times).encode()

site = server.Site(Receiver())
site.log = lambda request: None
port = reactor.listenTCP(0, site, interface="127.0.0.1")
sys.stdout.write("%d\n" % port.getHost().port)
sys.stdout.flush()
reactor.run()
"""


# -- processes and /proc ---------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` so far (its threads included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK  # fields 14 and 15 of stat(5)


def memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB; zeros once it is gone."""
    values = {"VmRSS": 0.0, "VmHWM": 0.0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in values:
                values[key] = int(rest.split()[0]) / 1024
    except OSError:
        pass
    return values["VmRSS"], values["VmHWM"]


def parent_pid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def child_pids(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and parent_pid(int(entry.name)) == parent:
            found.append(int(entry.name))
    return sorted(found)


def command_line(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


@dataclass(frozen=True)
class Proc:
    """One line of the process table: its parent and its CPU seconds so far."""

    ppid: int
    own: float  # utime + stime
    reaped: float  # cutime + cstime: the children it has waited for


def process_table() -> dict[int, Proc]:
    """Every process's parent and CPU times, read once."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        # Fields 4 and 14-17 of stat(5): ppid, utime, stime, cutime, cstime.
        table[int(entry.name)] = Proc(
            int(fields[1]),
            (int(fields[11]) + int(fields[12])) / TICK,
            (int(fields[13]) + int(fields[14])) / TICK,
        )
    return table


def descendants(table: dict[int, Proc], pid: int) -> list[int]:
    """The live children of ``pid`` and theirs, all the way down."""
    found: list[int] = []
    level = [pid]
    while level:
        level = [child for child, proc in table.items() if proc.ppid in level]
        found += level
    return found


def children_cpu(table: dict[int, Proc], pid: int) -> float:
    """CPU seconds of every process ``pid`` started, ended or not: the ones it
    (or a descendant) waited for are in cutime + cstime, since /proc forgets a
    process once it is reaped; the live ones are read one by one."""
    if pid not in table:
        return 0.0
    below = descendants(table, pid)
    return table[pid].reaped + sum(table[c].own + table[c].reaped for c in below)


def tree_memory_mb(table: dict[int, Proc], pids: list[int]) -> tuple[float, float]:
    """Summed (VmRSS, VmHWM) of ``pids`` and their live descendants, in MB."""
    every = set(pids)
    for pid in pids:
        every.update(descendants(table, pid))
    return summed_memory_mb(every)


def summed_memory_mb(pids) -> tuple[float, float]:
    """Summed (VmRSS, VmHWM) of ``pids``, in MB."""
    values = [memory_mb(pid) for pid in pids]
    return sum(v[0] for v in values), sum(v[1] for v in values)


class Receiver:
    """The webhook receiver, in a process of its own so that it never slows the side it serves."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", RECEIVER],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.port = int(self.proc.stdout.readline())
        self.base = f"http://127.0.0.1:{self.port}"

    def times(self) -> list[float]:
        """Arrival times (epoch seconds) of every POST so far."""
        with urllib.request.urlopen(self.base + "/times", timeout=30) as answer:
            return json.loads(answer.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(15)


# -- measurements ------------------------------------------------------------------


@dataclass
class Run:
    """One side draining one workload once."""

    side: str
    workload: str
    n: int
    curve: list[tuple[float, int]]  # (seconds after the commit, items done)
    settled: float  # seconds until every row and task was finished
    cpu: dict[str, float]  # process -> CPU seconds during the run
    db_cpu: float
    memory: dict[str, tuple[float, float]]  # process -> (RSS, peak) MB at the end
    problems: list[str] = field(default_factory=list)
    others: dict[tuple[str, int], int] = field(default_factory=dict)  # other tasks archived

    def crossing(self, fraction: float) -> float:
        """When ``fraction`` of the items were done (linear between samples)."""
        level = fraction * self.n
        previous = (0.0, 0)
        for t, count in self.curve:
            if count >= level:
                (t0, c0) = previous
                if count == c0:
                    return t
                return t0 + (t - t0) * (level - c0) / (count - c0)
            previous = (t, count)
        return float("nan")

    @property
    def bulk_rate(self) -> float:
        span = self.crossing(0.9) - self.crossing(0.1)
        return 0.8 * self.n / span if span > 0 else float("nan")

    @property
    def rate_from_start(self) -> float:
        end = self.crossing(1.0)
        return self.n / end if end > 0 else float("nan")

    @property
    def cpu_ms_per_item(self) -> float:
        return 1000 * sum(self.cpu.values()) / self.n

    @property
    def db_ms_per_item(self) -> float:
        return 1000 * self.db_cpu / self.n


def cumulative(times: list[float], start: float) -> list[tuple[float, int]]:
    return [(t - start, index + 1) for index, t in enumerate(sorted(times))]


def median(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else float("nan")


# -- the sides -------------------------------------------------------------------


class Side:
    """The daemons one side runs for one workload: ``pids`` are the processes
    that must live through a run (their children are found from them)."""

    name = ""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.pids: dict[str, int] = {}
        self.workload = ""

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of each part of the side (differences make a run's)."""
        return {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def memory(self) -> dict[str, tuple[float, float]]:
        return {name: memory_mb(pid) for name, pid in self.pids.items()}


class PhorgeSide(Side):
    """Phorge's taskmasters, launched with ``bin/phd launch``: one for the
    tasks and webhooks, Phorge's default pool of four for the PHP tasks."""

    name = "Phorge"

    def __init__(self, bench: Bench) -> None:
        super().__init__(bench)
        self.site = bench.site
        self.overseers: list[int] = []
        self.taskmasters: list[int] = []

    async def start(self, workload: str) -> None:
        self.workload = workload
        count = PHP_TASKMASTERS if workload == "php" else 1
        await self.site.bin("phd", "launch", str(count), TASKMASTER)
        # daemon_log names the overseer (phd-daemon), a row per daemon; each
        # taskmaster is a child of it running exec_daemon.php.
        deadline = time.monotonic() + 120
        while True:
            rows = self.site.rows(
                "daemon",
                "SELECT pid FROM daemon_log WHERE daemon = %s AND status = 'run'"
                " ORDER BY id DESC LIMIT %s",
                TASKMASTER,
                count,
            )
            found = {
                overseer: [pid for pid in child_pids(overseer) if TASKMASTER in command_line(pid)]
                for overseer in sorted({int(row["pid"]) for row in rows})
            }
            # Only overseers with taskmasters: a row of one that has ended
            # (and was never marked so) must not count as a daemon of this run.
            overseers = [overseer for overseer, pids in found.items() if pids]
            children = [pid for overseer in overseers for pid in found[overseer]]
            if len(children) >= count:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Phorge's taskmasters did not start ({len(children)} of {count});"
                    f" see phd's log in {self.site.dir / 'log'}"
                )
            await deferLater(self.bench.reactor, 0.1)
        self.overseers, self.taskmasters = overseers, children[:count]
        if workload == "php":
            self.pids = {f"taskmaster {i}": pid for i, pid in enumerate(self.taskmasters, 1)}
            self.pids.update({f"overseer {i}": pid for i, pid in enumerate(overseers, 1)})
        else:
            self.pids = {"taskmaster": children[0], "overseer": overseers[0]}

    def cpu(self) -> dict[str, float]:
        if self.workload != "php":
            return super().cpu()
        # Every process of the overseers': a taskmaster that ended (and was
        # replaced) during the run is in the overseer's cutime + cstime.
        table = process_table()
        return {
            f"taskmasters x{len(self.taskmasters)}": sum(
                children_cpu(table, pid) for pid in self.overseers
            ),
            "overseer": sum(table[pid].own for pid in self.overseers if pid in table),
        }

    def memory(self) -> dict[str, tuple[float, float]]:
        if self.workload != "php":
            return super().memory()
        table = process_table()
        return {
            f"taskmasters x{len(self.taskmasters)}": tree_memory_mb(table, self.taskmasters),
            "overseer": summed_memory_mb(self.overseers),
        }

    async def stop(self) -> None:
        await self.site.bin("phd", "stop", check=False)
        deadline = time.monotonic() + 60
        while any(alive(pid) for pid in self.pids.values()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"Phorge's daemons still running: {self.pids}")
            await deferLater(self.bench.reactor, 0.1)
        self.pids = {}


class GorgeSide(Side):
    """gorge-taskqueue + gorge-worker, and gorge-webhook for webhooks.

    ``php`` is where the worker runs the PHP tasks of the ``php`` workload:
    None for the side that runs the other workloads (the test worker
    emulated natively), "executors" (local PHP executors, children of the
    worker) or "conduit" (``worker.execute`` on the site's web server)."""

    def __init__(self, bench: Bench, name: str, php: str | None = None) -> None:
        super().__init__(bench)
        self.name = name
        self.php = php
        workdir = bench.workdir / (php or "gorge")
        workdir.mkdir(parents=True, exist_ok=True)
        self.stack = GorgeStack(bench.site, workdir, poll_ms=None, php=php or "conduit")

    async def start(self, workload: str) -> None:
        self.workload = workload
        names = ["taskqueue", "worker"] + (["webhook"] if workload in WEBHOOK_WORKLOADS else [])
        if self.php == "conduit":
            self.stack.worker_token = self.bench.token
        for name in names:
            overrides = {}
            if name == "worker" and workload == "php":
                # The test worker runs in PHP, as every PHP-only task of a site does.
                overrides["GORGE_WORKER_NATIVE_TEST_WORKER"] = "0"
            daemon = await self.stack.start_ready(name, **overrides)
            self.pids[name] = daemon.pid
        if self.php == "conduit":
            web = self.bench.site.web
            assert web is not None, "the web server runs for the whole benchmark"
            self.pids["web server"] = web.proc.pid

    def cpu(self) -> dict[str, float]:
        if self.workload != "php":
            return super().cpu()
        table = process_table()

        def own(pid: int) -> float:
            return table[pid].own if pid in table else 0.0

        cpu = {"taskqueue": own(self.pids["taskqueue"]), "worker": own(self.pids["worker"])}
        if self.php == "executors":
            # Executors recycled or ended during the run are in the worker's
            # cutime + cstime; the live ones are read one by one.
            cpu["executors"] = children_cpu(table, self.pids["worker"])
        else:
            cpu["worker"] += children_cpu(table, self.pids["worker"])
            web = self.pids["web server"]
            # php -S and the workers it forked (PHP_CLI_SERVER_WORKERS).
            cpu["web server"] = own(web) + children_cpu(table, web)
        return cpu

    def memory(self) -> dict[str, tuple[float, float]]:
        if self.workload != "php":
            return super().memory()
        memory = {name: memory_mb(self.pids[name]) for name in ("taskqueue", "worker")}
        table = process_table()
        if self.php == "executors":
            executors = descendants(table, self.pids["worker"])
            memory[f"executors x{len(executors)}"] = tree_memory_mb(table, executors)
        else:
            web = self.pids["web server"]
            memory[f"web server x{1 + len(descendants(table, web))}"] = tree_memory_mb(table, [web])
        return memory

    async def stop(self) -> None:
        for name in list(self.stack.daemons):
            await self.stack.stop(name)
        self.pids = {}


# -- the benchmark -----------------------------------------------------------------


class Bench:
    def __init__(
        self, reactor, args, site: PhorgeSite, db: MariaDBServer, receiver: Receiver, workdir: Path
    ) -> None:
        self.reactor = reactor
        self.args = args
        self.site = site
        self.db = db
        self.receiver = receiver
        self.workdir = workdir
        self.sides: dict[str, PhorgeSide | GorgeSide] = {
            "Phorge": PhorgeSide(self),
            "gorge": GorgeSide(self, "gorge"),
        }
        if "php" in args.workloads:
            self.sides[EXECUTORS] = GorgeSide(self, EXECUTORS, php="executors")
            self.sides[CONDUIT] = GorgeSide(self, CONDUIT, php="conduit")
        self.runs: list[Run] = []
        self.pickups: dict[str, list[float]] = {"Phorge": [], "gorge": []}
        self.hooks: list[str] = []
        self.target: dict = {}
        self.token = ""  # the bot's Conduit token, for gorge-worker's worker.execute calls

    # -- set-up ----------------------------------------------------------------

    async def prepare(self) -> None:
        self.token = (await self.site.helper("setup", username=BOT, admin=True))["token"]
        if "php" in self.args.workloads:
            # For the conduit side's worker.execute calls. It idles while the
            # other sides run; its CPU is counted on the conduit side only.
            self.site.start_web()
            await self.site.wait_web()
        self.target = await self.site.helper(
            "maniphest-task", author=BOT, title="what the benchmark's webhooks announce"
        )
        self.hooks = (
            await self.site.helper(
                "hooks",
                author=BOT,
                count=max(self.args.hooks, self.args.few_hooks),
                name="bench",
                uri=self.receiver.base + "/hook",
            )
        )["hookPHIDs"]
        self.clean()

    def clean(self) -> None:
        """Forget what earlier runs (and the set-up's edit) left in the tables,
        so each run starts from the same state."""
        self.site.execute("worker", "DELETE FROM worker_activetask")
        self.site.execute("worker", "DELETE FROM worker_archivetask")
        self.site.execute("worker", "DELETE FROM worker_taskdata")
        self.site.execute("herald", "DELETE FROM herald_webhookrequest")
        self.site.execute("daemon", "DELETE FROM daemon_logevent")

    async def database_settled(self) -> None:
        """Wait until MariaDB is idle again: InnoDB purges the rows the last run
        and clean() deleted in the background, and that work would otherwise
        land in the next run, whichever side it is (at most SETTLE_BOUND s)."""
        deadline = time.monotonic() + SETTLE_BOUND
        while time.monotonic() < deadline:
            before = cpu_seconds(self.db.pid)
            await deferLater(self.reactor, SETTLE_WINDOW)
            if cpu_seconds(self.db.pid) - before <= SETTLE_WINDOW * SETTLE_CPU:
                return

    def highest_task_id(self) -> int:
        ids = [
            self.site.rows("worker", f"SELECT MAX(id) AS m FROM {table}")[0]["m"] or 0
            for table in ("worker_activetask", "worker_archivetask")
        ]
        return max(ids)

    # -- one run ---------------------------------------------------------------

    async def side_settled(self, side: Side) -> None:
        """Wait until the side's processes are idle: PHP processes load Phorge
        when they start (four taskmasters, four executors), and that belongs
        to no run (at most SETTLE_BOUND s)."""
        deadline = time.monotonic() + SETTLE_BOUND
        while time.monotonic() < deadline:
            before = sum(side.cpu().values())
            await deferLater(self.reactor, SETTLE_WINDOW)
            if sum(side.cpu().values()) - before <= SETTLE_WINDOW * SETTLE_CPU:
                return

    def size(self, workload: str) -> int:
        return {
            "tasks": self.args.tasks,
            "webhooks": self.args.webhooks,
            "few-hooks": self.args.webhooks,
            "php": self.args.php_tasks,
        }[workload]

    def hooks_for(self, workload: str) -> list[str]:
        """The hooks a webhook workload spreads its requests over."""
        if workload == "few-hooks":
            return self.hooks[: self.args.few_hooks]
        return self.hooks[: self.args.hooks]

    async def run(self, side_name: str, workload: str, profile: Path | None = None) -> Run:
        side = self.sides[side_name]
        n = self.size(workload)
        self.clean()
        await self.database_settled()
        marker = self.highest_task_id()
        received_before = len(self.receiver.times())
        await side.start(workload)
        if workload == "php":
            await self.side_settled(side)
        await deferLater(self.reactor, 1.0)  # idle, polling an empty queue
        recorders = self.start_profiles(side.pids, profile) if profile else []

        samples: list[tuple[float, int]] = []

        task_class = WEBHOOK_WORKER if workload in WEBHOOK_WORKLOADS else TEST_WORKER

        def archived() -> int:
            return self.site.rows(
                "worker",
                "SELECT COUNT(*) AS n FROM worker_archivetask WHERE id > %s AND taskClass = %s",
                marker,
                task_class,
            )[0]["n"]

        sampler = LoopingCall(lambda: samples.append((time.time(), archived())))
        # The daemons' idle polls while the batch is written cost next to
        # nothing; MariaDB's share of the writing is left out.
        cpu_before = side.cpu()
        sampler.start(SAMPLE_SEC)
        try:
            if workload in ("tasks", "php"):
                batch = await self.site.helper(
                    "schedule-batch", taskClass=TEST_WORKER, data={"doWork": "nothing"}, count=n
                )
            else:
                batch = await self.site.helper(
                    "webhook-batch",
                    hookPHIDs=self.hooks_for(workload),
                    objectPHID=self.target["phid"],
                    transactionPHIDs=self.target["transactionPHIDs"],
                    count=n,
                )
            start = batch["committedAt"]
            db_before = cpu_seconds(self.db.pid)
            deadline = time.monotonic() + RUN_BOUND
            while not (samples and samples[-1][1] >= n and self.requests_queued() == 0):
                for pid in side.pids.values():
                    if not alive(pid):
                        raise RuntimeError(f"{side_name}: process {pid} ended during the run")
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{side_name} {workload}: not done within {RUN_BOUND:g}s "
                        f"({samples[-1][1] if samples else 0} of {n} archived)"
                    )
                await deferLater(self.reactor, SAMPLE_SEC)
            settled = time.time() - start
        finally:
            sampler.stop()
        cpu = {name: seconds - cpu_before[name] for name, seconds in side.cpu().items()}
        db_cpu = cpu_seconds(self.db.pid) - db_before
        memory = side.memory()
        for recorder in recorders:
            recorder.send_signal(signal.SIGINT)
        await side.stop()
        for recorder in recorders:
            recorder.wait(60)

        if workload in ("tasks", "php"):
            curve = [(t - start, count) for t, count in samples if t >= start]
        else:
            curve = cumulative(self.receiver.times()[received_before:], start)
        run = Run(side_name, workload, n, curve, settled, cpu, db_cpu, memory)
        run.problems = self.check(run, marker, len(self.receiver.times()) - received_before)
        return run

    def requests_queued(self) -> int:
        return self.site.rows(
            "herald", "SELECT COUNT(*) AS n FROM herald_webhookrequest WHERE status = 'queued'"
        )[0]["n"]

    def check(self, run: Run, marker: int, delivered: int) -> list[str]:
        """What the run did wrong, if anything: every figure stands on it."""
        problems = []
        results = Counter(
            (row["taskClass"], row["result"])
            for row in self.site.rows(
                "worker", "SELECT taskClass, result FROM worker_archivetask WHERE id > %s", marker
            )
        )
        expected = WEBHOOK_WORKER if run.workload in WEBHOOK_WORKLOADS else TEST_WORKER
        mine = {key: count for key, count in results.items() if key[0] == expected}
        if mine != {(expected, SUCCESS): run.n}:
            problems.append(
                f"{expected} tasks archived (class, result): {mine}, expected {run.n} successes"
            )
        if run.workload == "php":
            # Each task ran once in PHP and succeeded the first time.
            failed = self.site.rows(
                "worker",
                "SELECT COUNT(*) AS n FROM worker_archivetask"
                " WHERE id > %s AND taskClass = %s AND failureCount > 0",
                marker,
                expected,
            )[0]["n"]
            if failed:
                problems.append(f"{failed} {expected} tasks archived with failureCount > 0")
            left = self.site.rows(
                "worker",
                "SELECT COUNT(*) AS n FROM worker_activetask WHERE id > %s AND taskClass = %s",
                marker,
                expected,
            )[0]["n"]
            if left:
                problems.append(f"{left} {expected} tasks still in worker_activetask")
        # Phorge's code may queue a task of its own on the way (a search
        # index update): reported, not counted.
        run.others = {key: count for key, count in results.items() if key[0] != expected}
        if run.workload in WEBHOOK_WORKLOADS:
            statuses = Counter(
                row["status"]
                for row in self.site.rows("herald", "SELECT status FROM herald_webhookrequest")
            )
            if statuses != Counter({"sent": run.n}):
                problems.append(f"request statuses {dict(statuses)}, expected {run.n} sent")
            if delivered != run.n:
                problems.append(f"{delivered} deliveries received, expected {run.n}")
        return problems

    # -- idle pickup -----------------------------------------------------------

    async def pickup(self, side_name: str, samples: int, rng: random.Random) -> list[float]:
        side = self.sides[side_name]
        self.clean()
        marker = self.highest_task_id()
        await side.start("tasks")
        await deferLater(self.reactor, 1.5)
        seen: dict[int, float] = {}

        def look() -> None:
            for row in self.site.rows(
                "worker", "SELECT id FROM worker_archivetask WHERE id > %s", marker
            ):
                seen.setdefault(row["id"], time.time())

        watcher = LoopingCall(look)
        watcher.start(PICKUP_POLL_SEC)
        try:
            # Gaps longer than a poll interval (1 s by default on both sides),
            # uneven, so the tasks land at different moments of the poll cycle.
            gaps = [rng.uniform(1100, 2100) for _ in range(samples)]
            spaced = await self.site.helper(
                "schedule-spaced", taskClass=TEST_WORKER, data={"doWork": "nothing"}, gapsMs=gaps
            )
            ids = [t["taskID"] for t in spaced["tasks"]]
            deadline = time.monotonic() + 60
            while not all(i in seen for i in ids):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{side_name}: pickup tasks not archived within 60 s")
                await deferLater(self.reactor, PICKUP_POLL_SEC)
        finally:
            watcher.stop()
        await side.stop()
        return [seen[t["taskID"]] - t["committedAt"] for t in spaced["tasks"]]

    # -- profile ---------------------------------------------------------------

    def start_profiles(self, pids: dict[str, int], directory: Path) -> list[subprocess.Popen]:
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(spy).exists() and shutil.which(spy) is None:
            raise RuntimeError("--profile needs py-spy (pip install py-spy)")
        directory.mkdir(parents=True, exist_ok=True)
        recorders = []
        for name, pid in pids.items():
            with open(directory / f"{name}.py-spy.log", "wb") as log:
                recorders.append(
                    subprocess.Popen(
                        [
                            spy,
                            "record",
                            "--pid",
                            str(pid),
                            "--format",
                            "raw",
                            "--rate",
                            "250",
                            # Only samples that hold the GIL: Python at work, not waiting.
                            "--gil",
                            "--nolineno",
                            "--output",
                            str(directory / f"{name}.txt"),
                        ],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=log,
                    )
                )
        return recorders


def _package(frame: str) -> str:
    """Where a py-spy frame's code lives: ``twisted/web``, ``gorge/taskqueue``, ``pymysql``."""
    path = frame.rpartition("(")[2].rstrip(")")
    parts = path.split("/")
    if len(parts) > 2 and parts[0] in ("twisted", "gorge"):
        return "/".join(parts[:2])
    return parts[0] if len(parts) > 1 else f"{path} (standard library)"


def profile_summary(path: Path, top: int) -> list[str]:
    """Where a py-spy raw profile's samples are: functions and packages by own
    samples, and gorge's own functions inclusive."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        # Leading frames may name the process and thread: not code.
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        samples = int(count)
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    if not total:
        return ["  (no samples)"]
    packages: Counter[str] = Counter()
    for frame, count in own.items():
        packages[_package(frame)] += count

    def share(count: int) -> str:
        return f"{100 * count / total:5.1f}%"

    lines = [f"  {total} samples holding the GIL; own time by package:"]
    lines += [f"    {share(c)}  {p}" for p, c in packages.most_common(top)]
    lines.append("  own time by function:")
    lines += [f"    {share(c)}  {f}" for f, c in own.most_common(top)]
    lines.append("  inclusive, gorge's own functions:")
    shown = [(f, c) for f, c in inclusive.most_common() if "(gorge/" in f][:top]
    lines += [f"    {share(c)}  {f}" for f, c in shown]
    return lines


# -- report ------------------------------------------------------------------------


def describe_run(run: Run, round_no: int) -> str:
    processes = " + ".join(f"{name} {1000 * s / run.n:.2f}" for name, s in run.cpu.items())
    # The PHP workload has three sides, two of them with longer names.
    width = len(EXECUTORS) if run.workload == "php" else 6
    text = (
        f"round {round_no} {run.workload:8s} {run.side:{width}s}  bulk {run.bulk_rate:7.0f}/s  "
        f"from start {run.rate_from_start:7.0f}/s  settled {run.settled:6.1f}s  "
        f"CPU/item {run.cpu_ms_per_item:5.2f} ms ({processes}; MariaDB {run.db_ms_per_item:.2f})"
        # Where the time from the commit went: until the first item, the
        # first tenth, the last tenth.
        f"\n  first item {run.crossing(1 / run.n):.2f}s, 10% {run.crossing(0.1):.2f}s,"
        f" 90% {run.crossing(0.9):.2f}s, all {run.crossing(1.0):.2f}s"
    )
    if run.others:
        text += "\n  also archived (class, result): " + ", ".join(
            f"{cls} {result}: {count}" for (cls, result), count in sorted(run.others.items())
        )
    for problem in run.problems:
        text += f"\n  PROBLEM: {run.side} {run.workload}: {problem}"
    return text


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def _met(ok: bool) -> str:
    return "met" if ok else "missed"


def report(bench: Bench, args) -> list[str]:
    lines = []

    def figures(workload: str, side: str) -> list[Run]:
        return [r for r in bench.runs if r.workload == workload and r.side == side]

    def row(label: str, phorge: float, gorge: float, unit: str, digits: int = 0) -> str:
        text = (
            f"{label:32s} {phorge:10.{digits}f} {unit:4s} {gorge:10.{digits}f} {unit:4s}"
            f"  {_ratio(gorge, phorge):6.2f}x"
        )
        return text

    pair = [w for w in ("tasks", *WEBHOOK_WORKLOADS) if w in args.workloads]
    if pair or bench.pickups["Phorge"]:
        lines.append(
            f"{'median of ' + str(args.rounds) + ' round(s)':32s} "
            f"{'Phorge':>15s} {'gorge':>15s}  gorge/Phorge"
        )
    ratios = {}
    for workload in pair:
        p, g = figures(workload, "Phorge"), figures(workload, "gorge")
        bulk_p, bulk_g = median([r.bulk_rate for r in p]), median([r.bulk_rate for r in g])
        ratios[workload] = _ratio(bulk_g, bulk_p)
        lines.append(row(f"{workload}/s, bulk (10%-90%)", bulk_p, bulk_g, "/s"))
        lines.append(
            row(
                f"{workload}/s, from the commit",
                median([r.rate_from_start for r in p]),
                median([r.rate_from_start for r in g]),
                "/s",
            )
        )
        lines.append(
            row(
                f"CPU per {ITEM[workload]}, daemons",
                median([r.cpu_ms_per_item for r in p]),
                median([r.cpu_ms_per_item for r in g]),
                "ms",
                2,
            )
        )
        lines.append(
            row(
                f"CPU per {ITEM[workload]}, MariaDB",
                median([r.db_ms_per_item for r in p]),
                median([r.db_ms_per_item for r in g]),
                "ms",
                2,
            )
        )
    pickup = {side: 1000 * median(values) for side, values in bench.pickups.items()}
    if bench.pickups["Phorge"]:
        lines.append(
            row(
                f"idle pickup p50 ({len(bench.pickups['gorge'])} samples)",
                pickup["Phorge"],
                pickup["gorge"],
                "ms",
            )
        )
    php: dict[str, dict[str, float]] = {}
    if "php" in args.workloads:
        php = php_figures(bench)
        lines += php_lines(bench, args, php)
    lines.append("RSS at the end of the runs (median) / peak (max), MB:")
    width = max(len(side) for side in bench.sides)
    for side in bench.sides:
        names: dict[str, list[tuple[float, float]]] = {}
        for run in bench.runs:
            if run.side == side:
                for name, value in run.memory.items():
                    names.setdefault(f"{name} ({run.workload})", []).append(value)
        for name, values in names.items():
            lines.append(
                f"  {side:{width}s} {name:22s} {median([v[0] for v in values]):6.1f} / "
                f"{max(v[1] for v in values):6.1f}"
            )
    verdict = []
    if "tasks" in ratios:
        verdict.append(
            f"tasks {ratios['tasks']:.2f}x (target >= {TARGET_TASKS:g}x): "
            f"{_met(ratios['tasks'] >= TARGET_TASKS)}"
        )
    for workload in WEBHOOK_WORKLOADS:
        if workload in ratios:
            verdict.append(
                f"{workload} {ratios[workload]:.2f}x (target >= {TARGET_WEBHOOKS:g}x): "
                f"{_met(ratios[workload] >= TARGET_WEBHOOKS)}"
            )
    if "tasks" in ratios:
        cpu_p = median([r.cpu_ms_per_item for r in figures("tasks", "Phorge")])
        cpu_g = median([r.cpu_ms_per_item for r in figures("tasks", "gorge")])
        verdict.append(
            f"CPU per task {cpu_g:.2f} ms against Phorge's {cpu_p:.2f} ms (target below): "
            f"{_met(cpu_g < cpu_p)}"
        )
    if bench.pickups["gorge"]:
        verdict.append(
            f"pickup p50 {pickup['gorge']:.0f} ms (target <= {TARGET_PICKUP_MS:g} ms): "
            f"{_met(pickup['gorge'] <= TARGET_PICKUP_MS)}"
        )
    if verdict:
        lines.append("targets: " + "; ".join(verdict))
    if php:
        rate = _ratio(php[EXECUTORS]["bulk"], php["Phorge"]["bulk"])
        cpu_e, cpu_p = php[EXECUTORS]["cpu"], php["Phorge"]["cpu"]
        lines.append(
            f"targets: php tasks: executors {rate:.2f}x Phorge's {PHP_TASKMASTERS} taskmasters "
            f"(target >= {TARGET_PHP:g}x): {_met(rate >= TARGET_PHP)}; "
            f"CPU per php task (all processes) {cpu_e:.2f} ms against Phorge's {cpu_p:.2f} ms "
            f"(target below): {_met(cpu_e < cpu_p)}"
        )
    problems = [p for r in bench.runs for p in r.problems]
    if problems:
        lines.append(f"WARNING: {len(problems)} run(s) did not finish cleanly; see PROBLEM lines")
    return lines


PHP_SIDES = ("Phorge", EXECUTORS, CONDUIT)


def php_figures(bench: Bench) -> dict[str, dict[str, float]]:
    """The PHP workload's medians per side: bulk, start, cpu, db (ms per task)."""
    figures = {}
    for side in PHP_SIDES:
        runs = [r for r in bench.runs if r.workload == "php" and r.side == side]
        figures[side] = {
            "bulk": median([r.bulk_rate for r in runs]),
            "start": median([r.rate_from_start for r in runs]),
            "cpu": median([r.cpu_ms_per_item for r in runs]),
            "db": median([r.db_ms_per_item for r in runs]),
        }
    return figures


def php_lines(bench: Bench, args, php: dict[str, dict[str, float]]) -> list[str]:
    """The PHP workload's block: three sides, two ratios against Phorge."""
    lines = [
        f"{'php, median of ' + str(args.rounds) + ' round(s)':32s} "
        f"{'Phorge x' + str(PHP_TASKMASTERS):>15s} {'executors':>15s} {'conduit':>15s}"
        "  executors/Phorge conduit/Phorge"
    ]

    def row(label: str, key: str, unit: str, digits: int) -> str:
        values = [php[side][key] for side in PHP_SIDES]
        cells = " ".join(f"{v:10.{digits}f} {unit:4s}" for v in values)
        return (
            f"{label:32s} {cells}  {_ratio(values[1], values[0]):15.2f}x"
            f" {_ratio(values[2], values[0]):13.2f}x"
        )

    lines.append(row("php tasks/s, bulk (10%-90%)", "bulk", "/s", 0))
    lines.append(row("php tasks/s, from the commit", "start", "/s", 0))
    lines.append(row("CPU per php task, all processes", "cpu", "ms", 2))
    lines.append(row("CPU per php task, MariaDB", "db", "ms", 2))
    for side in PHP_SIDES:
        runs = [r for r in bench.runs if r.workload == "php" and r.side == side]
        if not runs:
            continue
        parts = [
            f"{name} {median([1000 * r.cpu.get(name, 0.0) / r.n for r in runs]):.2f}"
            for name in runs[0].cpu
        ]
        lines.append(f"  CPU per php task, {side}: " + " + ".join(parts) + " ms")
    return lines


def _milliseconds(seconds: list[float]) -> str:
    return ", ".join(f"{1000 * v:.0f}" for v in seconds)


def plot(bench: Bench, path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'gorge[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"Phorge": "#b5651d", "gorge": "#1f6fb4", EXECUTORS: "#1f6fb4", CONDUIT: "#6a3d9a"}
    workloads = [w for w in DRAINED if w in bench.args.workloads]
    if not workloads:
        return
    figure, panels = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4.8))
    if len(workloads) == 1:
        panels = [panels]
    for panel, workload in zip(panels, workloads, strict=True):
        labelled = set()
        for run in bench.runs:
            if run.workload != workload or not run.curve:
                continue
            xs = [0.0] + [t for t, _ in run.curve]
            ys = [0] + [c for _, c in run.curve]
            label = None
            if run.side not in labelled:
                rate = median(
                    [
                        r.bulk_rate
                        for r in bench.runs
                        if r.workload == workload and r.side == run.side
                    ]
                )
                label = f"{run.side}: {rate:.0f}/s (median bulk rate)"
                labelled.add(run.side)
            panel.plot(
                xs,
                ys,
                drawstyle="steps-post",
                color=colours[run.side],
                linewidth=1.4,
                alpha=0.8,
                label=label,
            )
        noun = "webhooks delivered" if workload in WEBHOOK_WORKLOADS else "tasks archived"
        panel.set_title(
            {
                "tasks": f"{bench.args.tasks} no-op tasks",
                "webhooks": f"{bench.args.webhooks} Herald webhooks, {bench.args.hooks} hooks",
                "few-hooks": (
                    f"{bench.args.webhooks} Herald webhooks, {bench.args.few_hooks} hooks"
                ),
                "php": (
                    f"{bench.args.php_tasks} no-op tasks run in PHP"
                    f" (Phorge: {PHP_TASKMASTERS} taskmasters)"
                ),
            }[workload]
        )
        panel.set_xlabel("seconds after the commit")
        panel.set_ylabel(noun)
        panel.grid(alpha=0.3)
        panel.legend(loc="lower right")
        panel.set_xlim(left=0)
        panel.set_ylim(bottom=0)
    figure.suptitle(
        f"gorge and Phorge on one machine, {bench.args.rounds} alternating round(s)"
        f" (load average at start {bench.args.load_at_start})"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# -- main --------------------------------------------------------------------------


async def benchmark(
    reactor, args, site: PhorgeSite, db: MariaDBServer, receiver: Receiver, workdir: Path
) -> None:
    bench = Bench(reactor, args, site, db, receiver, workdir)
    await bench.prepare()
    rng = random.Random(14)
    try:
        for round_no in range(1, args.rounds + 1):
            # Alternate who goes first, so load from elsewhere hits both alike.
            order: tuple[str, ...] = ("Phorge", "gorge") if round_no % 2 else ("gorge", "Phorge")
            for workload in DRAINED:
                if workload not in args.workloads:
                    continue
                sides = order
                if workload == "php":
                    sides = PHP_SIDES if round_no % 2 else PHP_SIDES[::-1]
                for side in sides:
                    run = await bench.run(side, workload)
                    bench.runs.append(run)
                    print(describe_run(run, round_no), flush=True)
            if "pickup" in args.workloads and args.pickup_samples:
                for side in order:
                    bench.pickups[side] += await bench.pickup(side, args.pickup_samples, rng)
                print(
                    f"round {round_no} pickup   "
                    + "  ".join(
                        f"{side} {_milliseconds(bench.pickups[side][-args.pickup_samples :])} ms"
                        for side in order
                    ),
                    flush=True,
                )
        print(f"load average at the end: {load_average()}")
        for line in report(bench, args):
            print(line)
        if args.plot:
            plot(bench, Path(args.plot))
            print(f"chart: {args.plot}")
        if args.profile:
            directory = Path(args.profile)
            workload = args.profile_workload
            run = await bench.run("gorge", workload, profile=directory)
            print(
                f"profiled {workload} run (py-spy attached, not a measurement): "
                f"{run.bulk_rate:.0f} {ITEM[workload]}s/s"
            )
            for name in sorted(run.cpu):
                print(
                    f"py-spy, gorge-{name}, {run.n} {ITEM[workload]}s "
                    f"({directory / (name + '.txt')}):"
                )
                for line in profile_summary(directory / f"{name}.txt", args.profile_top):
                    print(line)
    finally:
        for running in bench.sides.values():
            if running.pids:
                await running.stop()


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


# What --quick runs, unless the command line says otherwise.
QUICK = {
    "tasks": 200,
    "webhooks": 100,
    "hooks": 5,
    "few_hooks": 2,
    "php_tasks": 100,
    "rounds": 1,
    "pickup_samples": 2,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3000, help="no-op tasks per run (3000)")
    parser.add_argument(
        "--webhooks", type=int, default=2000, help="webhook requests per run (2000)"
    )
    parser.add_argument(
        "--hooks", type=int, default=50, help="hooks the requests are spread over (50)"
    )
    parser.add_argument(
        "--few-hooks",
        type=int,
        default=4,
        help="hooks the few-hooks workload spreads the same requests over (4)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="alternating rounds; the figures are their medians (3)",
    )
    parser.add_argument(
        "--php-tasks",
        type=int,
        default=2000,
        help="tasks run in PHP per run of the php workload (2000)",
    )
    parser.add_argument(
        "--pickup-samples", type=int, default=5, help="idle pickup samples per side and round (5)"
    )
    parser.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"the workloads to run, comma-separated ({','.join(WORKLOADS)})",
    )
    parser.add_argument("--plot", metavar="FILE.png", help="write a chart of both sides")
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="one more gorge run under py-spy; raw profiles go to DIR",
    )
    parser.add_argument(
        "--profile-workload",
        default="tasks",
        choices=[w for w in WORKLOADS if w in DRAINED and w != "php"],
        help="the workload of the profiled run (tasks)",
    )
    parser.add_argument("--profile-top", type=int, default=12, help="functions shown per profile")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=(
            "a smoke test: 200 tasks, 100 webhooks over 5 hooks and over 2, 100 PHP tasks,"
            " 1 round, 2 pickups"
        ),
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the working directory (daemon logs) and say where it is",
    )
    args = parser.parse_args(argv)
    if args.quick:
        # Smaller defaults; a size given on the command line still wins.
        parser.set_defaults(**QUICK)
        args = parser.parse_args(argv)
    for name in ("tasks", "webhooks", "hooks", "few_hooks", "rounds", "php_tasks"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    chosen = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown or not chosen:
        parser.error(
            f"--workloads: {', '.join(unknown) or 'none given'}; choose from {','.join(WORKLOADS)}"
        )
    args.workloads = [w for w in WORKLOADS if w in chosen]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    checkout, problem = find_checkout()
    if checkout is None and problem is None:
        print(SKIP_LINE)
        return 0
    if checkout is None:
        print(f"bench/phorge.py: {problem}", file=sys.stderr)
        return 2
    args.load_at_start = load_average()
    print(
        f"bench/phorge.py: {checkout.describe()}; {os.cpu_count()} CPUs, "
        f"load average {args.load_at_start}",
        flush=True,
    )
    print(
        f"workloads={','.join(args.workloads)} tasks={args.tasks} webhooks={args.webhooks} "
        f"hooks={args.hooks} few hooks={args.few_hooks} php tasks={args.php_tasks} "
        f"rounds={args.rounds} "
        f"pickup samples={args.pickup_samples}/side/round",
        flush=True,
    )
    workdir = Path(tempfile.mkdtemp(prefix="gorge-bench-phorge-"))
    db = MariaDBServer()
    site = receiver = None
    try:
        db.start()
        # The conduit side calls worker.execute, which the gorge library adds.
        libraries = [GORGE_LIBRARY] if "php" in args.workloads else []
        site = PhorgeSite(checkout, db, workdir / "phorge", "bench", libraries=libraries)
        site.configure({"security.outbound-blacklist": []})
        started = time.monotonic()
        site.upgrade_storage()
        print(f"storage upgraded in {time.monotonic() - started:.0f}s", flush=True)
        receiver = Receiver()
        react(
            lambda reactor: Deferred.fromCoroutine(
                benchmark(reactor, args, site, db, receiver, workdir)
            )
        )
    finally:
        if receiver is not None:
            receiver.stop()
        if site is not None:
            site.close()
        db.stop()
        if args.keep:
            print(f"working directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
