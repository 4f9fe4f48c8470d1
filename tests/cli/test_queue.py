"""``gorge queue`` end to end: the command line as a process, against a real
``twistd gorge-taskqueue`` process (docs/taskqueue.md, The gorge queue command)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import pytest

from gorge_testing.procs import free_port
from tests.support.paths import REPO_ROOT
from tests.support.twistd import TwistdDaemon, daemon_environ

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOKEN = "cli-token"
VERBS = ["stats", "ls", "show", "cancel", "delay", "retry", "priority", "free", "flood", "migrate"]


def _http(url: str, path: str, body: dict, **headers) -> dict:
    request = urllib.request.Request(
        url + "/api/queue/" + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "X-Service-Token": TOKEN, **headers},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)["data"]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def queue(tmp_path_factory):
    """A gorge-taskqueue process on SQLite, its URL."""
    workdir = tmp_path_factory.mktemp("cli")
    port = free_port()
    env = daemon_environ(
        {
            "GORGE_LISTEN_ADDR": f"127.0.0.1:{port}",
            "GORGE_SERVICE_TOKEN": TOKEN,
            "GORGE_TASKQUEUE_BACKEND": "sqlite",
            "GORGE_TASKQUEUE_SQLITE_PATH": str(workdir / "queue.sqlite3"),
        },
        drop=("GORGE_",),
    )
    daemon = TwistdDaemon("gorge-taskqueue", env, workdir / "taskqueue.log")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while not _answers(url):
            assert daemon.proc.poll() is None, daemon.log_text()[-3000:]
            assert time.monotonic() < deadline, daemon.log_text()[-3000:]
            try:
                daemon.proc.wait(0.05)  # wait on the process, not on the clock
            except subprocess.TimeoutExpired:
                pass
        yield url
    finally:
        daemon.kill()


def counts_of(stats_json: str) -> dict:
    """The four counts of ``queue stats --json`` (its ages depend on the time)."""
    return {k: v for k, v in json.loads(stats_json).items() if k.endswith("Count")}


def gorge(
    *args: str, url: str | None = None, token: str | None = TOKEN, env: dict | None = None
) -> subprocess.CompletedProcess:
    environ = daemon_environ(env or {}, drop=("GORGE_",))
    if url is not None:
        environ["GORGE_TASKQUEUE_URL"] = url
    if token is not None:
        environ["GORGE_SERVICE_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "gorge.cli", *args],
        cwd=REPO_ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line(result: subprocess.CompletedProcess) -> str:
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr.strip()


def test_the_verbs_against_a_running_queue(queue):
    r = gorge("queue", "flood", "--count", "5", "--duration", "0", url=queue)
    assert (r.returncode, r.stdout) == (0, "queued 5 PhabricatorTestWorker tasks\n")
    r = gorge("queue", "stats", url=queue)
    assert r.returncode == 0 and r.stdout.startswith("active    5\nleased    0\nwaiting   5\n")
    assert re.search(r"^oldest    \d+s  default  PhabricatorTestWorker$", r.stdout, re.M)
    assert counts_of(gorge("queue", "stats", "--json", url=queue).stdout) == {
        "activeCount": 5,
        "leasedCount": 0,
        "archivedCount": 0,
        "failedCount": 0,
    }
    r = gorge("queue", "ls", url=queue)
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["ID", "PRIORITY", "CLASS", "FAILURES", "STATE"]
    assert [line.split()[0] for line in lines[1:]] == ["1", "2", "3", "4", "5"]
    assert all(line.split()[-1] == "waiting" for line in lines[1:])
    r = gorge("queue", "show", "1", url=queue)
    assert r.stdout.startswith("task 1: active, waiting\n")
    assert '  data: {"duration":0.0}\n' in r.stdout

    # priority: 3 jumps the queue
    r = gorge("queue", "priority", "3", "--priority", "1000", url=queue)
    assert (r.returncode, r.stdout) == (0, "task 3 (PhabricatorTestWorker): priority 1000\n")
    assert [t["id"] for t in json.loads(gorge("queue", "ls", "--json", url=queue).stdout)][:2] == [
        3,
        1,
    ]
    # delay: 2 is held for an hour
    r = gorge("queue", "delay", "--id", "2", "--until", "+1h", url=queue)
    assert r.returncode == 0 and "delayed until" in r.stdout
    assert "not before" in gorge("queue", "show", "2", url=queue).stdout
    # free: a leased task is freed once; the second time it has no lease
    (leased,) = _http(queue, "lease", {"limit": 1}, **{"X-Lease-Owner": "host:1:2:w"})
    assert leased["id"] == 3
    assert "leased by host:1:2:w" in gorge("queue", "show", "3", url=queue).stdout
    r = gorge("queue", "free", "3", url=queue)
    assert (r.returncode, r.stdout) == (0, "task 3 (PhabricatorTestWorker): lease freed\n")
    r = gorge("queue", "free", "3", url=queue)
    assert r.returncode == 1
    assert one_line(r) == "gorge queue free: task 3: task has no lease"
    # cancel, then the cancelled task is in the archive
    assert gorge("queue", "cancel", "4", url=queue).returncode == 0
    r = gorge("queue", "cancel", "4", url=queue)
    assert (r.returncode, one_line(r)) == (1, "gorge queue cancel: task 4: task not found")
    r = gorge("queue", "show", "4", url=queue)
    assert r.returncode == 0 and r.stdout.startswith("task 4: archived, cancelled\n")
    # dead tasks: a permanent failure is listed and requeued as a new task
    _http(queue, "fail", {"taskID": 5, "permanent": True, "message": "no such  repository"})
    r = gorge("queue", "dead", "ls", url=queue)
    lines = r.stdout.splitlines()
    assert lines[0].split() == [
        "ID",
        "CLASS",
        "RESULT",
        "FAILURES",
        "PRIORITY",
        "ARCHIVED",
        "LAST",
        "ERROR",
    ]
    assert [line.split()[:3] for line in lines[1:]] == [["5", "PhabricatorTestWorker", "failure"]]
    # Its last error, as the worker reported it (on one line).
    assert lines[1].endswith(" no such repository")
    assert [
        (row["id"], row["lastError"])
        for row in json.loads(
            gorge("queue", "dead", "ls", "--all-results", "--json", url=queue).stdout
        )
    ] == [(5, "no such  repository"), (4, None)]
    r = gorge("queue", "dead", "requeue", "5", "77", url=queue)
    assert r.returncode == 1
    assert r.stdout == "task 5 (PhabricatorTestWorker): requeued as task 6\n"
    assert one_line(r) == "gorge queue dead requeue: task 77: task not found"
    # retry: the cancelled task comes back under its own id
    r = gorge("queue", "retry", "4", url=queue)
    assert (r.returncode, r.stdout) == (0, "task 4 (PhabricatorTestWorker): queued for retry\n")
    assert gorge("queue", "show", "4", url=queue).stdout.startswith("task 4: active")
    r = gorge("queue", "retry", "4", url=queue)
    assert one_line(r) == "gorge queue retry: task 4: task is active, not archived"
    assert counts_of(gorge("queue", "stats", "--json", url=queue).stdout) == {
        "activeCount": 5,
        "leasedCount": 0,
        "archivedCount": 1,
        "failedCount": 0,
    }


def test_bad_ids_tokens_and_addresses_are_one_line_and_non_zero(queue):
    r = gorge("queue", "show", "abc", url=queue)
    assert (r.returncode, one_line(r)) == (2, "gorge queue show: argument ID: not a task id: 'abc'")
    r = gorge("queue", "show", "99999", url=queue)
    assert (r.returncode, one_line(r)) == (1, "gorge queue show: task 99999: task not found")
    r = gorge("queue", "cancel", url=queue)
    assert (r.returncode, one_line(r)) == (2, "gorge queue cancel: name at least one task id")
    r = gorge("queue", "delay", "1", "--until", "someday", url=queue)
    assert r.returncode == 2 and "argument --until: not a time" in one_line(r)
    r = gorge("queue", "stats", url=queue, token="wrong")
    assert (r.returncode, one_line(r)) == (
        3,
        "gorge queue: the queue refused the service token (set GORGE_SERVICE_TOKEN or --token)",
    )
    closed = f"http://127.0.0.1:{free_port()}"
    r = gorge("queue", "stats", "--url", closed, url=queue)
    assert (r.returncode, one_line(r)) == (
        3,
        f"gorge queue: cannot reach the queue at {closed}: connection refused",
    )
    r = gorge("queue", "frobnicate", url=queue)
    assert r.returncode == 2 and one_line(r).startswith("gorge queue: argument VERB: invalid")


@pytest.mark.parametrize("verb", VERBS + ["dead ls", "dead requeue"])
def test_every_verb_has_help(verb):
    r = gorge("queue", *verb.split(), "--help")
    assert r.returncode == 0 and r.stdout.startswith(f"usage: gorge queue {verb}")
    assert "exit status" in r.stdout


def _seed_sqlite(path, n: int) -> None:
    """``n`` tasks in a SQLite queue file, written as the daemon writes them."""
    import sqlite3

    from gorge.taskqueue.sqlite import SCHEMA

    db = sqlite3.connect(path)
    try:
        db.executescript(SCHEMA)
        for i in range(n):
            cur = db.execute("INSERT INTO worker_taskdata (data) VALUES (?)", (f'{{"i":{i}}}',))
            db.execute(
                "INSERT INTO worker_activetask (id, taskClass, failureCount, dataID,"
                " priority, dateCreated, dateModified) VALUES (?, ?, 0, ?, 2000, 1, 1)",
                (i + 1, f"C{i % 2}", cur.lastrowid),
            )
        db.execute("INSERT INTO lisk_counter VALUES ('worker_activetask', ?)", (n,))
        db.commit()
    finally:
        db.close()


def _run_on_a_terminal(args: list[str], env: dict) -> tuple[int, str, str]:
    """Run with stderr on a pseudo-terminal (the progress bar's only home)."""
    import os
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gorge.cli", *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=slave,
        text=True,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    out = proc.stdout.read()
    proc.wait(120)
    os.close(master)
    return proc.returncode, out, b"".join(chunks).decode()


def test_migrate_from_sqlite_to_redis_and_back(tmp_path, redis_server):
    path = tmp_path / "q.sqlite3"
    _seed_sqlite(path, 1200)
    env = daemon_environ(
        {
            "GORGE_TASKQUEUE_SQLITE_PATH": str(path),
            "GORGE_TASKQUEUE_REDIS_ADDR": f"{redis_server.host}:{redis_server.port}",
            "GORGE_TASKQUEUE_REDIS_KEY_PREFIX": redis_server.unique_prefix("cli"),
        },
        drop=("GORGE_",),
    )
    r = gorge("queue", "migrate", "--from", "sqlite", "--to", "redis", "--dry-run", env=env)
    assert (r.returncode, r.stdout, r.stderr) == (
        0,
        "would move 1200 tasks from sqlite to redis (C0 600, C1 600)\n",
        "",
    )
    code, out, err = _run_on_a_terminal(
        ["queue", "migrate", "--from", "sqlite", "--to", "redis", "--batch", "100"], env
    )
    assert code == 0, err
    assert out.startswith("moved 1200 tasks from sqlite to redis in ")
    assert "] 600/1200 tasks" in err and err.rstrip().endswith("] 1200/1200 tasks")
    r = gorge("queue", "migrate", "--from", "redis", "--to", "sqlite", "--json", env=env)
    summary = json.loads(r.stdout)
    assert (r.returncode, r.stderr) == (0, "")  # no bar without a terminal
    assert (summary["moved"], summary["byClass"]) == (1200, {"C0": 600, "C1": 600})
    r = gorge("queue", "migrate", "--from", "redis", "--to", "sqlite", "--dry-run", env=env)
    assert r.stdout == "would move 0 tasks from redis to sqlite\n"


def test_migrate_usage_and_settings_errors(tmp_path):
    r = gorge("queue", "migrate", "--from", "redis", "--to", "redis")
    assert (r.returncode, one_line(r)) == (
        2,
        "gorge queue migrate: --from and --to must name different backends",
    )
    r = gorge(
        "queue",
        "migrate",
        "--from",
        "sqlite",
        "--to",
        "redis",
        env={"GORGE_TASKQUEUE_REDIS_ADDR": "nohost"},
    )
    assert r.returncode == 2
    assert one_line(r).startswith("gorge queue migrate: GORGE_TASKQUEUE_REDIS_ADDR: ")
    r = gorge("queue", "migrate", "--from", "postgres", "--to", "redis")
    assert r.returncode == 2 and "invalid choice: 'postgres'" in one_line(r)


def test_until_accepts_epochs_relative_times_and_iso_dates():
    from argparse import ArgumentTypeError

    from gorge.cli.queue import parse_when

    now = 1_795_947_000.7
    assert parse_when("now", now) == 1_795_947_000
    assert parse_when("1795950000", now) == 1_795_950_000
    assert [parse_when(w, now) - 1_795_947_000 for w in ("+90", "+90s", "+30m", "+6h", "+2d")] == [
        90,
        90,
        1800,
        21600,
        172800,
    ]
    assert parse_when("2026-11-29T12:00:00+00:00", now) == 1_795_953_600
    with pytest.raises(ArgumentTypeError):
        parse_when("tomorrow", now)


def test_migrate_reads_the_mysql_settings_as_the_daemon_does(tmp_path, mariadb):
    namespace = f"cli{os.getpid()}"
    database = mariadb.create_database("worker", f"{namespace}_worker")
    conn = mariadb.connect(database)
    try:
        with conn.cursor() as cur:
            for i in range(30):
                cur.execute("INSERT INTO worker_taskdata (data) VALUES (%s)", (f'{{"i":{i}}}',))
                cur.execute(
                    "INSERT INTO worker_activetask (id, taskClass, failureCount,"
                    " dataID, priority, dateCreated, dateModified)"
                    " VALUES (%s, 'PhabricatorSearchWorker', 0, %s, 3500, 1, 1)",
                    (100 + i, cur.lastrowid),
                )
        conn.commit()
    finally:
        conn.close()
    env = daemon_environ(
        {
            "GORGE_TASKQUEUE_MYSQL_HOST": mariadb.host,
            "GORGE_TASKQUEUE_MYSQL_PORT": str(mariadb.port),
            "GORGE_TASKQUEUE_MYSQL_USER": mariadb.user,
            "GORGE_TASKQUEUE_MYSQL_PASS": mariadb.password,
            "GORGE_TASKQUEUE_NAMESPACE": namespace,
            "GORGE_TASKQUEUE_SQLITE_PATH": str(tmp_path / "q.sqlite3"),
        },
        drop=("GORGE_",),
    )
    r = gorge("queue", "migrate", "--from", "mysql", "--to", "sqlite", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["byClass"] == {"PhabricatorSearchWorker": 30}
    r = gorge("queue", "migrate", "--from", "mysql", "--to", "sqlite", "--dry-run", env=env)
    assert r.stdout == "would move 0 tasks from mysql to sqlite\n"
    # A database that is not there: one line, a non-zero exit, a hint to re-run.
    r = gorge(
        "queue",
        "migrate",
        "--from",
        "mysql",
        "--to",
        "sqlite",
        env={**env, "GORGE_TASKQUEUE_NAMESPACE": "nosuch"},
    )
    assert r.returncode == 1
    assert one_line(r).endswith("0 of 0 tasks moved so far; run the same command again to finish")
