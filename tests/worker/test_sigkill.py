"""A SIGKILLed worker's tasks run again, each once, soon (docs/worker.md,
Heartbeat leases): a real ``twistd gorge-taskqueue`` on MariaDB (Phorge's
worker tables) and real ``twistd`` gorge-worker processes (``twistd -y
recorded_worker.tac``: the service the plugin builds, from the same
settings, plus one test-only class).

Twenty tasks of the test-only native class ``RecordedWorker``
(tests/worker/recorded_worker.py) are leased and running at once in one
worker, each handler blocked; that worker is SIGKILLed. Every time is read
from the rows, in the database's clock (``UNIX_TIMESTAMP()`` when the kill
is over), never from this host's clock:

* at the defaults (the worker's heartbeat and heartbeat lease, the queue's
  7,200 s lease for others), once a heartbeat has renewed them, every lease
  the dead worker held runs out at most two minutes after the kill. Rather
  than wait that out, the test moves those rows' ``leaseExpires`` back by
  the time left, as the database's
  clock reaching the last of them would; a second worker, at the defaults
  too, then runs each task once;
* with a 5 s heartbeat lease nothing is moved: the second worker (at the
  defaults) is started at the kill and gets every task when its lease runs
  out, not before.

The run record shows exactly two runs per task: one in the killed worker,
one in the second.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from pathlib import Path

import pymysql
import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from gorge_testing.procs import free_port
from tests.support.twistd import DAEMON_ARGS, TwistdProcess, daemon_environ
from tests.worker.recorded_worker import HOLD, RUNS_FILE, TASK_CLASS, runs

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "sigkill-token"
TASKS = 20
#: The acceptance bound: a dead worker's tasks are leasable again within it.
STRANDED_AT_MOST = 120
BOUND = 60.0
TAC = Path(__file__).with_name("recorded_worker.tac")


async def until(what: str, check: Callable[[], object], bound: float = BOUND):
    """``check()``'s first true value (a coroutine's is awaited), polled."""
    deadline = reactor.seconds() + bound
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if reactor.seconds() > deadline:
            raise AssertionError(f"not within {bound} s: {what}")
        await deferLater(reactor, 0.05)


class Site:
    """The queue's database, the queue, and the workers started on it."""

    def __init__(self, mariadb, namespace: str, workdir: Path) -> None:
        self.mariadb = mariadb
        self.namespace = namespace
        self.database = mariadb.create_database("worker", f"{namespace}_worker")
        self.workdir = workdir
        self.runs_file = workdir / "runs.jsonl"
        self.processes: list[TwistdProcess] = []
        self.queue_url = ""

    def rows(self, sql: str, *args) -> list[dict]:
        conn = self.mariadb.connect(self.database)
        try:
            with conn.cursor(pymysql.cursors.DictCursor) as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())
        finally:
            conn.close()

    def execute(self, sql: str, *args) -> int:
        conn = self.mariadb.connect(self.database)
        try:
            with conn.cursor() as cur:
                return cur.execute(sql, args)
        finally:
            conn.close()

    def db_now(self) -> int:
        return int(self.rows("SELECT UNIX_TIMESTAMP() AS now")[0]["now"])

    def active(self) -> list[dict]:
        return self.rows("SELECT * FROM worker_activetask ORDER BY id")

    def archived(self) -> list[dict]:
        return self.rows("SELECT * FROM worker_archivetask ORDER BY id")

    def _spawn(self, tapname: str, env: dict[str, str], args=DAEMON_ARGS) -> TwistdProcess:
        port = free_port()
        process = TwistdProcess(
            reactor,
            tapname,
            daemon_environ(
                {"GORGE_LISTEN_ADDR": f"127.0.0.1:{port}", "GORGE_LOG_LEVEL": "info", **env},
                drop=("GORGE_", RUNS_FILE, HOLD),
            ),
            args=tuple(args),
        )
        process.port = port  # type: ignore[attr-defined]
        self.processes.append(process)
        return process

    async def start_queue(self) -> None:
        """gorge-taskqueue at its defaults (GORGE_TASKQUEUE_LEASE_DURATION too)."""
        db = self.mariadb
        queue = self._spawn(
            "gorge-taskqueue",
            {
                "GORGE_SERVICE_TOKEN": TOKEN,
                "GORGE_TASKQUEUE_BACKEND": "mysql",
                "GORGE_TASKQUEUE_MYSQL_HOST": db.host,
                "GORGE_TASKQUEUE_MYSQL_PORT": str(db.port),
                "GORGE_TASKQUEUE_MYSQL_USER": db.user,
                "GORGE_TASKQUEUE_MYSQL_PASS": db.password,
                "GORGE_TASKQUEUE_NAMESPACE": self.namespace,
            },
        )
        port = await queue.serving()
        self.queue_url = f"http://127.0.0.1:{port}"

    async def start_worker(self, *, hold: bool, **settings: str) -> TwistdProcess:
        """gorge-worker with RecordedWorker; its settings at their defaults
        but for ``settings``."""
        worker = self._spawn(
            str(TAC),
            {
                "GORGE_WORKER_TASK_QUEUE_URL": self.queue_url,
                "GORGE_WORKER_TASK_QUEUE_TOKEN": TOKEN,
                RUNS_FILE: str(self.runs_file),
                HOLD: "1" if hold else "0",
                **settings,
            },
            args=(*DAEMON_ARGS, "-y"),
        )
        await worker.serving()
        return worker

    async def enqueue(self, count: int) -> list[int]:
        ids = []
        for n in range(count):
            response = await treq.post(
                self.queue_url + "/api/queue/enqueue",
                json.dumps({"taskClass": TASK_CLASS, "data": json.dumps({"n": n})}).encode(),
                headers={"X-Service-Token": TOKEN, "Content-Type": "application/json"},
                persistent=False,
                timeout=20,
            )
            body = json.loads(await response.content())
            assert response.code == 200, body
            ids.append(body["data"]["id"])
        return ids

    async def worker_stats(self, worker: TwistdProcess) -> dict:
        response = await treq.get(
            f"http://127.0.0.1:{worker.port}/api/worker/stats",  # type: ignore[attr-defined]
            persistent=False,
            timeout=20,
        )
        return (await response.json())["data"]

    async def stop(self) -> None:
        for process in reversed(self.processes):
            if not process.ended.called:
                process.kill()
                await process.wait_ended()


