"""gorge-taskqueue on a MySQL master that turns read-only (SET GLOBAL
read_only=1, a daemon account without READ ONLY ADMIN), or on a Redis that
becomes a replica (READONLY, a demoted master): /readyz says why,
the writing calls answer a retryable 503 instead of the opaque 500, and all
of it comes back by itself once the master takes writes again."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor

from gorge.taskqueue.mysql import MySQLTaskStore
from gorge_testing.redis_server import RedisServer
from tests.db.readonly import plain_user, set_read_only
from tests.support.logcapture import logged_events
from tests.taskqueue.conftest import open_redis_store
from tests.taskqueue.helpers import Client

pytestmark = pytest.mark.integration

READ_ONLY = {
    "error": {"code": "ERR_READ_ONLY", "message": "the database is read-only now; retry later"}
}
TASK = {"taskClass": "PhabricatorTestWorker", "data": '{"x":1}'}


@pytest_twisted.ensureDeferred
async def test_read_only_master_gives_retryable_503_and_unready(mariadb, worker_db, clock):
    with plain_user(mariadb, worker_db) as settings:
        store = MySQLTaskStore.from_settings(settings, reactor, clock, db_clock=clock)
        try:
            client = Client(store, clock)
            code, first = await client.post("enqueue", TASK)
            assert code == 200, first

            set_read_only(mariadb, True)
            with logged_events() as events:
                assert await client.post("enqueue", TASK) == (503, READ_ONLY)
                assert await client.post("lease", {"limit": 1}) == (503, READ_ONLY)
                assert await client.get("/readyz", token=None) == (
                    503,
                    {"status": "unavailable", "reason": "database read-only"},
                )
            names = [str(e.get("log_format", "")).split(" ")[0] for e in events]
            assert "TASKQUEUE_BACKEND_FAILED" not in names
            assert names.count("TASKQUEUE_DB_READ_ONLY") == 1

            set_read_only(mariadb, False)
            assert await client.get("/readyz", token=None) == (200, {"status": "ok"})
            code, leased = await client.post("lease", {"limit": 1})
            assert code == 200
            # Nothing refused was half-written: only the task enqueued before.
            assert [t["id"] for t in leased["data"]] == [first["data"]["id"]]
        finally:
            await store.close()


@pytest.fixture
def own_redis():
    """A Redis of this test's own: it is turned into a replica, which the
    session's shared server must never be."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _replica_of_nobody(server, replica: bool) -> None:
    # REPLICAOF a port nothing listens on: the server keeps its data and
    # refuses every write with READONLY, as a demoted master does.
    with server.client() as client:
        if replica:
            client.execute("REPLICAOF", "127.0.0.1", "9")
        else:
            client.execute("REPLICAOF", "NO", "ONE")


@pytest_twisted.ensureDeferred
async def test_a_redis_that_refuses_writes_gives_the_retryable_503_and_unready(own_redis, clock):
    store = open_redis_store(own_redis, own_redis.unique_prefix("ro"), clock)
    try:
        client = Client(store, clock)
        code, first = await client.post("enqueue", TASK)
        assert code == 200, first

        _replica_of_nobody(own_redis, True)
        with logged_events() as events:
            assert await client.post("enqueue", TASK) == (503, READ_ONLY)
            assert await client.post("lease", {"limit": 1}) == (503, READ_ONLY)
            assert await client.get("/readyz", token=None) == (
                503,
                {"status": "unavailable", "reason": "database read-only"},
            )
        names = [str(e.get("log_format", "")).split(" ")[0] for e in events]
        assert "TASKQUEUE_BACKEND_FAILED" not in names
        assert names.count("TASKQUEUE_DB_READ_ONLY") == 1

        _replica_of_nobody(own_redis, False)
        with logged_events() as events:
            assert await client.get("/readyz", token=None) == (200, {"status": "ok"})
        names = [str(e.get("log_format", "")).split(" ")[0] for e in events]
        assert names.count("TASKQUEUE_DB_WRITABLE") == 1
        code, leased = await client.post("lease", {"limit": 1})
        assert code == 200
        # Nothing refused was half-written: only the task enqueued before.
        assert [t["id"] for t in leased["data"]] == [first["data"]["id"]]
    finally:
        await store.close()
