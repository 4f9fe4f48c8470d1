"""A real ``twistd gorge-worker`` process: SIGTERM stops leasing, lets the
running task finish and report, then the process ends on the signal."""

from __future__ import annotations

import os
import signal
import sys

import pytest
import pytest_twisted
import treq
from twisted.internet.defer import Deferred
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.task import deferLater

from gorge_testing.procs import free_port
from tests.support.paths import REPO_ROOT
from tests.worker.test_e2e import Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]


class Watch(ProcessProtocol):
    def __init__(self) -> None:
        self.ended: Deferred = Deferred()
        self.output = b""

    def outReceived(self, data: bytes) -> None:
        self.output += data

    errReceived = outReceived

    def processEnded(self, reason) -> None:
        self.ended.callback(reason.value)


async def running_one_task(reactor, stats_url: str, bound: float = 60.0) -> None:
    deadline = reactor.seconds() + bound
    while reactor.seconds() < deadline:
        try:
            response = await treq.get(stats_url, reactor=reactor).addTimeout(5, reactor)
            if (await response.json())["data"]["active"] == 1:
                return
        except Exception:
            pass  # not listening yet
        await deferLater(reactor, 0.05)
    raise AssertionError("the worker did not start the task within the bound")


@pytest_twisted.ensureDeferred
async def test_sigterm_drains_and_reports_then_exits(reactor, mariadb, worker_db):
    stack = Stack(reactor, mariadb, worker_db)
    await stack.start_queue()
    watch = Watch()
    process = None
    try:
        task_id = await stack.enqueue("PhabricatorTestWorker", '{"duration":2}')
        port = free_port()
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "GORGE_LISTEN_ADDR": f"127.0.0.1:{port}",
            "GORGE_WORKER_TASK_QUEUE_URL": stack.queue_url,
            "GORGE_WORKER_TASK_QUEUE_TOKEN": "queue-token",
            "GORGE_WORKER_POLL_INTERVAL_MS": "50",
            "GORGE_WORKER_NATIVE_TEST_WORKER": "1",
            "GORGE_LOG_LEVEL": "info",
        }
        argv = [
            sys.executable,
            "-c",
            "from twisted.scripts.twistd import run; run()",
            "--nodaemon",
            "--pidfile=",
            "--logger=gorge.log.output.observer_from_env",
            "gorge-worker",
        ]
        process = reactor.spawnProcess(watch, sys.executable, argv, env=env, path=str(REPO_ROOT))
        # The row is leased before the worker has the answer; a SIGTERM in
        # that window rightly hands the task back. Wait until the
        # worker itself says the task runs.
        await running_one_task(reactor, f"http://127.0.0.1:{port}/api/worker/stats")
        process.signalProcess("TERM")
        ended = await watch.ended.addTimeout(60, reactor)
        process = None
        archived = stack.row("worker_archivetask", task_id)
        assert archived is not None and archived["result"] == 0, watch.output.decode()
        assert archived["duration"] >= 2_000_000
        # twistd re-raises the stop signal: status 143, not 0
        assert getattr(ended, "signal", None) == signal.SIGTERM, repr(ended)
        assert b"WORKER_STOPPED" in watch.output
    finally:
        if process is not None:
            process.signalProcess("KILL")
            await watch.ended
        await stack.stop()
