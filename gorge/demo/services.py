"""The four services, configured for the demo and built in one reactor.

Everything listens on 127.0.0.1, stores live in SQLite files under the demo's
working directory, and the windows that make real deployments patient
(retry backoff, claim lease, task retry wait) are cut to a few seconds so
the whole story plays out in seconds.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass

from twisted.application.service import IService

from gorge.app.tree import ServiceTree
from gorge.config import HttpSettings, MySQLSettings, parse_listen_addr
from gorge.demo.handlers import (
    FAIL_ONCE_CLASS,
    YIELD_ONCE_CLASS,
    FailOnce,
    TaskRun,
    YieldOnce,
    observed_handlers,
)
from gorge.demo.herald_schema import HERALD_SCHEMA
from gorge.demo.seed import Endpoint
from gorge.mailer.backends.base import BackendEntry
from gorge.mailer.service import build_mailer_service
from gorge.mailer.settings import MailerSettings
from gorge.taskqueue.service import build_taskqueue_service
from gorge.taskqueue.settings import TaskQueueSettings
from gorge.taskqueue.sqlite import SQLiteTaskStore
from gorge.webhook.service import build_webhook_service
from gorge.webhook.settings import WebhookSettings
from gorge.webhook.store import WebhookStore
from gorge.worker.handlers.test_worker import TASK_CLASS as TEST_WORKER_CLASS
from gorge.worker.handlers.test_worker import TestWorker
from gorge.worker.service import build_worker_service
from gorge.worker.settings import WorkerSettings

SERVICES = ("webhook", "mailer", "taskqueue", "worker")


def free_port() -> int:
    """A loopback port that was free a moment ago (the listener fails loudly if not)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _http(port: int) -> HttpSettings:
    address = f"127.0.0.1:{port}"
    return HttpSettings(
        listen_addr=address, endpoint=parse_listen_addr(address), token=secrets.token_hex(16)
    )


@dataclass(frozen=True)
class DemoSettings:
    webhook: WebhookSettings
    mailer: MailerSettings
    taskqueue: TaskQueueSettings
    worker: WorkerSettings
    webhook_db: str

    def endpoints(self) -> dict[str, Endpoint]:
        def endpoint(http: HttpSettings) -> Endpoint:
            return Endpoint(f"http://{http.listen_addr}", http.token)

        return {
            "webhook": endpoint(self.webhook.http),
            "mailer": endpoint(self.mailer.http),
            "taskqueue": endpoint(self.taskqueue.http),
            "worker": endpoint(self.worker.http),
        }


def demo_settings(workdir: str, smtp_port: int) -> DemoSettings:
    ports = {name: free_port() for name in SERVICES}
    taskqueue_http = _http(ports["taskqueue"])
    webhook = WebhookSettings(
        http=_http(ports["webhook"]),
        mysql=MySQLSettings(database="unused-the-demo-runs-on-sqlite"),
        poll_interval=0.2,
        delivery_timeout=1,
        max_concurrent=4,
        # The breaker counts failing rows, not attempts: two rows of one hook open it.
        breaker_window=60,
        breaker_threshold=2,
        retry_backoff=3,
        claim_lease=3,
        outbound_blacklist=(),  # the receiver is on loopback, which Phorge's default refuses
    )
    mailer = MailerSettings(
        http=_http(ports["mailer"]),
        entries=(
            BackendEntry(
                key="smtp",
                type="smtp",
                priority=10,
                options={"host": "127.0.0.1", "port": str(smtp_port), "helo": "gorge-demo.test"},
            ),
        ),
        max_retries=0,
        retry_wait=0.0,
        send_timeout=10.0,
    )
    taskqueue = TaskQueueSettings(
        http=taskqueue_http,
        backend="sqlite",
        sqlite_path=os.path.join(workdir, "taskqueue.sqlite3"),
        retry_wait=1,
        drain_timeout=5.0,
        stats_interval=1.0,
    )
    worker = WorkerSettings(
        http=_http(ports["worker"]),
        queue_url=f"http://{taskqueue_http.listen_addr}",
        queue_token=taskqueue_http.token,
        # One task per lease shows the priority order; two slots let a retry overlap.
        lease_limit=1,
        poll_interval_ms=200,
        max_workers=2,
        drain_timeout_sec=5,
        native_test_worker=False,  # registered below, wrapped so the demo sees each run
    )
    return DemoSettings(
        webhook, mailer, taskqueue, worker, webhook_db=os.path.join(workdir, "herald.sqlite3")
    )


@dataclass
class DemoStack:
    root: ServiceTree  # gorge-taskqueue, gorge-webhook, gorge-mailer
    worker: IService  # started once the tasks are queued, so leases follow priority
    webhook_store: WebhookStore
    task_store: SQLiteTaskStore


def build_stack(
    settings: DemoSettings, reactor, on_task_run: Callable[[TaskRun], None]
) -> DemoStack:
    """The services, not started; the worker stays apart (see :class:`DemoStack`)."""
    webhook_store = WebhookStore.sqlite(settings.webhook_db, reactor, schema=HERALD_SCHEMA)
    task_store = SQLiteTaskStore.open(settings.taskqueue.sqlite_path, reactor)
    handlers = observed_handlers(
        {
            TEST_WORKER_CLASS: TestWorker(reactor),
            FAIL_ONCE_CLASS: FailOnce(),
            YIELD_ONCE_CLASS: YieldOnce(),
        },
        on_task_run,
    )
    root = ServiceTree("gorge-demo")
    root.add(
        "gorge-taskqueue", build_taskqueue_service(settings.taskqueue, reactor, store=task_store)
    )
    root.add("gorge-webhook", build_webhook_service(settings.webhook, reactor, store=webhook_store))
    root.add("gorge-mailer", build_mailer_service(settings.mailer, reactor))
    worker = build_worker_service(settings.worker, reactor, extra_handlers=handlers)
    return DemoStack(root, worker, webhook_store, task_store)
