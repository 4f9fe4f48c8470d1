"""Session-wide fixtures: throwaway MariaDB and Redis, started lazily.

A server starts the first time a test requests its fixture and stops at the
end of the session, so unit-test runs that need neither never pay for them.
Both listen on 127.0.0.1 only, on a free port, with their data in a
temporary directory.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.mariadb_server import MariaDBServer
from tests.support.procs import ServerUnavailable
from tests.support.redis_server import RedisServer


def _started(server_class):
    try:
        server = server_class()
        server.start()
    except ServerUnavailable as e:
        pytest.fail(str(e), pytrace=False)
    return server


@pytest.fixture(scope="session")
def mariadb() -> Iterator[MariaDBServer]:
    """The session's MariaDB: ``.host``, ``.port``, ``.user``, ``.password``,
    ``.create_database(schema, name=None)``, ``.connect(db)``, ``.settings(db)``."""
    server = _started(MariaDBServer)
    yield server
    server.stop()


@pytest.fixture
def herald_db(mariadb: MariaDBServer) -> str:
    """Name of a fresh database built from phabricator_herald.sql."""
    return mariadb.create_database("herald")


@pytest.fixture
def worker_db(mariadb: MariaDBServer) -> str:
    """Name of a fresh database built from phabricator_worker.sql."""
    return mariadb.create_database("worker")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """The session's Redis: ``.host``, ``.port``, ``.settings(db=0)``, ``.client()``."""
    server = _started(RedisServer)
    yield server
    server.stop()


@pytest.fixture
def redis_prefix(redis_server: RedisServer) -> str:
    """A key prefix unique to this test, for isolation on the shared Redis."""
    return redis_server.unique_prefix()
