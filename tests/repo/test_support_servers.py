"""The throwaway servers behind the integration fixtures work as promised."""

from __future__ import annotations

import socket
import subprocess

import pymysql
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gorge_testing.phorge_schema import create_statements
from gorge_testing.procs import ServerUnavailable, find_binary
from gorge_testing.resp import RedisReplyError, encode_command
from tests.support.paths import FIXTURES_DIR, REPO_ROOT


def _tables(conn: pymysql.connections.Connection) -> set[str]:
    with conn.cursor() as cur:
        cur.execute("SHOW TABLES")
        return {row[0] for row in cur.fetchall()}


def _listening_addresses(pid: int) -> set[str] | None:
    """Local TCP addresses a process listens on, from ``ss``; None without ``ss``."""
    try:
        out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return {line.split()[3] for line in out.splitlines() if f"pid={pid}," in line}


def _assert_loopback_only(pid: int, port: int) -> None:
    listening = _listening_addresses(pid)
    if listening is not None:
        assert listening == {f"127.0.0.1:{port}"}
    other = _other_interface_address()
    if other is not None:
        with pytest.raises(OSError):
            socket.create_connection((other, port), timeout=2).close()


def _other_interface_address() -> str | None:
    """An IPv4 address of this machine that is not loopback, if there is one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for UDP connect
        except OSError:
            return None
        address = sock.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


# -- paths and schema -------------------------------------------------------


def test_fixtures_live_in_the_repository():
    assert FIXTURES_DIR == REPO_ROOT / "tests" / "fixtures"
    for capture in ("webhook", "feed", "taskqueue"):
        assert (FIXTURES_DIR / capture / "README.md").is_file()


def test_unknown_schema_is_refused():
    with pytest.raises(ValueError, match="unknown schema"):
        create_statements("maniphest", "t_x_1")


@given(
    st.sampled_from(["herald", "worker"]),
    st.from_regex(r"t_[a-z]{1,8}_[0-9]{1,6}", fullmatch=True),
)
def test_schema_statements_create_and_fill_only_the_named_database(schema, name):
    statements = create_statements(schema, name)
    assert statements[0].startswith(f"CREATE DATABASE IF NOT EXISTS `{name}` ")
    assert statements[1] == f"USE `{name}`"
    assert all(s.startswith("CREATE TABLE IF NOT EXISTS `") for s in statements[2:])
    assert not any("phabricator_" in s for s in statements)


def test_a_missing_server_binary_says_how_to_get_it():
    with pytest.raises(ServerUnavailable, match=r"scripts/test\.sh"):
        find_binary("no-such-mariadbd-binary")


def test_server_binaries_are_found_in_sbin_without_it_on_path(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    try:
        found = find_binary("mariadbd")
    except ServerUnavailable:
        pytest.skip("mariadbd is not installed in an sbin directory here")
    assert found.endswith("/mariadbd") and "sbin" in found


def test_resp_encoding_is_length_prefixed():
    assert (
        encode_command(("SET", "k", b"a\r\nb")) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\na\r\nb\r\n"
    )


# -- MariaDB -------------------------------------------------------------------


@pytest.mark.integration
def test_fresh_herald_database_has_the_phorge_tables(mariadb, herald_db):
    with mariadb.connect(herald_db) as conn:
        assert _tables(conn) == {
            "herald_webhook",
            "herald_webhookrequest",
            "herald_webhooktransaction",
        }
        with conn.cursor() as cur:
            cur.execute(
                "SELECT DEFAULT_CHARACTER_SET_NAME, DEFAULT_COLLATION_NAME"
                " FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s",
                (herald_db,),
            )
            assert cur.fetchone() == ("utf8mb4", "utf8mb4_bin")


@pytest.mark.integration
def test_webhook_requests_have_only_the_keys_stock_phorge_creates(mariadb, herald_db):
    with mariadb.connect(herald_db) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT INDEX_NAME, GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX)"
            " FROM information_schema.STATISTICS"
            " WHERE TABLE_SCHEMA = %s AND TABLE_NAME = 'herald_webhookrequest'"
            " GROUP BY INDEX_NAME",
            (herald_db,),
        )
        keys = dict(cur.fetchall())
    assert keys == {
        "PRIMARY": "id",
        "key_phid": "phid",
        "key_ratelimit": "webhookPHID,lastRequestResult,lastRequestEpoch",
        "key_collect": "dateCreated",
    }


@pytest.mark.integration
def test_fresh_worker_database_has_the_task_tables_and_counter(mariadb, worker_db):
    with mariadb.connect(worker_db) as conn:
        tables = _tables(conn)
    assert {
        "worker_activetask",
        "worker_archivetask",
        "worker_taskdata",
        "lisk_counter",
    } <= tables


@pytest.mark.integration
def test_two_fresh_databases_are_independent(mariadb):
    first = mariadb.create_database("herald")
    second = mariadb.create_database("herald")
    assert first != second
    with mariadb.connect(first) as conn, conn.cursor() as cur:
        cur.execute(
            "INSERT INTO herald_webhook (phid, name, webhookURI, viewPolicy, editPolicy, status,"
            " hmacKey, dateCreated, dateModified) VALUES"
            " ('PHID-HWBH-1', 'a', 'http://127.0.0.1/', 'users', 'users', 'enabled', 'k', 1, 1)"
        )
    with mariadb.connect(second) as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM herald_webhook")
        assert cur.fetchone() == (0,)
    with mariadb.connect(first) as conn, conn.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM herald_webhook")
        assert cur.fetchone() == (1,)


@pytest.mark.integration
def test_create_database_accepts_an_explicit_name(mariadb):
    name = mariadb.create_database("worker", name="phabricator_worker")
    assert name == "phabricator_worker"
    with mariadb.connect(name) as conn:
        assert "worker_activetask" in _tables(conn)


@pytest.mark.integration
def test_settings_carry_the_credentials_that_work(mariadb, worker_db):
    from gorge.config import MySQLSettings

    settings = mariadb.settings(worker_db)
    assert isinstance(settings, MySQLSettings)
    assert (settings.host, settings.port, settings.database) == (
        "127.0.0.1",
        mariadb.port,
        worker_db,
    )
    conn = pymysql.connect(
        host=settings.host,
        port=settings.port,
        user=settings.user,
        password=settings.password,
        database=settings.database,
    )
    conn.close()
    with pytest.raises(pymysql.err.OperationalError):
        pymysql.connect(
            host=settings.host,
            port=settings.port,
            user=settings.user,
            password="wrong",
            connect_timeout=5,
        )


@pytest.mark.integration
def test_mariadb_listens_on_loopback_only(mariadb):
    with mariadb.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT @@bind_address, @@port, @@skip_networking, @@log_bin")
        bind_address, port, skip_networking, log_bin = cur.fetchone()
    assert (bind_address, port, skip_networking, log_bin) == (
        "127.0.0.1",
        mariadb.port,
        0,
        0,
    )
    _assert_loopback_only(mariadb.pid, mariadb.port)


# -- Redis -----------------------------------------------------------------------


@pytest.mark.integration
def test_redis_answers_ping_and_keeps_prefixed_keys_apart(redis_server, redis_prefix):
    other_prefix = redis_server.unique_prefix()
    assert other_prefix != redis_prefix
    with redis_server.client() as client:
        assert client.execute("PING") == "PONG"
        client.execute("SET", f"{redis_prefix}k", "mine")
        assert client.execute("GET", f"{redis_prefix}k") == b"mine"
        assert client.execute("GET", f"{other_prefix}k") is None
        with pytest.raises(RedisReplyError):
            client.execute("NO-SUCH-COMMAND")


@pytest.mark.integration
def test_redis_is_loopback_only_and_persists_nothing(redis_server):
    with redis_server.client() as client:
        _, bind = client.execute("CONFIG", "GET", "bind")
        _, save = client.execute("CONFIG", "GET", "save")
        _, appendonly = client.execute("CONFIG", "GET", "appendonly")
    assert (bind, save, appendonly) == (b"127.0.0.1", b"", b"no")
    _assert_loopback_only(redis_server.pid, redis_server.port)


@pytest.mark.integration
def test_redis_settings_point_at_the_server(redis_server):
    from gorge.db.redis import RedisSettings

    settings = redis_server.settings(db=3)
    assert isinstance(settings, RedisSettings)
    assert (settings.host, settings.port, settings.db) == (
        "127.0.0.1",
        redis_server.port,
        3,
    )
