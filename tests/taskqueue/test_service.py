"""Start-up configuration, lazy connections and readiness."""

from __future__ import annotations

import json

import pytest
import pytest_twisted
import treq

from gorge.config import ConfigError
from gorge.taskqueue.service import Options, build_taskqueue_service, makeService
from gorge.taskqueue.settings import load_taskqueue_settings
from tests.taskqueue.helpers import Client, make_settings


@pytest.mark.parametrize(
    "value,expected", [("", "mysql"), ("mysql", "mysql"), ("redis", "redis"), ("sqlite", "sqlite")]
)
def test_backend_names(value, expected):
    assert load_taskqueue_settings({"GORGE_TASKQUEUE_BACKEND": value}).backend == expected


@pytest.mark.parametrize(
    "env,setting",
    [
        ({"GORGE_TASKQUEUE_BACKEND": "redsi"}, "GORGE_TASKQUEUE_BACKEND"),
        ({"GORGE_TASKQUEUE_BACKEND": "MySQL"}, "GORGE_TASKQUEUE_BACKEND"),
        ({"GORGE_TASKQUEUE_LEASE_DURATION": "0"}, "GORGE_TASKQUEUE_LEASE_DURATION"),
        ({"GORGE_TASKQUEUE_LEASE_DURATION": "-7"}, "GORGE_TASKQUEUE_LEASE_DURATION"),
        ({"GORGE_TASKQUEUE_LEASE_DURATION": "2h"}, "GORGE_TASKQUEUE_LEASE_DURATION"),
        ({"GORGE_TASKQUEUE_RETRY_WAIT": "-1"}, "GORGE_TASKQUEUE_RETRY_WAIT"),
        ({"GORGE_TASKQUEUE_RETRY_WAIT": "5m"}, "GORGE_TASKQUEUE_RETRY_WAIT"),
        ({"GORGE_TASKQUEUE_MYSQL_PORT": "x"}, "GORGE_TASKQUEUE_MYSQL_PORT"),
        (
            {"GORGE_TASKQUEUE_BACKEND": "redis", "GORGE_TASKQUEUE_REDIS_ADDR": "nohost"},
            "GORGE_TASKQUEUE_REDIS_ADDR",
        ),
        (
            {"GORGE_TASKQUEUE_BACKEND": "redis", "GORGE_TASKQUEUE_REDIS_DB": "one"},
            "GORGE_TASKQUEUE_REDIS_DB",
        ),
        ({"GORGE_LISTEN_ADDR": "nonsense"}, "GORGE_LISTEN_ADDR"),
    ],
)
def test_bad_settings_name_the_variable_and_the_value(env, setting):
    """No fallback; the one line names the variable and the bad value."""
    with pytest.raises(ConfigError) as info:
        load_taskqueue_settings(env)
    assert info.value.setting == setting
    assert env[setting] in info.value.reason


def test_unknown_backend_names_the_accepted_values():
    """The error names the bad value and the accepted ones."""
    with pytest.raises(ConfigError) as info:
        load_taskqueue_settings({"GORGE_TASKQUEUE_BACKEND": "redsi"})
    assert all(name in info.value.reason for name in ("mysql", "redis", "sqlite"))


def test_defaults():
    s = load_taskqueue_settings({})
    assert (s.backend, s.http.listen_addr, s.lease_duration, s.retry_wait) == (
        "mysql",
        ":8090",
        7200,
        300,
    )
    assert s.mysql.database == "phorge_worker" and s.mysql.user == "phorge"
    # The database is Phorge's too; the pool stays modest and every wait is bounded.
    assert (
        s.mysql.host,
        s.mysql.port,
        s.mysql.max_connections,
        s.mysql.connect_timeout,
        s.mysql.read_timeout,
        s.mysql.write_timeout,
    ) == ("127.0.0.1", 3306, 25, 5, 30, 30)
    r = load_taskqueue_settings({"GORGE_TASKQUEUE_BACKEND": "redis"})
    assert (r.redis.host, r.redis.port, r.redis.db, r.redis.poolsize, r.redis_key_prefix) == (
        "127.0.0.1",
        6379,
        0,
        25,
        "gorge:tq:",
    )
    s = load_taskqueue_settings(
        {
            "GORGE_TASKQUEUE_NAMESPACE": "phabricator",
            "GORGE_TASKQUEUE_BACKEND": "sqlite",
            "GORGE_TASKQUEUE_SQLITE_PATH": "/tmp/q.db",
        }
    )
    assert (s.mysql.database, s.sqlite_path) == ("phabricator_worker", "/tmp/q.db")
    assert "secret" not in repr(
        load_taskqueue_settings(
            {"GORGE_TASKQUEUE_MYSQL_PASS": "secret", "GORGE_SERVICE_TOKEN": "secret"}
        )
    )


