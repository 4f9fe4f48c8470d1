"""gorge-worker -> gorge-taskqueue over HTTPS with a private CA: the real
queue service (SQLite store) behind its real TLS listener on 127.0.0.1 and
the real worker service, each built from its environment settings."""

from __future__ import annotations

import json

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.web.client import Agent

from gorge.config import ConfigError
from gorge.taskqueue.service import build_taskqueue_service
from gorge.taskqueue.settings import load_taskqueue_settings
from gorge.worker.service import build_worker_service
from gorge.worker.settings import load_worker_settings
from tests.support.certs import PrivateCA, TrustOnly
from tests.support.logcapture import logged_events

TOKEN = "queue-token"
BOUND = 30.0


async def until(check, bound=BOUND):
    """Poll ``check`` on the reactor until it returns something truthy."""
    deadline = reactor.seconds() + bound
    while not (value := check()):
        if reactor.seconds() > deadline:
            raise AssertionError("condition not reached within the bound")
        await deferLater(reactor, 0.02)
    return value


class TlsStack:
    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.ca = PrivateCA()
        self.ca_path = self.ca.write(tmp_path / "ca.pem")
        self.cert, self.key = self.ca.issue(tmp_path / "queue.pem", tmp_path / "queue-key.pem")
        self.services = []

    def queue_env(self, **extra):
        return {
            "GORGE_LISTEN_ADDR": "127.0.0.1:0",
            "GORGE_SERVICE_TOKEN": TOKEN,
            "GORGE_TASKQUEUE_BACKEND": "sqlite",
            "GORGE_TASKQUEUE_SQLITE_PATH": str(self.tmp / "queue.sqlite3"),
            "GORGE_TLS_CERT": self.cert,
            "GORGE_TLS_KEY": self.key,
            **extra,
        }

    def start_queue(self, **extra):
        self.queue = build_taskqueue_service(
            load_taskqueue_settings(self.queue_env(**extra)), reactor
        )
        self.queue.startService()
        self.services.append(self.queue)
        port = self.queue.part("listener").listening_port.getHost().port
        self.queue_url = f"https://127.0.0.1:{port}"

    def worker_service(self, **extra):
        env = {
            "GORGE_LISTEN_ADDR": "127.0.0.1:0",
            "GORGE_WORKER_TASK_QUEUE_URL": self.queue_url,
            "GORGE_WORKER_TASK_QUEUE_TOKEN": TOKEN,
            "GORGE_WORKER_TASK_QUEUE_CA": self.ca_path,
            "GORGE_WORKER_POLL_INTERVAL_MS": "20",
            "GORGE_WORKER_NATIVE_TEST_WORKER": "1",
            **extra,
        }
        return build_worker_service(load_worker_settings(env), reactor)

    def start_worker(self, **extra):
        self.worker = self.worker_service(**extra)
        self.worker.startService()
        self.services.append(self.worker)
        return self.worker

    async def enqueue(self, task_class="PhabricatorTestWorker", data='{"doWork":"nothing"}'):
        response = await treq.post(
            self.queue_url + "/api/queue/enqueue",
            json.dumps({"taskClass": task_class, "data": data}).encode(),
            headers={"X-Service-Token": TOKEN, "Content-Type": "application/json"},
            agent=Agent(reactor, contextFactory=TrustOnly(self.ca_path)),
        )
        body = json.loads(await response.content())
        assert response.code == 200, body
        return body["data"]["id"]

    async def stop(self):
        for service in reversed(self.services):
            await service.stopService()


@pytest.fixture
def stack(tmp_path):
    s = TlsStack(tmp_path)
    yield s
    pytest_twisted.blockon(Deferred.fromCoroutine(s.stop()))


@pytest.mark.parametrize("fast", ["on", "off"])
@pytest_twisted.ensureDeferred
async def test_the_worker_leases_runs_and_reports_over_https_with_a_private_ca(stack, fast):
    # on: the queue's lease and report calls are read by its hot channel,
    # inside TLS; off: every request by twisted.web's channel.
    stack.start_queue(GORGE_HTTP_FAST=fast)
    worker = stack.start_worker()
    first = await stack.enqueue()
    second = await stack.enqueue()
    counters = worker.part("consumer").counters
    await until(lambda: counters.processed == 2)
    assert first != second
    assert counters.failed == 0
    assert worker.part("consumer").lease_error is None
    assert stack.queue.part("listener").tls is not None


