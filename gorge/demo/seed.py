"""What the demo seeds, what each item must end as, and the seeding itself.

Webhook rows are inserted into the herald tables the way Phorge inserts them
(``queued`` / ``none`` / epoch 0), by :class:`DemoHerald` playing Phorge;
tasks go through the taskqueue's HTTP API and mails through the mailer's, as
Phorge would send them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from twisted.internet.interfaces import IReactorTime

from gorge.client.exchange import exchange
from gorge.db import Database
from gorge.demo.handlers import FAIL_ONCE_CLASS, YIELD_ONCE_CLASS
from gorge.taskqueue.model import (
    PRIORITY_ALERTS,
    PRIORITY_BULK,
    PRIORITY_DEFAULT,
    PRIORITY_IMPORT,
)
from gorge.worker.handlers.test_worker import TASK_CLASS as TEST_WORKER_CLASS

HTTP_TIMEOUT = 10.0  # every call to a demo service is on loopback
ANSWER_LIMIT = 4 * 1024 * 1024  # the demo lists a few dozen tasks at most


@dataclass(frozen=True)
class DemoHook:
    name: str  # also the receiver path
    phid: str
    hmac_key: str
    answers: int  # the status the receiver answers with


@dataclass(frozen=True)
class DemoRequest:
    phid: str
    hook: str  # DemoHook.name
    object_phid: str
    retry_forever: bool
    expect: str  # "sent", "failed" or "retrying"
    # Inserted only once the hook's receiver has answered this many times (0: at start).
    after_hits: int = 0


@dataclass(frozen=True)
class DemoTask:
    label: str
    task_class: str
    priority: int
    data: dict
    expect: str  # "success" or "failure" (the archive result)
    failures: int = 0  # failureCount the archived row must show


@dataclass(frozen=True)
class DemoMail:
    label: str
    to: tuple[str, ...]
    subject: str
    expect: str  # "accepted" or "rejected"


HOOKS = (
    DemoHook(
        "team-chat", "PHID-HWBH-demoteamchat00000000", "k3y-team-chat-0123456789abcdefgh", 200
    ),
    DemoHook("ci-bridge", "PHID-HWBH-democibridge0000000", "k3y-ci-bridge-0123456789abcdefgh", 200),
    DemoHook("broken", "PHID-HWBH-demobroken0000000000", "k3y-broken-0123456789abcdefghijk", 500),
)

REQUESTS = (
    DemoRequest(
        "PHID-HWBR-demo000000000000001", "team-chat", "PHID-TASK-demo0000000000001", False, "sent"
    ),
    DemoRequest(
        "PHID-HWBR-demo000000000000002", "ci-bridge", "PHID-DREV-demo0000000000002", True, "sent"
    ),
    DemoRequest(
        "PHID-HWBR-demo000000000000003", "team-chat", "PHID-TASK-demo0000000000003", True, "sent"
    ),
    # retry=forever at a receiver that always answers 500: retried, then held by the
    # breaker once a second request of the same hook has failed too.
    DemoRequest(
        "PHID-HWBR-demo000000000000004", "broken", "PHID-TASK-demo0000000000004", True, "retrying"
    ),
    DemoRequest(
        "PHID-HWBR-demo000000000000005",
        "broken",
        "PHID-TASK-demo0000000000005",
        False,
        "failed",
        after_hits=2,
    ),
)

TASKS = (
    DemoTask("bulk import", TEST_WORKER_CLASS, PRIORITY_IMPORT, {"note": "import"}, "success"),
    DemoTask("alert", TEST_WORKER_CLASS, PRIORITY_ALERTS, {"note": "alert"}, "success"),
    DemoTask("default", TEST_WORKER_CLASS, PRIORITY_DEFAULT, {"note": "default"}, "success"),
    DemoTask("fails once", FAIL_ONCE_CLASS, PRIORITY_DEFAULT, {}, "success", failures=1),
    DemoTask("yields once", YIELD_ONCE_CLASS, PRIORITY_BULK, {}, "success"),
    DemoTask(
        "permanent failure",
        TEST_WORKER_CLASS,
        PRIORITY_BULK,
        {"doWork": "fail-permanent"},
        "failure",
    ),
)

MAILS = (
    DemoMail("welcome", ("alice@demo.test",), "Welcome to gorge", "accepted"),
    DemoMail("digest", ("bob@demo.test", "carol@demo.test"), "[Maniphest] T1: digest", "accepted"),
    DemoMail("bounce", ("nobody@bounce.demo.test",), "This one bounces", "rejected"),
)

REJECTED_ADDRESSES = frozenset(
    address for mail in MAILS if mail.expect == "rejected" for address in mail.to
)

SQL_INSERT_HOOK = (
    "INSERT INTO herald_webhook (phid, name, webhookURI, viewPolicy, editPolicy, status,"
    " hmacKey, dateCreated, dateModified)"
    " VALUES (%s, %s, %s, 'users', 'admin', 'enabled', %s, %s, %s)"
)
SQL_INSERT_REQUEST = (
    "INSERT INTO herald_webhookrequest (phid, webhookPHID, objectPHID, status, properties,"
    " lastRequestResult, lastRequestEpoch, dateCreated, dateModified)"
    " VALUES (%s, %s, %s, 'queued', %s, 'none', 0, %s, %s)"
)
SQL_REQUEST_STATES = "SELECT phid, status, lastRequestResult FROM herald_webhookrequest"


def hook_named(name: str) -> DemoHook:
    return next(hook for hook in HOOKS if hook.name == name)


def request_properties(request: DemoRequest) -> str:
    """The document Phorge's editor writes."""
    return json.dumps(
        {
            "retry": "forever" if request.retry_forever else "never",
            "transactionPHIDs": [request.object_phid.replace("PHID-", "PHID-XACT-", 1)],
            "triggerPHIDs": ["PHID-HRUL-demorule0000000001"],
            "silent": False,
            "secure": False,
            "test": False,
        },
        separators=(",", ":"),
    )


