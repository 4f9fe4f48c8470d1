"""Shared fixtures for the taskqueue tests: an injected clock and one store
per backend (memory, SQLite file, MariaDB worker schema, Redis if present)."""

from __future__ import annotations

import importlib.util

import pytest
import pytest_twisted
from twisted.internet import task
from twisted.internet.defer import Deferred

from gorge.db.clock import HostTime
from gorge.taskqueue.memory import MemoryTaskStore

T0 = 1_795_947_000
LEASE = 7200
BACKENDS = ("mysql", "sqlite", "redis")


def redis_backend_available() -> bool:
    return importlib.util.find_spec("gorge.taskqueue.redis") is not None


@pytest.fixture
def clock() -> task.Clock:
    c = task.Clock()
    c.advance(T0)
    return c


@pytest.fixture
def memory_store(clock) -> MemoryTaskStore:
    return MemoryTaskStore(clock)


def open_sqlite_store(path, clock):
    from twisted.internet import reactor

    from gorge.taskqueue.sqlite import SQLiteTaskStore

    return SQLiteTaskStore.open(str(path), reactor, clock)


def open_mysql_store(mariadb, database, clock):
    from twisted.internet import reactor

    from gorge.db.mysql import make_pool
    from gorge.taskqueue.mysql import MySQLTaskStore

    # The database's clock, which the store reads, follows the test's.
    return MySQLTaskStore(
        make_pool(mariadb.settings(database), reactor), clock, reactor=reactor, db_clock=clock
    )


def open_redis_store(redis_server, prefix, clock):
    from gorge.db.redis import make_redis
    from gorge.taskqueue.redis import RedisTaskStore

    # Redis' clock cannot be set: the test's clock stands in for it.
    return RedisTaskStore(
        make_redis(redis_server.settings()), clock=clock, time=HostTime(clock), key_prefix=prefix
    )


@pytest.fixture
def sqlite_store(tmp_path, clock):
    store = open_sqlite_store(tmp_path / "queue.sqlite3", clock)
    yield store
    pytest_twisted.blockon(Deferred.fromCoroutine(store.close()))


@pytest.fixture
def mysql_store(mariadb, worker_db, clock):
    store = open_mysql_store(mariadb, worker_db, clock)
    store.database = worker_db
    yield store
    pytest_twisted.blockon(Deferred.fromCoroutine(store.close()))


@pytest.fixture(params=BACKENDS)
def backend_store(request, clock, tmp_path):
    """The same test against every real backend (Redis skipped if not written yet)."""
    if request.param == "sqlite":
        store = open_sqlite_store(tmp_path / "queue.sqlite3", clock)
    elif request.param == "mysql":
        mariadb = request.getfixturevalue("mariadb")
        store = open_mysql_store(mariadb, mariadb.create_database("worker"), clock)
    else:
        if not redis_backend_available():
            pytest.skip("gorge.taskqueue.redis is not there yet")
        redis_server = request.getfixturevalue("redis_server")
        store = open_redis_store(redis_server, redis_server.unique_prefix("tq"), clock)
    store.backend = request.param
    yield store
    pytest_twisted.blockon(Deferred.fromCoroutine(store.close()))