@pytest.fixture
def site(mariadb, tmp_path):
    # pytest's folder for the test is unique in the session: so is the database.
    namespace = re.sub(r"[^a-z0-9]", "_", tmp_path.name.lower())
    s = Site(mariadb, namespace, tmp_path)
    yield s
    pytest_twisted.blockon(Deferred.fromCoroutine(s.stop()))


async def _twenty_running_then_killed(
    site: Site, *, renewed_first: bool = False, **worker_settings: str
) -> tuple[int, int]:
    """Twenty tasks running in one worker, which is then SIGKILLed (with
    ``renewed_first``, once a heartbeat has renewed every lease): its pid
    and the database's time once it is dead."""
    await site.start_queue()
    ids = await site.enqueue(TASKS)
    doomed = await site.start_worker(hold=True, **worker_settings)
    pid = doomed.transport.pid
    await until(
        "all 20 tasks running in the first worker",
        lambda: sorted(r["taskID"] for r in runs(site.runs_file)) == ids,
    )
    leased = site.active()
    assert [r["id"] for r in leased] == ids
    assert all(f":{pid}:" in (r["leaseOwner"] or "") for r in leased), leased
    assert (await site.worker_stats(doomed))["active"] == TASKS
    if renewed_first:
        first = {r["id"]: r["leaseExpires"] for r in leased}
        await until(
            "every lease renewed by a heartbeat",
            lambda: all(r["leaseExpires"] > first[r["id"]] for r in site.active()),
        )
    doomed.signal("KILL")
    await doomed.wait_ended()
    return pid, site.db_now()