class DemoHerald:
    """Phorge's side of the herald tables, which the demo plays: it shares the
    webhook store's database, as Phorge shares it with gorge-webhook."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def insert(
        self,
        hooks: tuple[DemoHook, ...],
        requests: tuple[DemoRequest, ...],
        receiver_url: str,
        now: int,
    ) -> None:
        """Hooks and queued requests, in one transaction."""

        def insert(txn) -> None:
            self._db.engine.begin_write(txn)
            for hook in hooks:
                self._db.execute(
                    txn,
                    SQL_INSERT_HOOK,
                    (
                        hook.phid.encode(),
                        hook.name,
                        f"{receiver_url}/hooks/{hook.name}",
                        hook.hmac_key,
                        now,
                        now,
                    ),
                )
            for request in requests:
                self._db.execute(
                    txn,
                    SQL_INSERT_REQUEST,
                    (
                        request.phid.encode(),
                        hook_named(request.hook).phid.encode(),
                        request.object_phid.encode(),
                        request_properties(request),
                        now,
                        now,
                    ),
                )

        await self._db.run("demo_insert", insert)

    async def request_states(self) -> list[tuple[Any, Any, Any]]:
        """(phid, status, lastRequestResult) of every request, as stored."""

        def select(txn) -> list[tuple[Any, Any, Any]]:
            self._db.execute(txn, SQL_REQUEST_STATES)
            return txn.fetchall()

        return await self._db.run("demo_request_states", select)


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    token: str


async def call_api(
    agent, clock: IReactorTime, endpoint: Endpoint, method: str, path: str, body: dict | None = None
) -> tuple[int, Any]:
    """One bounded JSON call to a demo service: (status, decoded body or None)."""
    headers = {b"X-Service-Token": endpoint.token.encode()}
    if body is not None:
        headers[b"Content-Type"] = b"application/json"
    reply = await exchange(
        agent,
        clock,
        method,
        endpoint.base_url + path,
        headers=headers,
        body=b"" if body is None else json.dumps(body).encode(),
        deadline=clock.seconds() + HTTP_TIMEOUT,
        body_limit=ANSWER_LIMIT,
    )
    content = reply.require_body()
    try:
        decoded = json.loads(content) if content else None
    except ValueError:
        decoded = None
    return reply.status, decoded


async def enqueue_task(agent, clock: IReactorTime, queue: Endpoint, task: DemoTask) -> int:
    status, answer = await call_api(
        agent,
        clock,
        queue,
        "POST",
        "/api/queue/enqueue",
        {
            "taskClass": task.task_class,
            "data": json.dumps(task.data),
            "priority": task.priority,
        },
    )
    if status != 200:
        raise RuntimeError(f"enqueue of {task.label!r} answered HTTP {status}: {answer}")
    return int(answer["data"]["id"])


def mail_request(mail: DemoMail) -> dict:
    return {
        "message": {
            "from": {"name": "Phorge", "address": "noreply@phorge.demo.test"},
            "to": [{"name": "", "address": address} for address in mail.to],
            "subject": mail.subject,
            "textBody": f"This is the demo mail {mail.label!r}.\n",
            "headers": [{"name": "X-Phabricator-Sent-This-Message", "value": "Yes"}],
        },
    }


async def send_mail(
    agent, clock: IReactorTime, mailer: Endpoint, mail: DemoMail
) -> tuple[int, str]:
    """(HTTP status, the accepting backend's key or the error code)."""
    status, answer = await call_api(
        agent, clock, mailer, "POST", "/api/mailer/send", mail_request(mail)
    )
    answer = answer if isinstance(answer, dict) else {}
    if status == 200:
        return status, str(answer.get("data", {}).get("mailerKey", ""))
    return status, str(answer.get("error", {}).get("code", ""))