def test_make_service_exits_2_with_one_line(monkeypatch, capsys):
    monkeypatch.setenv("GORGE_TASKQUEUE_BACKEND", "redsi")
    options = Options()
    options.parseOptions([])
    with pytest.raises(SystemExit) as info:
        makeService(options)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("gorge-taskqueue: GORGE_TASKQUEUE_BACKEND: ") and "redsi" in err


@pytest_twisted.ensureDeferred
async def test_make_service_connects_nowhere(monkeypatch):
    monkeypatch.setenv("GORGE_TASKQUEUE_MYSQL_HOST", "127.0.0.1")
    monkeypatch.setenv("GORGE_TASKQUEUE_MYSQL_PORT", "1")  # nothing listens there
    options = Options()
    options.parseOptions(["--listen", "127.0.0.1:0"])
    service = makeService(options)
    assert service.part("settings").backend == "mysql" and not service.running
    await service.part("store").close()


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_readyz_is_503_until_the_database_exists_then_200(mariadb):
    from twisted.internet import reactor

    from gorge.db.mysql import make_pool
    from gorge.taskqueue.mysql import MySQLTaskStore

    name = f"t_late_{id(reactor) % 100000}_worker"
    store = MySQLTaskStore(make_pool(mariadb.settings(name), reactor), reactor)
    client = Client(store, reactor, backend="mysql")
    try:
        assert await client.get("/healthz", token=None) == (200, {"status": "ok"})
        code, answer = await client.get("/readyz", token=None)
        assert (code, answer) == (
            503,
            {"status": "unavailable", "reason": "ping database: unknown database"},
        )
        code, answer = await client.get("stats")
        assert (code, answer) == (
            500,
            {"error": {"code": "ERR_INTERNAL", "message": "internal server error"}},
        )
        assert name.encode() not in client.last_body
        mariadb.create_database("worker", name)  # Phorge's storage upgrade, later
        assert await client.get("/readyz", token=None) == (200, {"status": "ok"})
        assert (await client.get("stats"))[0] == 200
    finally:
        await store.close()


@pytest_twisted.ensureDeferred
async def test_sqlite_readyz_follows_the_file(tmp_path):
    from twisted.internet import reactor

    from gorge.taskqueue.sqlite import SQLiteTaskStore

    directory = tmp_path / "later"
    store = SQLiteTaskStore.open(str(directory / "queue.sqlite3"), reactor)
    client = Client(store, reactor)
    try:
        code, answer = await client.get("/readyz", token=None)
        assert code == 503 and answer["reason"].startswith("open database:")
        directory.mkdir()
        assert await client.get("/readyz", token=None) == (200, {"status": "ok"})
        code, answer = await client.post("enqueue", {"taskClass": "X"})
        assert (code, answer["data"]["id"]) == (200, 1)
    finally:
        await store.close()


@pytest_twisted.ensureDeferred
async def test_service_listens_serves_and_stops_in_order(tmp_path):
    from twisted.internet import reactor

    settings = make_settings(backend="sqlite", sqlite_path=str(tmp_path / "q.sqlite3"))
    service = build_taskqueue_service(settings, reactor)
    service.startService()
    try:
        base = f"http://127.0.0.1:{service.part('listener').listening_port.getHost().port}"
        headers = {"X-Service-Token": "contract-token", "Content-Type": "application/json"}
        response = await treq.post(
            base + "/api/queue/enqueue",
            headers=headers,
            data=json.dumps({"taskClass": "X"}).encode(),
        ).addTimeout(10, reactor)
        body = json.loads(await response.content())
        assert (response.code, body["data"]["id"]) == (200, 1)
        response = await treq.get(base + "/metrics").addTimeout(10, reactor)
        assert (
            b'gorge_taskqueue_tasks_enqueued_total{task_class="X"} 1.0' in await response.content()
        )
    finally:
        await service.stopService()
    assert not service.running
    assert service.part("store").db.pool.running is False


