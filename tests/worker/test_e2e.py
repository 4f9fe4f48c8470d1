"""End to end: the real gorge-taskqueue (its site on a loopback port, MySQL
store on the throwaway MariaDB) and the real worker service, talking HTTP."""

from __future__ import annotations

import json
from urllib.parse import parse_qsl

import pymysql
import pytest
import pytest_twisted
import treq
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from gorge.config import HttpSettings
from gorge.taskqueue.mysql import MySQLTaskStore
from gorge.taskqueue.service import build_taskqueue_service
from gorge.taskqueue.settings import TaskQueueSettings
from gorge.worker.outcome import Yield
from gorge.worker.service import build_worker_service
from gorge.worker.settings import load_worker_settings
from tests.worker.rawhttp import Answer

pytestmark = pytest.mark.integration

QUEUE_TOKEN = "queue-token"
BOUND = 30.0


class Stack:
    def __init__(self, reactor, mariadb, database):
        self.reactor, self.mariadb, self.database = reactor, mariadb, database

    async def start(self, *, worker_env=None, extra_handlers=None, **queue_settings):
        await self.start_queue(**queue_settings)
        self.worker = self.worker_service(worker_env, extra_handlers)
        self.worker.startService()

    def worker_service(self, worker_env=None, extra_handlers=None):
        env = {
            "GORGE_LISTEN_ADDR": "127.0.0.1:0",
            "GORGE_WORKER_TASK_QUEUE_URL": self.queue_url,
            "GORGE_WORKER_TASK_QUEUE_TOKEN": QUEUE_TOKEN,
            "GORGE_WORKER_POLL_INTERVAL_MS": "50",
            "GORGE_WORKER_NATIVE_TEST_WORKER": "1",
            **(worker_env or {}),
        }
        return build_worker_service(
            load_worker_settings(env), self.reactor, extra_handlers=extra_handlers
        )

    async def start_queue(self, **overrides):
        settings = TaskQueueSettings(
            http=HttpSettings(
                listen_addr="127.0.0.1:0", endpoint="tcp:0:interface=127.0.0.1", token=QUEUE_TOKEN
            ),
            mysql=self.mariadb.settings(self.database),
            **overrides,
        )
        self.store = MySQLTaskStore.from_settings(settings.mysql, self.reactor)
        self.queue = build_taskqueue_service(settings, self.reactor, store=self.store)
        self.port = self.reactor.listenTCP(0, self.queue.part("site"), interface="127.0.0.1")
        self.queue_url = f"http://127.0.0.1:{self.port.getHost().port}"

    async def stop(self):
        if hasattr(self, "worker"):
            await self.worker.stopService()
        await self.port.stopListening()
        await self.store.close()

    async def enqueue(self, task_class, data="{}"):
        response = await treq.post(
            self.queue_url + "/api/queue/enqueue",
            json.dumps({"taskClass": task_class, "data": data}).encode(),
            headers={"X-Service-Token": QUEUE_TOKEN, "Content-Type": "application/json"},
            reactor=self.reactor,
        )
        body = json.loads(await response.content())
        assert response.code == 200, body
        return body["data"]["id"]

    def row(self, table, task_id):
        conn = self.mariadb.connect(self.database)
        try:
            with conn.cursor(pymysql.cursors.DictCursor) as cur:
                cur.execute(f"SELECT * FROM {table} WHERE id = %s", (task_id,))
                return cur.fetchone()
        finally:
            conn.close()

    def database_now(self) -> int:
        """``UNIX_TIMESTAMP()``: the clock the queue's times are in."""
        conn = self.mariadb.connect(self.database)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT UNIX_TIMESTAMP()")
                return int(cur.fetchone()[0])
        finally:
            conn.close()

    async def until(self, check, bound=BOUND):
        """Poll ``check`` on the reactor until it returns something truthy."""
        deadline = self.reactor.seconds() + bound
        while True:
            value = check()
            if value:
                return value
            if self.reactor.seconds() > deadline:
                raise AssertionError("condition not reached within the bound")
            await deferLater(self.reactor, 0.05)

    def archived(self, task_id):
        return lambda: self.row("worker_archivetask", task_id)


@pytest.fixture
def stack(reactor, mariadb, worker_db):
    s = Stack(reactor, mariadb, worker_db)
    yield s
    if hasattr(s, "port"):
        pytest_twisted.blockon(Deferred.fromCoroutine(s.stop()))


@pytest_twisted.ensureDeferred
async def test_tasks_are_leased_run_and_archived(stack):
    await stack.start()
    ok = await stack.enqueue("PhabricatorTestWorker", '{"doWork":"nothing"}')
    permanent = await stack.enqueue("PhabricatorTestWorker", '{"doWork":"fail-permanent"}')
    done = await stack.until(stack.archived(ok))
    assert done["result"] == 0 and done["duration"] >= 0
    failed = await stack.until(stack.archived(permanent))
    assert failed["result"] == 1
    # The row is archived before the queue's answer reaches the worker, and
    # the counters move on that answer: wait for it.
    counters = stack.worker.part("consumer").counters
    await stack.until(lambda: counters.processed + counters.failed == 2)
    assert counters.processed == 1
    assert counters.failed == 1


