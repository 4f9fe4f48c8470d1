"""Start-up refusals through the real twistd command line."""

from __future__ import annotations

import socket
import subprocess

import pytest

from tests.support.twistd import TWISTD, daemon_environ

SERVICES = ("gorge-webhook", "gorge-mailer", "gorge-taskqueue", "gorge-worker")

# Enough for each daemon to get past its own settings: nothing here is dialled
# before the listener binds (connections are lazy).
BASE_ENV = {
    "GORGE_TASKQUEUE_BACKEND": "sqlite",
    "GORGE_MAILER_CONFIG": '[{"key":"t","type":"test"}]',
    "GORGE_WORKER_TASK_QUEUE_URL": "http://127.0.0.1:9",
}


def _twistd(tapname: str, extra_env: dict[str, str], tmp_path) -> subprocess.CompletedProcess:
    env = daemon_environ(
        {
            **BASE_ENV,
            "GORGE_TASKQUEUE_SQLITE_PATH": str(tmp_path / "queue.sqlite3"),
            **extra_env,
        },
        drop=("GORGE_",),
    )
    return subprocess.run(
        [*TWISTD, "--nodaemon", "--pidfile=", tapname],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("tapname", SERVICES)
def test_bad_log_level_exits_2_with_one_line(tapname, tmp_path):
    result = _twistd(tapname, {"GORGE_LOG_LEVEL": "loud"}, tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{tapname}: GORGE_LOG_LEVEL: ")
    assert "loud" in lines[0]
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize("tapname", SERVICES)
def test_bad_listen_address_exits_2(tapname, tmp_path):
    result = _twistd(tapname, {"GORGE_LISTEN_ADDR": "not-an-address"}, tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().startswith(f"{tapname}: GORGE_LISTEN_ADDR: ")


@pytest.mark.parametrize("tapname", SERVICES)
def test_busy_port_makes_start_up_fail(tapname, tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        result = _twistd(tapname, {"GORGE_LISTEN_ADDR": f"127.0.0.1:{port}"}, tmp_path)
    finally:
        taken.close()
    assert result.returncode != 0
    assert "Address already in use" in result.stdout + result.stderr


WORKER_CONDUIT = {
    "GORGE_WORKER_CONDUIT_URL": "http://127.0.0.1:9",
    "GORGE_WORKER_CONDUIT_TOKEN": "api-token",
}


@pytest.mark.parametrize(
    "extra_env, words",
    [
        # Conduit with a catch-all: the worker would run HeraldWebhookWorker.
        (
            WORKER_CONDUIT,
            [
                "must be set",
                "gorge-webhook (gorge-webhook delivers webhooks",
                "phorge (no gorge-webhook; Phorge delivers them",
            ],
        ),
        ({"GORGE_WORKER_WEBHOOK_OWNER": "phorge"}, ["GORGE_WORKER_CONDUIT_URL"]),
        (
            {
                **WORKER_CONDUIT,
                "GORGE_WORKER_WEBHOOK_OWNER": "gorge-webhook",
                "GORGE_WORKER_DELEGATE_CLASSES": "HeraldWebhookWorker",
            },
            ["contradicts GORGE_WORKER_DELEGATE_CLASSES"],
        ),
        ({"GORGE_WORKER_WEBHOOK_OWNER": "yes"}, ["unknown value 'yes'"]),
    ],
    ids=["unset-with-conduit", "phorge-without-conduit", "gorge-webhook-and-delegated", "unknown"],
)
def test_worker_refuses_an_unclear_webhook_owner(extra_env, words, tmp_path):
    result = _twistd("gorge-worker", extra_env, tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gorge-worker: GORGE_WORKER_WEBHOOK_OWNER: ")
    for word in words:
        assert word in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