class _Notifier:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def ready(self) -> None:
        self.calls.append("ready")

    def progress(self) -> None:
        self.calls.append("progress")

    def stopping(self) -> None:
        self.calls.append("stopping")


@pytest_twisted.ensureDeferred
async def test_stats_loop_sets_depth_and_reports_ready_even_when_the_backend_is_down(
    memory_store, clock
):
    notifier = _Notifier()
    service = build_taskqueue_service(make_settings(), clock, store=memory_store, notifier=notifier)
    client = Client(memory_store, clock)
    await client.post("enqueue", {"taskClass": "X"})
    await service.part("stats").refresh()
    assert notifier.calls[:2] == ["ready", "progress"]
    assert (
        service.part("metrics-registry").get_sample_value(
            "gorge_taskqueue_queue_depth", {"state": "active"}
        )
        == 1.0
    )
    clock.advance(7)
    await service.part("stats").refresh()
    assert (
        service.part("metrics-registry").get_sample_value(
            "gorge_taskqueue_oldest_waiting_seconds",
            {"task_class": "X", "priority_band": "default"},
        )
        == 7.0
    )
    memory_store.unreachable = "down"

    async def broken():
        raise ConnectionRefusedError()

    memory_store.stats = broken
    with pytest.raises(ConnectionRefusedError):
        await service.part("stats").refresh()
    assert notifier.calls[-2:] == ["ready", "progress"]


@pytest.mark.parametrize("abandon", [False, True])
@pytest_twisted.ensureDeferred
async def test_stop_drains_a_store_call_in_flight_before_closing_the_backend(clock, abandon):
    """Stop accepting, let the request in flight finish, then close the backend."""
    from twisted.internet import reactor
    from twisted.internet.defer import Deferred
    from twisted.internet.task import deferLater

    from gorge.taskqueue.memory import MemoryTaskStore
    from tests.support.logcapture import logged_events

    class Gated(MemoryTaskStore):
        def __init__(self, clock) -> None:
            super().__init__(clock)
            self.entered: Deferred = Deferred()
            self.gate: Deferred = Deferred()
            self.closed = False

        async def list_tasks(self, limit, offset):
            self.entered.callback(None)
            await self.gate
            return await super().list_tasks(limit, offset)

        async def close(self) -> None:
            self.closed = True

    store = Gated(clock)
    client = Client(store, clock)
    client.service.startService()
    answer = Deferred.fromCoroutine(client.get("tasks"))
    await store.entered.addTimeout(10, reactor)
    stopping = client.service.stopService()
    for _ in range(5):  # a few turns of the reactor: nothing may close yet
        await deferLater(reactor, 0.01)
    assert not store.closed and not stopping.called
    if abandon:
        # The drain is bounded (10 s on the service clock), then the backend closes.
        with logged_events() as events:
            clock.advance(10)
            await stopping.addTimeout(10, reactor)
        assert store.closed
        assert any(
            str(e.get("log_format", "")).startswith("TASKQUEUE_DRAIN_ABANDONED") for e in events
        )
        store.gate.callback(None)
        await answer
        return
    store.gate.callback(None)
    assert await answer == (200, {"data": []})
    await stopping.addTimeout(10, reactor)
    assert store.closed


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_readyz_does_not_check_the_tables(mariadb, worker_db):
    """A database without Phorge's tables yet is ready; only real calls fail."""
    from twisted.internet import reactor

    from gorge.db.mysql import make_pool
    from gorge.taskqueue.mysql import MySQLTaskStore

    name = worker_db + "_empty"
    admin = mariadb.connect(worker_db)
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}`")
    finally:
        admin.close()
    store = MySQLTaskStore(make_pool(mariadb.settings(name), reactor), reactor)
    client = Client(store, reactor, backend="mysql")
    try:
        assert await client.get("/readyz", token=None) == (200, {"status": "ok"})
        code, answer = await client.post("enqueue", {"taskClass": "X"})
        assert (code, answer) == (
            500,
            {"error": {"code": "ERR_INTERNAL", "message": "internal server error"}},
        )
        assert b"worker_" not in client.last_body
    finally:
        await store.close()