@pytest_twisted.ensureDeferred
async def test_a_noop_class_is_leased_and_archived_as_completed(stack):
    await stack.start(worker_env={"GORGE_WORKER_NOOP_CLASSES": "RetiredWorker"})
    task_id = await stack.enqueue("RetiredWorker", '{"whatever": true}')
    done = await stack.until(stack.archived(task_id))
    assert done["result"] == 0
    counters = stack.worker.part("consumer").counters
    await stack.until(lambda: counters.processed == 1)


@pytest_twisted.ensureDeferred
async def test_temporary_failure_is_retried_after_its_wait(stack):
    await stack.start()
    task_id = await stack.enqueue(
        "PhabricatorTestWorker",
        '{"doWork":"fail-temporary","getWaitBeforeRetry":1,"getMaximumRetryCount":1}',
    )
    row = await stack.until(
        lambda: (r := stack.row("worker_activetask", task_id)) and r["failureCount"] == 1 and r
    )
    assert row["leaseOwner"] is None and row["leaseExpires"] <= row["failureTime"] + 1
    # second run fails again (count 2), third run is over the cap -> permanent
    archived = await stack.until(stack.archived(task_id))
    assert archived["result"] == 1 and archived["failureCount"] == 2


@pytest_twisted.ensureDeferred
async def test_yielded_task_comes_back_after_its_window(stack):
    runs = []

    def yield_once(task, data):
        runs.append(stack.reactor.seconds())
        if len(runs) == 1:
            raise Yield(5)

    await stack.start(extra_handlers={"YieldOnceWorker": yield_once})
    task_id = await stack.enqueue("YieldOnceWorker")
    row = await stack.until(
        lambda: (
            (r := stack.row("worker_activetask", task_id)) and r["leaseOwner"] == "(yield)" and r
        )
    )
    assert row["failureCount"] == 0
    archived = await stack.until(stack.archived(task_id))
    assert archived["result"] == 0 and len(runs) == 2
    assert runs[1] - runs[0] >= 5
    assert stack.worker.part("consumer").counters.yielded == 1


@pytest_twisted.ensureDeferred
async def test_unsupported_class_is_not_leased_or_is_failed_temporarily(stack):
    await stack.start()
    task_id = await stack.enqueue("UnknownWorker")
    control = await stack.enqueue("PhabricatorTestWorker")
    await stack.until(stack.archived(control))
    untouched = stack.row("worker_activetask", task_id)
    assert untouched["leaseOwner"] is None and untouched["failureCount"] == 0
    # A queue that ignored the class filter would hand it out anyway.
    stack.worker.part("plan").task_classes = None
    row = await stack.until(
        lambda: (r := stack.row("worker_activetask", task_id)) and r["failureCount"] == 1 and r
    )
    assert row["leaseOwner"] is None
    assert row["leaseExpires"] - row["failureTime"] == 60
    assert stack.worker.part("consumer").counters.failed == 0


@pytest_twisted.ensureDeferred
async def test_stop_lets_the_running_task_finish_and_report(stack):
    await stack.start()
    task_id = await stack.enqueue("PhabricatorTestWorker", '{"duration":1}')
    await stack.until(lambda: stack.worker.part("consumer").active == 1)
    leases_seen = []
    stack.worker.part("consumer")._queue.lease = lambda *a: leases_seen.append(
        a
    )  # must not be called
    stopping = stack.worker.stopService()
    assert stack.worker.part("consumer").readiness_reason() == "shutting down"
    await stopping
    archived = stack.row("worker_archivetask", task_id)
    assert archived is not None and archived["result"] == 0
    assert archived["duration"] >= 1_000_000
    assert leases_seen == []
    assert stack.worker.part("consumer").counters.processed == 1


def _conduit_answer(request):
    """worker.execute as Phorge's method answers it: success for a task, the
    expected error for the readiness probe's empty class."""
    params = json.loads(dict(parse_qsl(request.body.decode("ascii")))["params"])
    if params["taskClass"] == "":
        return Answer(body=b'{"result":null,"error_code":"ERR-NO-TASK-CLASS","error_info":"-"}')
    return Answer(body=b'{"result":{"result":"success"},"error_code":null,"error_info":null}')


def _classes_sent(server) -> list[str]:
    return [
        json.loads(dict(parse_qsl(r.body.decode("ascii")))["params"])["taskClass"]
        for r in server.requests
    ]


