"""Real ``twistd gorge-mailer`` processes: start-up errors and SIGTERM mid-send."""

from __future__ import annotations

import json
import signal
import socket
import stat
import subprocess

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.task import deferLater

from tests.mailer.conftest import valid_message
from tests.support.paths import REPO_ROOT
from tests.support.twistd import DAEMON_ARGS, TWISTD, daemon_environ

pytestmark = pytest.mark.slow

TWISTD_MAILER = [*TWISTD, *DAEMON_ARGS, "gorge-mailer"]


def environ(**extra: str) -> dict[str, str]:
    return daemon_environ(extra, drop=("GORGE_", "SMTP_", "MAILER_"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unbuildable_entry_exits_2_with_one_line():
    mailers = [{"key": "primary", "type": "smtp", "options": {"port": "abc", "password": "pw1"}}]
    proc = subprocess.run(
        TWISTD_MAILER,
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=60,
        env=environ(GORGE_MAILER_CONFIG=json.dumps(mailers)),
    )
    assert proc.returncode == 2
    assert proc.stderr.decode() == (
        "gorge-mailer: GORGE_MAILER_CONFIG [primary].port: not an integer: 'abc'\n"
    )
    assert b"pw1" not in proc.stdout + proc.stderr


@pytest_twisted.ensureDeferred
async def test_sigterm_lets_the_in_flight_send_finish(tmp_path):
    started = tmp_path / "started"
    stub = tmp_path / "sendmail"
    stub.write_text(f"#!/bin/sh\ntouch '{started}'\ncat > /dev/null\nsleep 1.5\nexit 0\n")
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    port = free_port()
    mailers = [{"key": "local", "type": "sendmail", "options": {"path": str(stub)}}]
    log = open(tmp_path / "daemon.log", "wb")
    proc = subprocess.Popen(
        TWISTD_MAILER,
        cwd=REPO_ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=environ(GORGE_MAILER_CONFIG=json.dumps(mailers), GORGE_LISTEN_ADDR=f"127.0.0.1:{port}"),
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(400):
            try:
                response = await treq.get(base + "/readyz").addTimeout(2, reactor)
                await response.content()
                if response.code == 200:
                    break
            except Exception:
                pass
            assert proc.poll() is None, (tmp_path / "daemon.log").read_text()
            await deferLater(reactor, 0.05)
        body = json.dumps({"message": valid_message()}).encode()
        pending = treq.post(
            base + "/api/mailer/send", data=body, headers={"Content-Type": ["application/json"]}
        )
        for _ in range(400):
            if started.exists():
                break
            await deferLater(reactor, 0.02)
        assert started.exists()
        proc.send_signal(signal.SIGTERM)
        response = await pending.addTimeout(20, reactor)
        doc = json.loads(await response.content())
        assert response.code == 200 and doc == {"data": {"mailerKey": "local"}}
        for _ in range(600):
            if proc.poll() is not None:
                break
            await deferLater(reactor, 0.05)
        # twistd re-raises the signal it stopped on once the shutdown is clean.
        assert proc.returncode in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
    text = (tmp_path / "daemon.log").read_text()
    assert "MAILER_SENT" in text and "Traceback" not in text
