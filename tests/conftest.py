"""Session-wide fixtures: throwaway MariaDB and Redis, started lazily.

A server starts the first time a test requests its fixture and stops at the
end of the session, so unit-test runs that need neither never pay for them.
Both listen on 127.0.0.1 only, on a free port, with their data in a
temporary directory.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from gorge_testing.mariadb_server import MariaDBServer
from gorge_testing.procs import ServerUnavailable
from gorge_testing.redis_server import RedisServer

# Property tests assert rules, not speed: a loaded CI machine must not turn a
# slow example into a failure (speed is measured under bench/).
settings.register_profile(
    "gorge", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("gorge")

# A test that waits forever would otherwise hold a CI run until it is killed
# from outside, with no word on which test it was.
_DEFAULT_TEST_TIME_LIMIT = 300.0
# Servers started in this session, so an aborted run still removes them.
_SERVERS = pytest.StashKey[list]()


def _test_time_limit() -> float:
    raw = os.environ.get("GORGE_TEST_TIMEOUT", "")
    try:
        return float(raw) if raw else _DEFAULT_TEST_TIME_LIMIT
    except ValueError:
        return _DEFAULT_TEST_TIME_LIMIT


def _abort_hung_test(config, nodeid: str, limit: float) -> None:
    try:
        _report_hung_test(config, nodeid, limit)
        for server in config.stash.get(_SERVERS, []):
            server.stop()
    finally:
        # The reactor may be parked in epoll forever; only leaving the
        # process ends the run, whatever went wrong while reporting.
        os._exit(3)


def _report_hung_test(config, nodeid: str, limit: float) -> None:
    # pytest captures fd 2 while a test runs; give the real stderr back
    # (with what the test printed so far) before reporting.
    captured = ("", "")
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        try:
            capman.suspend_global_capture(in_=True)
            captured = capman.read_global_capture()
        except Exception:  # noqa: BLE001 - reporting must go on regardless
            pass
    stream = sys.__stderr__
    for name, text in zip(("stdout", "stderr"), captured, strict=True):
        if text:
            stream.write(f"\n--- captured {name} of {nodeid} ---\n{text[-20000:]}\n")
    stream.write(
        f"\n\nTEST TIME LIMIT: {nodeid} still running after {limit:.0f}s "
        "(GORGE_TEST_TIMEOUT, 0 = off); aborting the run. Stacks:\n"
    )
    stream.flush()
    faulthandler.dump_traceback(file=stream, all_threads=True)
    stream.flush()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    limit = _test_time_limit()
    marker = item.get_closest_marker("time_limit")
    if marker is not None and limit > 0:
        limit = max(limit, float(marker.args[0]))
    timer = None
    if limit > 0:
        timer = threading.Timer(limit, _abort_hung_test, args=(item.config, item.nodeid, limit))
        timer.daemon = True
        timer.start()
    try:
        return (yield)
    finally:
        if timer is not None:
            timer.cancel()


def _started(server_class, config: pytest.Config):
    try:
        server = server_class()
        server.start()
    except ServerUnavailable as e:
        pytest.fail(str(e), pytrace=False)
    config.stash.setdefault(_SERVERS, []).append(server)
    return server


@pytest.fixture(scope="session")
def mariadb(pytestconfig: pytest.Config) -> Iterator[MariaDBServer]:
    """The session's MariaDB: ``.host``, ``.port``, ``.user``, ``.password``,
    ``.create_database(schema, name=None)``, ``.connect(db)``, ``.settings(db)``."""
    server = _started(MariaDBServer, pytestconfig)
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
def redis_server(pytestconfig: pytest.Config) -> Iterator[RedisServer]:
    """The session's Redis: ``.host``, ``.port``, ``.settings(db=0)``, ``.client()``."""
    server = _started(RedisServer, pytestconfig)
    yield server
    server.stop()


@pytest.fixture
def redis_prefix(redis_server: RedisServer) -> str:
    """A key prefix unique to this test, for isolation on the shared Redis."""
    return redis_server.unique_prefix()


@pytest.fixture
def scripted():
    """A scripted HTTP/1.1 server on 127.0.0.1 and its port (tests/support/scriptedhttp.py)."""
    from tests.support.scriptedhttp import ScriptedServer

    server = ScriptedServer()
    port = server.listen()
    yield server, port
    server.stop()