@pytest.mark.parametrize(
    "owner, sent",
    [
        ("gorge-webhook", ["PhabricatorSearchWorker"]),
        ("phorge", ["HeraldWebhookWorker", "PhabricatorSearchWorker"]),
    ],
)
@pytest_twisted.ensureDeferred
async def test_webhook_task_follows_its_owner(owner, sent, stack, raw_server):
    server, conduit_url = raw_server(_conduit_answer)
    await stack.start(
        worker_env={
            "GORGE_WORKER_CONDUIT_URL": conduit_url,
            "GORGE_WORKER_CONDUIT_TOKEN": "api-token",
            "GORGE_WORKER_CONDUIT_PROBE_SEC": "0",
            "GORGE_WORKER_WEBHOOK_OWNER": owner,
        }
    )
    webhook = await stack.enqueue(
        "HeraldWebhookWorker", '{"webhookRequestPHID":"PHID-HWBR-abcdefghijklmnopqrst"}'
    )
    archived = await stack.until(stack.archived(webhook))
    assert archived["result"] == 0
    # A later task of another class reaches the same Conduit receiver, so an
    # empty record for webhooks is not just a receiver nobody could reach.
    other = await stack.enqueue("PhabricatorSearchWorker")
    assert (await stack.until(stack.archived(other)))["result"] == 0
    assert sorted(_classes_sent(server)) == sent


@pytest_twisted.ensureDeferred
async def test_a_long_task_keeps_its_lease_and_runs_once_with_two_workers(stack):
    """With a 3 s lease, a task that runs for several leases is renewed by
    the worker running it; the second worker on the queue never gets a copy."""
    runs: list[tuple[str, int]] = []
    release: Deferred = Deferred()

    def long_task(name):
        def handler(task, data):
            runs.append((name, task["id"]))
            return release

        return handler

    await stack.start(lease_duration=3, extra_handlers={"LongWorker": long_task("first")})
    task_id = await stack.enqueue("LongWorker")
    await stack.until(lambda: runs)
    first_expiry = stack.row("worker_activetask", task_id)["leaseExpires"]
    second = stack.worker_service(extra_handlers={"LongWorker": long_task("second")})
    second.startService()
    try:
        # Two full leases past the first one, with the second worker polling.
        await stack.until(lambda: stack.reactor.seconds() > first_expiry + 6, bound=30)
        row = stack.row("worker_activetask", task_id)
        assert row["leaseExpires"] > stack.reactor.seconds()  # renewed, still held
        assert runs == [("first", task_id)]
        release.callback(None)
        archived = await stack.until(stack.archived(task_id))
    finally:
        await second.stopService()
    assert archived["result"] == 0 and archived["duration"] >= 6_000_000
    assert runs == [("first", task_id)]
    assert second.part("consumer").counters.processed == 0
    assert stack.worker.part("consumer").counters.processed == 1


async def _operate(stack, verb, body):
    response = await treq.post(
        stack.queue_url + "/api/queue/" + verb,
        json.dumps(body).encode(),
        headers={"X-Service-Token": QUEUE_TOKEN, "Content-Type": "application/json"},
        reactor=stack.reactor,
    )
    answer = json.loads(await response.content())
    assert response.code == 200, answer
    return answer


@pytest.mark.parametrize("verb", ["free", "cancel", "delay"])
@pytest_twisted.ensureDeferred
async def test_an_operator_verb_on_a_running_task_cancels_its_handler_at_the_next_heartbeat(
    stack, verb
):
    """Each lease has an owner of its own: after ``free`` the same worker leases
    the task again at once, yet the first run's heartbeat answers ``lost``, its
    handler is cancelled and nothing is reported for it; the second run's
    report archives the task once (docs/worker.md, Heartbeat leases)."""
    runs: list[Deferred] = []
    cancelled: list[int] = []

    def handler(task, data):
        d: Deferred = Deferred(lambda _: cancelled.append(len(runs)))
        runs.append(d)
        return d

    # The queue's long lease (7,200 s), as Phorge's tools get: only the
    # heartbeat can tell the worker.
    await stack.start(
        worker_env={"GORGE_WORKER_HEARTBEAT_SEC": "1"},
        extra_handlers={"LongWorker": handler},
    )
    task_id = await stack.enqueue("LongWorker")
    await stack.until(lambda: runs)
    body = {"taskID": task_id}
    if verb == "delay":  # a few seconds past the heartbeat, on the database's clock
        body["until"] = stack.database_now() + 4
    await _operate(stack, verb, body)
    await stack.until(lambda: cancelled, bound=10)
    assert cancelled == [1]  # the first run's, not a later one's
    consumer = stack.worker.part("consumer")
    await stack.until(lambda: consumer.counters.unreported == 1)
    if verb == "cancel":
        row = await stack.until(stack.archived(task_id))
        assert row["result"] == 2 and len(runs) == 1  # cancelled: no second run
        return
    if verb == "delay":  # nobody holds it, and nobody leases it before its time
        row = stack.row("worker_activetask", task_id)
        assert (row["leaseOwner"], row["leaseExpires"]) == (None, body["until"])
    # The same worker leases it again, under a new owner.
    await stack.until(lambda: len(runs) == 2)
    assert stack.row("worker_archivetask", task_id) is None
    runs[1].callback(None)
    archived = await stack.until(stack.archived(task_id))
    assert archived["result"] == 0
    await stack.until(lambda: consumer.counters.processed == 1)
    assert consumer.counters.processed == 1 and consumer.counters.failed == 0
