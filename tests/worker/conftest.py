from __future__ import annotations

import pytest
import pytest_twisted
from twisted.web.client import Agent, HTTPConnectionPool

from tests.worker.rawhttp import RawServer


@pytest.fixture
def reactor():
    from twisted.internet import reactor as global_reactor

    return global_reactor


@pytest.fixture
def http_client(reactor):
    pool = HTTPConnectionPool(reactor, persistent=False)
    yield Agent(reactor, pool=pool, connectTimeout=5)
    pytest_twisted.blockon(pool.closeCachedConnections())


@pytest.fixture
def raw_server(reactor):
    servers: list[RawServer] = []

    def start(answer=None) -> tuple[RawServer, str]:
        server = RawServer(answer) if answer is not None else RawServer()
        url = server.listen(reactor)
        servers.append(server)
        return server, url

    yield start
    for server in servers:
        pytest_twisted.blockon(server.stop())
