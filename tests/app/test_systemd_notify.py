"""systemd ``Type=notify`` end to end: each daemon as a real ``twistd -n`` process.

The test binds the unix datagram socket systemd would hand over in
``NOTIFY_SOCKET``, sets ``WATCHDOG_USEC``, and checks the sequence a unit
relies on: ``READY=1`` once listening and the main loop ran, ``WATCHDOG=1``
pings while the loop makes progress, ``STOPPING=1`` on SIGTERM, a clean exit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gorge_testing.procs import free_port
from tests.support.twistd import TwistdDaemon, daemon_environ

pytestmark = pytest.mark.slow

WATCHDOG_USEC = 1_000_000  # pings are due every 0.5 s
START_BOUND = 30.0
STOP_BOUND = 30.0


class NotifySocket:
    """The receiving end of ``NOTIFY_SOCKET``; every wait is bounded."""

    def __init__(self) -> None:
        # sun_path is limited to 108 bytes: keep the directory short.
        self._dir = tempfile.mkdtemp(prefix="gn-", dir="/tmp")
        self.path = os.path.join(self._dir, "notify")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.path)
        self.messages: list[tuple[float, str]] = []

    def receive(self, until: float) -> str | None:
        """One datagram, or None once ``until`` (a monotonic time) has passed."""
        remaining = until - time.monotonic()
        if remaining <= 0:
            return None
        self._sock.settimeout(remaining)
        try:
            data = self._sock.recv(4096)
        except TimeoutError:
            return None
        for line in data.decode("utf-8", "replace").splitlines():
            self.messages.append((time.monotonic(), line))
        return data.decode("utf-8", "replace")

    def wait_until(self, predicate, timeout: float) -> bool:
        """True once ``predicate()`` holds, False when ``timeout`` passed first."""
        until = time.monotonic() + timeout
        while not predicate():
            if self.receive(until) is None:
                return predicate()
        return True

    def wait_for(self, message: str, timeout: float) -> bool:
        return self.wait_until(lambda: message in self.names(), timeout)

    def names(self) -> list[str]:
        return [m for _, m in self.messages]

    def count_after(self, message: str, moment: float) -> int:
        return sum(1 for at, m in self.messages if m == message and at >= moment)

    def first(self, message: str) -> float:
        return next(at for at, m in self.messages if m == message)

    def close(self) -> None:
        self._sock.close()
        os.unlink(self.path)
        os.rmdir(self._dir)


class Daemon(TwistdDaemon):
    def __init__(
        self, tapname: str, env: dict[str, str], notify: NotifySocket, log_path: Path
    ) -> None:
        environ = daemon_environ(
            {
                "NOTIFY_SOCKET": notify.path,
                "WATCHDOG_USEC": str(WATCHDOG_USEC),
                "GORGE_LOG_LEVEL": "info",
                **env,
            },
            drop=("GORGE_", "NOTIFY_SOCKET", "WATCHDOG_"),
        )
        super().__init__(tapname, environ, log_path)

    def log_tail(self) -> str:
        return self.log_text()[-3000:]

    def terminate(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_BOUND)
        finally:
            self.kill()


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    sock = NotifySocket()
    yield sock
    sock.close()


@pytest.fixture
def start(tmp_path) -> Iterator:
    started: list[Daemon] = []

    def start_daemon(tapname: str, env: dict[str, str], notify: NotifySocket) -> Daemon:
        daemon = Daemon(tapname, env, notify, tmp_path / f"{tapname}-{len(started)}.log")
        started.append(daemon)
        return daemon

    yield start_daemon
    for daemon in started:
        daemon.kill()


def _taskqueue_env(tmp_path: Path, port: int | None = None) -> dict[str, str]:
    return {
        "GORGE_LISTEN_ADDR": f"127.0.0.1:{port or 0}",
        "GORGE_TASKQUEUE_BACKEND": "sqlite",
        "GORGE_TASKQUEUE_SQLITE_PATH": str(tmp_path / "taskqueue.sqlite3"),
    }


def _env_for(tapname: str, request, tmp_path: Path, start) -> dict[str, str]:
    """Settings pointing at a backend that is there (or need not be)."""
    if tapname == "gorge-taskqueue":
        return _taskqueue_env(tmp_path)
    if tapname == "gorge-mailer":
        return {"GORGE_LISTEN_ADDR": "127.0.0.1:0", "GORGE_MAILER_TYPE": "test"}
    if tapname == "gorge-webhook":
        from tests.webhook.conftest import daemon_env

        mariadb = request.getfixturevalue("mariadb")
        namespace = f"sd{os.getpid()}"
        mariadb.create_database("herald", f"{namespace}_herald")
        return daemon_env(mariadb, namespace)
    # gorge-worker: a real taskqueue to lease from, started first.
    port = free_port()
    queue_notify = NotifySocket()
    request.addfinalizer(queue_notify.close)
    queue = start("gorge-taskqueue", _taskqueue_env(tmp_path, port), queue_notify)
    assert queue_notify.wait_for("READY=1", START_BOUND), queue.log_tail()
    return {
        "GORGE_LISTEN_ADDR": "127.0.0.1:0",
        "GORGE_WORKER_TASK_QUEUE_URL": f"http://127.0.0.1:{port}",
        "GORGE_WORKER_POLL_INTERVAL_MS": "100",
    }


# How long the second WATCHDOG=1 may take: one ping per main-loop tick at
# most every WATCHDOG_USEC/2, and the taskqueue's loop is its 15 s stats refresh.
PING_BOUND = {"gorge-taskqueue": 20.0}


@pytest.mark.parametrize(
    "tapname",
    [
        pytest.param("gorge-webhook", marks=pytest.mark.integration),
        "gorge-mailer",
        "gorge-taskqueue",
        "gorge-worker",
    ],
)
def test_ready_then_watchdog_pings_then_stopping_and_a_clean_exit(
    tapname, request, tmp_path, notify, start
):
    daemon = start(tapname, _env_for(tapname, request, tmp_path, start), notify)
    assert notify.wait_for("READY=1", START_BOUND), daemon.log_tail()
    ready_at = notify.first("READY=1")
    # The ping sent together with READY=1 proves nothing about the loop: want two.
    assert notify.wait_until(
        lambda: notify.count_after("WATCHDOG=1", ready_at) >= 2, PING_BOUND.get(tapname, 10.0)
    ), f"messages: {notify.names()}\n{daemon.log_tail()}"
    assert "STOPPING=1" not in notify.names()
    status = daemon.terminate()
    assert notify.wait_for("STOPPING=1", 5.0), notify.names()
    # twistd re-raises the signal that stopped it: both count as clean.
    assert status in (0, -signal.SIGTERM), daemon.log_tail()
    order = [m for m in notify.names() if m in ("READY=1", "STOPPING=1")]
    assert order == ["READY=1", "STOPPING=1"]


def test_worker_whose_queue_is_unreachable_keeps_pinging_and_is_not_ready(tmp_path, notify, start):
    """A queue outage is /readyz's business: the loop still turns, so the
    watchdog is fed and systemd does not kill tasks that are still running."""
    port = free_port()
    daemon = start(
        "gorge-worker",
        {
            "GORGE_LISTEN_ADDR": f"127.0.0.1:{port}",
            "GORGE_WORKER_TASK_QUEUE_URL": f"http://127.0.0.1:{free_port()}",
            "GORGE_WORKER_POLL_INTERVAL_MS": "100",
        },
        notify,
    )
    assert notify.wait_for("READY=1", START_BOUND), daemon.log_tail()
    ready_at = notify.first("READY=1")
    assert notify.wait_until(
        lambda: notify.count_after("WATCHDOG=1", ready_at) >= 2, 3 * WATCHDOG_USEC / 1e6
    ), notify.names()
    assert "WORKER_LEASE_FAILED" in daemon.log_text()
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10)
    assert answer.value.code == 503
    assert daemon.terminate() in (0, -signal.SIGTERM)
    assert "STOPPING=1" in notify.names() or notify.wait_for("STOPPING=1", 5.0)


def test_worker_keeps_pinging_while_its_slots_are_busy(tmp_path, notify, start):
    port = free_port()
    queue_notify = NotifySocket()
    try:
        queue = start("gorge-taskqueue", _taskqueue_env(tmp_path, port), queue_notify)
        assert queue_notify.wait_for("READY=1", START_BOUND), queue.log_tail()
    finally:
        queue_notify.close()
    body = json.dumps(
        {"taskClass": "PhabricatorTestWorker", "data": json.dumps({"duration": 4})}
    ).encode()
    enqueue = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/queue/enqueue",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(enqueue, timeout=10) as response:
        assert response.status == 200
    daemon = start(
        "gorge-worker",
        {
            "GORGE_LISTEN_ADDR": "127.0.0.1:0",
            "GORGE_WORKER_TASK_QUEUE_URL": f"http://127.0.0.1:{port}",
            "GORGE_WORKER_POLL_INTERVAL_MS": "100",
            "GORGE_WORKER_MAX_WORKERS": "1",
            "GORGE_WORKER_NATIVE_TEST_WORKER": "1",
        },
        notify,
    )
    assert notify.wait_for("READY=1", START_BOUND), daemon.log_tail()
    ready_at = notify.first("READY=1")
    # The task occupies the only slot for 4 s; watch 3 s of it.
    notify.wait_until(lambda: False, 3.0)
    pings = [at for at, m in notify.messages if m == "WATCHDOG=1" and at >= ready_at]
    gaps = [b - a for a, b in zip(pings, pings[1:] + [time.monotonic()], strict=True)]
    assert max(gaps) < 2 * WATCHDOG_USEC / 1e6, (gaps, daemon.log_tail())
    daemon.terminate()