async def _processed(site: Site, worker: TwistdProcess) -> dict | None:
    stats = await site.worker_stats(worker)
    return stats if stats["processed"] + stats["failed"] + stats["unreported"] >= TASKS else None


def _held_by(rows: list[dict], pid: int) -> list[dict]:
    return [r for r in rows if f":{pid}:" in (r["leaseOwner"] or "")]


async def _all_run_again(site: Site, killed_pid: int) -> TwistdProcess:
    """A second worker at its defaults runs each task once more; it is
    returned once it has nothing left to do."""
    second = await site.start_worker(hold=False)
    archived = await until(
        "all 20 tasks archived", lambda: (rows := site.archived()) and len(rows) == TASKS and rows
    )
    # Its count moves when the report's answer is back, just after the rows.
    stats = await until("the second worker's count", lambda: _processed(site, second))
    assert (stats["processed"], stats["failed"], stats["unreported"]) == (TASKS, 0, 0), stats
    assert stats["active"] == 0
    assert site.active() == []
    assert all(r["result"] == 0 for r in archived), archived
    second_pid = second.transport.pid
    assert all(f":{second_pid}:" in (r["leaseOwner"] or "") for r in archived), archived
    by_task: dict[int, list[int]] = {}
    for run in runs(site.runs_file):
        by_task.setdefault(run["taskID"], []).append(run["pid"])
    assert by_task == {r["id"]: [killed_pid, second_pid] for r in archived}
    return second


@pytest_twisted.ensureDeferred
async def test_a_sigkilled_workers_leases_run_out_within_two_minutes_at_the_defaults(site):
    # A heartbeat (every 15 s at the defaults) renews the leases first: a
    # renewed lease, not only the lease call's, is what must run out soon.
    killed_pid, killed_at = await _twenty_running_then_killed(site, renewed_first=True)
    held = _held_by(site.active(), killed_pid)
    assert len(held) == TASKS
    expiries = [r["leaseExpires"] for r in held]
    # Still held (nothing leasable before its lease runs out), and for at
    # most two minutes after the kill, by the database's clock, while the
    # queue's own lease (GORGE_TASKQUEUE_LEASE_DURATION) is two hours.
    assert all(killed_at < expires <= killed_at + STRANDED_AT_MOST for expires in expiries), (
        killed_at,
        expiries,
    )
    # The database's clock at the last of those expiries, for these rows:
    # the same rows shifted back by the time left.
    shift = max(expiries) - site.db_now() + 1
    moved = site.execute(
        "UPDATE worker_activetask SET leaseExpires = leaseExpires - %s WHERE leaseOwner LIKE %s",
        shift,
        f"%:{killed_pid}:%",
    )
    assert moved == TASKS
    await _all_run_again(site, killed_pid)


@pytest_twisted.ensureDeferred
async def test_with_a_short_heartbeat_lease_a_worker_at_the_defaults_takes_them_when_it_runs_out(
    site,
):
    heartbeat_lease = 5
    killed_pid, killed_at = await _twenty_running_then_killed(
        site,
        GORGE_WORKER_HEARTBEAT_SEC="1",
        GORGE_WORKER_HEARTBEAT_LEASE_SEC=str(heartbeat_lease),
    )
    held = _held_by(site.active(), killed_pid)
    assert len(held) == TASKS
    old_expiry = {r["id"]: r["leaseExpires"] for r in held}
    # Renewed by the heartbeat lease only (one second more for the queue's
    # sampled clock and whole seconds).
    assert all(expires <= killed_at + heartbeat_lease + 1 for expires in old_expiry.values())
    await _all_run_again(site, killed_pid)
    second_runs = [r for r in runs(site.runs_file) if r["pid"] != killed_pid]
    for run in second_runs:
        # When the queue leased it to the second worker, in its own clock.
        leased_at = run["leaseExpires"] - run["leaseSeconds"]
        assert leased_at >= old_expiry[run["taskID"]], run  # not taken early
        assert leased_at <= killed_at + STRANDED_AT_MOST, run
