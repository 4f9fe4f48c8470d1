"""What the benchmarks share: throwaway backends (gorge_testing), gorge daemons
run by twistd as an operator runs them, and the memory those daemons use.

Imported by the bench scripts, which put the repository root on sys.path.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-token"


def memory_mb(pid: int) -> tuple[float, float]:
    """(resident now, peak resident) of ``pid`` in MB, from /proc."""
    now = peak = 0.0
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    now = int(line.split()[1]) / 1024
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) / 1024
    except OSError:
        pass
    return now, peak


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU time of ``pid`` (default: this process) so far."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_average() -> str:
    try:
        with open("/proc/loadavg") as loadavg:
            return " ".join(loadavg.read().split()[:3])
    except OSError:
        return "?"


def free_port() -> int:
    from gorge_testing.procs import free_port as probe

    return probe()


@dataclass
class Daemon:
    """One gorge daemon under ``twistd --nodaemon``, its output in a log file."""

    name: str
    env: dict
    workdir: Path
    profile: Path | None = None
    port: int = 0
    proc: subprocess.Popen | None = None
    peak_mb: float = 0.0
    _log: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> Daemon:
        self.port = free_port()
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "GORGE_LISTEN_ADDR": f"127.0.0.1:{self.port}",
            "GORGE_SERVICE_TOKEN": TOKEN,
            **self.env,
        }
        twistd = str(Path(sys.executable).with_name("twistd"))
        argv = [
            twistd,
            "--nodaemon",
            "--pidfile=",
            "--logger=gorge.log.output.observer_from_env",
            self.name,
        ]
        if self.profile is not None:
            # py-spy samples the daemon from outside: collapsed stacks, read by top_entries().
            # It writes nothing into a directory that does not exist, and says nothing.
            self.profile.parent.mkdir(parents=True, exist_ok=True)
            spy = str(Path(sys.executable).with_name("py-spy"))
            argv = [
                spy,
                "record",
                "--format",
                "raw",
                "--rate",
                "250",
                "--gil",
                "-o",
                str(self.profile),
                "--",
                *argv,
            ]
        self._log = open(self.workdir / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=ROOT,
        )
        self._wait_healthy()
        return self

    def _wait_healthy(self, seconds: float = 60.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not answer /healthz: {self.log_tail()}")

    def daemon_pid(self) -> int:
        """The twistd process itself, also when py-spy started it."""
        if self.profile is None:
            return self.pid
        try:
            children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        except OSError:
            return self.pid
        return int(children[0]) if children else self.pid

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.daemon_pid())

    def sample_memory(self) -> float:
        _, peak = memory_mb(self.daemon_pid())
        self.peak_mb = max(self.peak_mb, peak)
        return self.peak_mb

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = (self.workdir / f"{self.name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is None:
            return
        self.sample_memory()
        if self.proc.poll() is None:
            os.kill(self.daemon_pid(), signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self._log.close()
        self.proc = None


@dataclass
class Backend:
    """A throwaway store server for gorge-taskqueue. Each label names its own
    queue on it (a database, a key prefix, a file): ``env(label)`` is the
    daemon's settings for it, ``store(reactor, label)`` a direct store on the
    same queue for this process (the bound, and writes made as Phorge or
    another replica makes them)."""

    name: str
    env: Callable[[str], dict]
    store: Callable[[Any, str], Any]
    stop: Callable[[], None]
    workdir: Path
    # The store server's process, for its CPU time (0: none, as for SQLite).
    pid: int = 0


def start_backend(name: str) -> Backend:
    workdir = Path(tempfile.mkdtemp(prefix="gorge-bench-"))

    def remove_workdir() -> None:
        shutil.rmtree(workdir, ignore_errors=True)

    if name == "mysql":
        from gorge.db.mysql import make_pool
        from gorge.taskqueue.mysql import MySQLTaskStore
        from gorge_testing.mariadb_server import MariaDBServer

        server = MariaDBServer()
        server.start()
        created: set[str] = set()

        def database(label: str) -> str:
            if label not in created:
                server.create_database("worker", f"{label}_worker")
                created.add(label)
            return f"{label}_worker"

        def mysql_env(label: str) -> dict:
            database(label)
            return {
                "GORGE_TASKQUEUE_BACKEND": "mysql",
                "GORGE_TASKQUEUE_MYSQL_HOST": server.host,
                "GORGE_TASKQUEUE_MYSQL_PORT": str(server.port),
                "GORGE_TASKQUEUE_MYSQL_USER": server.user,
                "GORGE_TASKQUEUE_MYSQL_PASS": server.password,
                "GORGE_TASKQUEUE_NAMESPACE": label,
            }

        def mysql_store(reactor, label: str):
            return MySQLTaskStore(make_pool(server.settings(database(label)), reactor), reactor)

        def stop_mysql() -> None:
            server.stop()
            remove_workdir()

        return Backend(name, mysql_env, mysql_store, stop_mysql, workdir, server.pid or 0)
    if name == "redis":
        from gorge.db.redis import make_redis
        from gorge.taskqueue.redis import RedisTaskStore
        from gorge_testing.redis_server import RedisServer

        server = RedisServer()
        server.start()

        def redis_env(label: str) -> dict:
            return {
                "GORGE_TASKQUEUE_BACKEND": "redis",
                "GORGE_TASKQUEUE_REDIS_ADDR": f"{server.host}:{server.port}",
                "GORGE_TASKQUEUE_REDIS_KEY_PREFIX": f"{label}:tq:",
            }

        def redis_store(reactor, label: str):
            return RedisTaskStore(
                make_redis(server.settings(), reactor), clock=reactor, key_prefix=f"{label}:tq:"
            )

        def stop_redis() -> None:
            server.stop()
            remove_workdir()

        return Backend(name, redis_env, redis_store, stop_redis, workdir, server.pid or 0)
    if name == "sqlite":
        from gorge.taskqueue.sqlite import SQLiteTaskStore

        def sqlite_env(label: str) -> dict:
            return {
                "GORGE_TASKQUEUE_BACKEND": "sqlite",
                "GORGE_TASKQUEUE_SQLITE_PATH": str(workdir / f"{label}.sqlite3"),
            }

        def sqlite_store(reactor, label: str):
            return SQLiteTaskStore.open(str(workdir / f"{label}.sqlite3"), reactor)

        return Backend(name, sqlite_env, sqlite_store, remove_workdir, workdir)
    raise SystemExit(f"bench: unknown backend {name!r} (mysql, redis, sqlite)")


def top_entries(collapsed: Path, count: int = 15) -> list[tuple[float, float, str]]:
    """From py-spy's collapsed stacks: (self %, total %, function) of the
    functions that hold the most samples, own time first."""
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    try:
        lines = collapsed.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        n = int(count_text)
        samples += n
        frames = stack.split(";")
        for frame in set(frames):
            total[frame] = total.get(frame, 0) + n
        own[frames[-1]] = own.get(frames[-1], 0) + n
    if not samples:
        return []
    ranked = sorted(own, key=own.get, reverse=True)[:count]
    return [(100 * own[f] / samples, 100 * total[f] / samples, f) for f in ranked]
