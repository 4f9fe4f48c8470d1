"""GORGE_*_MYSQL_TLS: what each mode does against a MariaDB that offers TLS
and one that does not, and that a pool builds its TLS context once.

The TLS server is a second throwaway mariadbd with a self-signed
certificate for 127.0.0.1, made here; the plain one is the session's.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pymysql
import pytest
import pytest_twisted
from twisted.internet import reactor

from gorge.config import ConfigError, MySQLSettings
from gorge.db.mysql import make_pool
from gorge.taskqueue.settings import load_taskqueue_settings
from gorge.webhook.settings import load_webhook_settings
from gorge_testing.mariadb_server import MariaDBServer
from tests.support.certs import self_signed


def self_signed_files(directory: Path) -> tuple[Path, Path]:
    key_pem, cert_pem = self_signed()
    cert_path, key_path = directory / "server.pem", directory / "server.key"
    cert_path.write_bytes(cert_pem)
    key_path.write_bytes(key_pem)
    return cert_path, key_path


@pytest.fixture(scope="module")
def tls_mariadb(tmp_path_factory):
    cert, key = self_signed_files(tmp_path_factory.mktemp("mariadb-tls"))
    server = MariaDBServer(extra_options=(f"--ssl-cert={cert}", f"--ssl-key={key}"))
    server.start()
    server.ca_file = str(cert)
    yield server
    server.stop()


async def cipher(settings: MySQLSettings) -> str:
    pool = make_pool(settings, reactor)
    try:
        rows = await pool.runQuery("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
    finally:
        pool.close()
    return rows[0][1]


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize(
    ("mode", "encrypted"),
    [("preferred", True), ("required", True), ("verify", True), ("disabled", False)],
)
async def test_each_mode_against_a_server_that_offers_tls(tls_mariadb, mode, encrypted):
    settings = replace(
        tls_mariadb.settings(""),
        tls=mode,
        tls_ca=tls_mariadb.ca_file if mode == "verify" else "",
    )
    assert bool(await cipher(settings)) is encrypted


@pytest_twisted.ensureDeferred
async def test_verify_refuses_a_certificate_no_trusted_ca_signed(tls_mariadb):
    settings = replace(tls_mariadb.settings(""), tls="verify")  # the system's CAs only
    with pytest.raises(pymysql.err.OperationalError):
        await cipher(settings)


@pytest_twisted.ensureDeferred
async def test_against_a_server_without_tls_preferred_falls_back_and_required_refuses(mariadb):
    plain = mariadb.settings("")
    assert await cipher(replace(plain, tls="preferred")) == ""
    assert await cipher(replace(plain, tls="disabled")) == ""
    with pytest.raises(pymysql.err.OperationalError):
        await cipher(replace(plain, tls="required"))


def test_the_connections_of_one_pool_share_one_tls_context(tls_mariadb):
    # The system's CA store costs tens of milliseconds to load: one pool,
    # however many connections it opens, loads its context once.
    pool = make_pool(tls_mariadb.settings(""), reactor)
    connections = [pool.dbapi.connect(**pool.connkw) for _ in range(3)]
    try:
        assert len({id(connection.ctx) for connection in connections}) == 1
        for connection in connections:
            with connection.cursor() as cursor:
                cursor.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
                assert cursor.fetchone()[1]
    finally:
        for connection in connections:
            connection.close()
        pool.close()


@pytest.mark.parametrize(
    ("prefix", "load"),
    [
        ("GORGE_WEBHOOK_", load_webhook_settings),
        ("GORGE_TASKQUEUE_", load_taskqueue_settings),
    ],
)
def test_tls_settings_are_read_and_checked_at_start_up(tmp_path, prefix, load):
    assert load({}).mysql.tls == "preferred"
    assert load({f"{prefix}MYSQL_TLS": "disabled"}).mysql.tls == "disabled"
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    verify = load({f"{prefix}MYSQL_TLS": "verify", f"{prefix}MYSQL_TLS_CA": str(ca)})
    assert (verify.mysql.tls, verify.mysql.tls_ca) == ("verify", str(ca))
    refusals = [
        ({f"{prefix}MYSQL_TLS": "on"}, f"{prefix}MYSQL_TLS"),
        ({f"{prefix}MYSQL_TLS_CA": str(ca)}, f"{prefix}MYSQL_TLS_CA"),
        (
            {f"{prefix}MYSQL_TLS": "verify", f"{prefix}MYSQL_TLS_CA": str(tmp_path / "none")},
            f"{prefix}MYSQL_TLS_CA",
        ),
    ]
    for environ, setting in refusals:
        with pytest.raises(ConfigError) as refused:
            load(environ)
        assert refused.value.setting == setting
