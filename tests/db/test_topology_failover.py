"""A failover as a Phorge site runs it, with real daemons on a real
primary/replica pair of MariaDB servers (gorge_testing.mariadb_server.ReplicatedPair).

gorge-webhook and gorge-taskqueue (twistd processes) find their master in
the topology file (``bin/config get cluster.databases``). The primary turns
read-only: both are unready within 15 s and claim nothing. The replica is
promoted (STOP SLAVE; read_only=0), the file names it, SIGHUP: both move to
it and the work resumes. Across the switch no webhook request is lost or
POSTed twice (one was in flight: its result lands on the new master), and
no task is lost or run twice (one leased before the switch is completed
after it, by its lease owner)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from gorge_testing.mariadb_server import MariaDBServer, ReplicatedPair
from gorge_testing.procs import free_port
from tests.support.twistd import TwistdProcess, daemon_environ
from tests.webhook.conftest import HeraldDB, Receiver

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.time_limit(240)]

NAMESPACE = "fo"
TOKEN = "failover-token"
OWNER = "failover-test:1"
# A daemon account as it should be: every privilege on its databases, none
# global (no READ ONLY ADMIN), so a read-only server refuses its writes.
USER, PASSWORD = "gorge_daemon", "daemon-password"
UNREADY_BOUND = 15.0
BOUND = 60.0


@pytest.fixture(scope="module")
def pair() -> Iterator[ReplicatedPair]:
    servers = ReplicatedPair()
    servers.start()
    try:
        primary = servers.primary
        for schema in ("herald", "worker"):
            primary.create_database(schema, f"{NAMESPACE}_{schema}")
        # Created on the primary: the replica gets the account by replication.
        primary.root_execute(
            f"CREATE USER '{USER}'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'",
            f"GRANT ALL PRIVILEGES ON `{NAMESPACE}\\_herald`.* TO '{USER}'@'127.0.0.1'",
            f"GRANT ALL PRIVILEGES ON `{NAMESPACE}\\_worker`.* TO '{USER}'@'127.0.0.1'",
        )
        servers.caught_up()
        yield servers
    finally:
        servers.stop()


def write_topology(path: Path, master: MariaDBServer, replica: MariaDBServer | None) -> None:
    """What ``bin/config get cluster.databases`` prints for this cluster."""
    hosts = [{"host": master.host, "port": master.port, "role": "master", "user": USER}]
    if replica is not None:
        hosts.append(
            {
                "host": replica.host,
                "port": replica.port,
                "role": "replica",
                "user": USER,
                "master": f"{master.host}:{master.port}",
            }
        )
    document = {
        "config": [
            {
                "key": "cluster.databases",
                "source": "local",
                "value": hosts,
                "status": "set",
                "errorInfo": None,
            }
        ]
    }
    path.write_text(json.dumps(document, indent=2))


async def until(what: str, predicate: Callable[[], object], bound: float = BOUND) -> None:
    """Wait for ``predicate`` (a coroutine function or a plain one) to be true."""
    deadline = reactor.seconds() + bound
    while True:
        value = predicate()
        if isinstance(value, Deferred) or hasattr(value, "__await__"):
            value = await value
        if value:
            return
        if reactor.seconds() > deadline:
            raise AssertionError(f"not within {bound} s: {what}")
        await deferLater(reactor, 0.05)


class Http:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    async def call(self, method: str, path: str, body: object = None) -> tuple[int, object]:
        data = None if body is None else json.dumps(body).encode()
        response = await treq.request(
            method,
            self.base + path,
            data=data,
            headers={"content-type": "application/json", "x-service-token": TOKEN},
            persistent=False,
            timeout=20,
        )
        content = await response.content()
        try:
            return response.code, json.loads(content)
        except ValueError:
            return response.code, content.decode("utf-8", "replace")

    async def ready(self) -> tuple[int, object]:
        return await self.call("GET", "/readyz")


@pytest_twisted.ensureDeferred
async def test_failover_to_a_promoted_replica_loses_and_repeats_nothing(pair, tmp_path):
    primary, replica = pair.primary, pair.replica
    topology = tmp_path / "cluster-databases.json"
    write_topology(topology, primary, replica)
    receiver = Receiver()
    herald = HeraldDB(primary, f"{NAMESPACE}_herald")
    daemons: list[TwistdProcess] = []
    drop = ("GORGE_",)
    try:
        common = {
            "GORGE_SERVICE_TOKEN": TOKEN,
            "GORGE_LOG_LEVEL": "info",
        }
        queue_port, webhook_port = free_port(), free_port()
        queue_proc = TwistdProcess(
            reactor,
            "gorge-taskqueue",
            daemon_environ(
                drop=drop,
                extra={
                    **common,
                    "GORGE_LISTEN_ADDR": f"127.0.0.1:{queue_port}",
                    "GORGE_TASKQUEUE_BACKEND": "mysql",
                    "GORGE_TASKQUEUE_NAMESPACE": NAMESPACE,
                    "GORGE_TASKQUEUE_MYSQL_PASS": PASSWORD,
                    # Host, port and user come from the topology file.
                    "GORGE_TASKQUEUE_MYSQL_HOST": "192.0.2.1",
                    "GORGE_TASKQUEUE_MYSQL_TOPOLOGY_FILE": str(topology),
                },
            ),
        )
        daemons.append(queue_proc)
        webhook_proc = TwistdProcess(
            reactor,
            "gorge-webhook",
            daemon_environ(
                drop=drop,
                extra={
                    **common,
                    "GORGE_LISTEN_ADDR": f"127.0.0.1:{webhook_port}",
                    "GORGE_WEBHOOK_NAMESPACE": NAMESPACE,
                    "GORGE_WEBHOOK_MYSQL_PASS": PASSWORD,
                    "GORGE_WEBHOOK_MYSQL_TOPOLOGY_FILE": str(topology),
                    "GORGE_WEBHOOK_OUTBOUND_BLACKLIST": "none",
                    "GORGE_WEBHOOK_SILENT_FROM": "none",
                    "GORGE_WEBHOOK_POLL_INTERVAL_MS": "100",
                    # Room for the write-back of the POST open during the switch.
                    "GORGE_WEBHOOK_CLAIM_LEASE_SEC": "120",
                },
            ),
        )
        daemons.append(webhook_proc)
        await queue_proc.serving()
        await webhook_proc.serving()
        queue, webhook = Http(queue_port), Http(webhook_port)
        for http in (queue, webhook):
            await until("ready on the primary", lambda http=http: _is(http.ready(), 200))

        # -- on the primary: deliveries, and tasks run ------------------------
        hook = herald.insert_hook(uri=f"{receiver.base}/hook")
        held_hook = herald.insert_hook(uri=f"{receiver.base}/held")
        before = [herald.insert_request(hook=hook) for _ in range(4)]
        await until("4 delivered", lambda: receiver.count("/hook") == 4)
        task_ids = []
        for n in range(6):
            code, body = await queue.call(
                "POST",
                "/api/queue/enqueue",
                {"taskClass": "FailoverTask", "data": json.dumps({"n": n})},
            )
            assert code == 200, body
            task_ids.append(body["data"]["id"])
        run: Counter[int] = Counter()
        for task in await lease(queue, 3):
            run[task["id"]] += 1
            assert await complete(queue, task["id"]) == 200
        # Leased now, completed only after the switch.
        (carried,) = await lease(queue, 1)
        run[carried["id"]] += 1

        # A POST open while the primary turns read-only.
        receiver.hold_until_arrived["/held"] = "/release"
        in_flight = herald.insert_request(hook=held_hook)
        await receiver.when_arrived("/held").addTimeout(BOUND, reactor)

        # -- the primary turns read-only --------------------------------------
        pair.set_read_only(primary, True)
        started = reactor.seconds()
        for http in (queue, webhook):
            await until(
                "unready, saying why",
                lambda http=http: _is(http.ready(), 503, "database read-only"),
                bound=UNREADY_BOUND - (reactor.seconds() - started),
            )
        # The held POST is answered now: its result write is refused and waits.
        await treq.post(f"{receiver.base}/release", persistent=False)
        await until("the POST answered", lambda: all(r.answered for r in receiver.requests))
        # Rows that arrive meanwhile (the test's account has SUPER and writes
        # past read_only; they replicate): none is claimed.
        during = [herald.insert_request(hook=hook) for _ in range(3)]
        code, body = await queue.call("POST", "/api/queue/lease", {"limit": 10})
        assert (code, body["error"]["code"]) == (503, "ERR_READ_ONLY")
        # Many polls of the webhook (100 ms apart) meanwhile; none claims.
        for _ in range(20):
            assert await _is(webhook.ready(), 503, "database read-only")
        assert receiver.count("/hook") == 4
        assert {herald.request(i)["status"] for i in during} == {"queued"}
        assert herald.request(in_flight)["status"] == "queued"  # its result not written

        # -- the replica promoted, the file changed, SIGHUP ---------------------
        pair.promote()
        write_topology(topology, replica, None)
        for proc in (queue_proc, webhook_proc):
            proc.signal("HUP")
        await queue_proc.wait_for(r"TASKQUEUE_DB_MASTER_CHANGED", BOUND)
        await webhook_proc.wait_for(r"WEBHOOK_DB_MASTER_CHANGED", BOUND)
        for http in (queue, webhook):
            await until("ready on the new master", lambda http=http: _is(http.ready(), 200))

        new_herald = HeraldDB(replica, f"{NAMESPACE}_herald")
        try:
            after = [new_herald.insert_request(hook=hook) for _ in range(2)]
            everything = [*before, *during, *after]
            await until(
                "every request sent from the new master",
                lambda: (
                    {new_herald.request(i)["status"] for i in [*everything, in_flight]} == {"sent"}
                ),
            )
            # The task leased before the switch is completed by its owner.
            assert await complete(queue, carried["id"]) == 200
            while len(run) < len(task_ids):
                leased = await lease(queue, 10)
                assert leased, f"tasks lost: {set(task_ids) - set(run)}"
                for task in leased:
                    run[task["id"]] += 1
                    assert await complete(queue, task["id"]) == 200
            assert await lease(queue, 10) == []
            archived = dict(
                _query(
                    replica,
                    f"SELECT id, result FROM {NAMESPACE}_worker.worker_archivetask",
                )
            )
            active = _query(replica, f"SELECT id FROM {NAMESPACE}_worker.worker_activetask")
        finally:
            new_herald.close()
        assert set(run) == set(task_ids) and set(run.values()) == {1}, run
        assert archived == dict.fromkeys(task_ids, 0) and active == []
        paths = Counter(r.path for r in receiver.requests)
        assert paths == {"/hook": len(everything), "/held": 1, "/release": 1}
        # Each request id POSTed once: the Phorge payload names none, the
        # deliveries are told apart by their rows, all sent exactly once above.
        assert receiver.count("/hook") == len(set(everything))
    finally:
        for proc in daemons:
            await proc.stop()
        herald.close()
        await receiver.port.stopListening()
    for proc in daemons:
        text = proc.text()
        assert "Traceback" not in text, text[-3000:]
    webhook_log = webhook_proc.text()
    assert webhook_log.count("WEBHOOK_DB_READ_ONLY") == 1
    assert "WEBHOOK_CLAIM_FAILED" not in webhook_log
    assert "WEBHOOK_RESULT_WRITE_FAILED" not in webhook_log


async def _is(answer, code: int, reason: str | None = None) -> bool:
    got_code, body = await answer
    if got_code != code:
        return False
    return reason is None or (isinstance(body, dict) and body.get("reason") == reason)


async def lease(queue: Http, limit: int) -> list[dict]:
    code, body = await queue.call("POST", "/api/queue/lease", {"limit": limit, "leaseOwner": OWNER})
    assert code == 200, body
    return body["data"]


async def complete(queue: Http, task_id: int) -> int:
    code, body = await queue.call(
        "POST", "/api/queue/complete", {"taskID": task_id, "leaseOwner": OWNER}
    )
    assert code == 200, body
    return code


def _query(server: MariaDBServer, sql: str) -> list[tuple]:
    conn = server.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()