@pytest_twisted.ensureDeferred
async def test_a_queue_certificate_from_another_ca_is_refused_in_one_line_naming_the_setting(
    stack, tmp_path
):
    stack.start_queue()
    other = PrivateCA("some other CA").write(tmp_path / "other-ca.pem")
    with logged_events() as events:
        worker = stack.start_worker(GORGE_WORKER_TASK_QUEUE_CA=other)
        consumer = worker.part("consumer")
        # Several lease calls fail alike before the test looks.
        await until(lambda: consumer._failing_since_count >= 3)
    failed = [e for e in events if str(e.get("log_format", "")).startswith("WORKER_LEASE_")]
    assert len(failed) == 1, failed
    error = failed[0]["error"]
    assert failed[0]["log_format"].startswith("WORKER_LEASE_FAILED")
    assert "TLS certificate not accepted" in error
    assert stack.queue_url in error
    assert "certificate verify failed" in error
    assert f"GORGE_WORKER_TASK_QUEUE_CA={other}" in error
    assert consumer.counters.processed == 0
    assert worker.part("consumer").readiness_reason() is not None


@pytest_twisted.ensureDeferred
async def test_a_queue_that_asks_for_client_certificates_takes_the_workers_and_refuses_none(
    stack, tmp_path
):
    stack.start_queue(GORGE_TLS_CLIENT_CA=stack.ca_path)
    cert, key = stack.ca.issue(
        tmp_path / "worker.pem", tmp_path / "worker-key.pem", common_name="worker-1", client=True
    )
    worker = stack.start_worker(
        GORGE_WORKER_TASK_QUEUE_CLIENT_CERT=cert, GORGE_WORKER_TASK_QUEUE_CLIENT_KEY=key
    )
    counters = worker.part("consumer").counters
    # The enqueue below has no client certificate: refused by the handshake.
    with pytest.raises(Exception) as refused:
        await stack.enqueue()
    assert "SSL" in repr(refused.value) or "TLS" in repr(refused.value)
    anonymous = stack.start_worker()
    await until(lambda: anonymous.part("consumer").lease_error is not None)
    assert "TLS" in anonymous.part("consumer").lease_error
    assert worker.part("consumer").lease_error is None
    await until(lambda: worker.part("consumer").lease_attempted)
    assert counters.processed == 0


def test_a_private_ca_file_without_a_certificate_stops_the_build_naming_the_setting(
    stack, tmp_path
):
    stack.queue_url = "https://127.0.0.1:1"
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"not a certificate\n")
    with pytest.raises(ConfigError) as refused:
        stack.worker_service(GORGE_WORKER_TASK_QUEUE_CA=str(empty))
    assert refused.value.setting == "GORGE_WORKER_TASK_QUEUE_CA"
    assert str(empty) in refused.value.reason


def test_the_queue_ca_is_refused_with_a_plain_http_queue_url(stack):
    with pytest.raises(ConfigError) as refused:
        load_worker_settings(
            {
                "GORGE_WORKER_TASK_QUEUE_URL": "http://127.0.0.1:8090",
                "GORGE_WORKER_TASK_QUEUE_CA": stack.ca_path,
            }
        )
    assert refused.value.setting == "GORGE_WORKER_TASK_QUEUE_CA"
    assert "https://" in refused.value.reason


def test_a_client_key_that_is_not_the_certificates_stops_the_build(stack, tmp_path):
    stack.queue_url = "https://127.0.0.1:1"
    cert, _ = stack.ca.issue(tmp_path / "a.pem", tmp_path / "a-key.pem", client=True)
    _, other_key = stack.ca.issue(tmp_path / "b.pem", tmp_path / "b-key.pem", client=True)
    with pytest.raises(ConfigError) as refused:
        stack.worker_service(
            GORGE_WORKER_TASK_QUEUE_CLIENT_CERT=cert, GORGE_WORKER_TASK_QUEUE_CLIENT_KEY=other_key
        )
    assert refused.value.setting == "GORGE_WORKER_TASK_QUEUE_CLIENT_KEY"
