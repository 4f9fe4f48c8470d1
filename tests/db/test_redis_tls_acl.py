"""gorge.db.redis against real redis-servers: an ACL user with its password, and
TLS checked against a private CA made in the test (a wrong CA refused)."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet import reactor

from gorge.db.redis import RedisSettings, make_redis, ping
from gorge_testing.procs import free_port
from gorge_testing.redis_server import RedisServer

pytestmark = pytest.mark.integration


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_ca(
    directory: Path, label: str
) -> tuple[Path, ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(label))
        .issuer_name(_name(label))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = directory / f"{label}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path, key, cert


def make_server_cert(directory: Path, ca_key, ca_cert) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by the CA: (cert, key) PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = directory / "server.pem", directory / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class TLSRedisServer(RedisServer):
    """The throwaway server with a TLS port beside its plain one (the plain
    one tells the harness when it is up)."""

    def __init__(self, cert: Path, key: Path, ca: Path) -> None:
        super().__init__()
        self.tls_port = free_port(self.host)
        self._tls_files = (cert, key, ca)

    def _argv(self, log_path: Path) -> list[str]:
        cert, key, ca = self._tls_files
        return [
            *super()._argv(log_path),
            "--tls-port",
            str(self.tls_port),
            "--tls-cert-file",
            str(cert),
            "--tls-key-file",
            str(key),
            "--tls-ca-cert-file",
            str(ca),
            "--tls-auth-clients",
            "no",
        ]


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory) -> Iterator[tuple[TLSRedisServer, Path, Path]]:
    directory = tmp_path_factory.mktemp("redis-tls")
    ca_path, ca_key, ca_cert = make_ca(directory, "gorge-test-ca")
    wrong_ca, _, _ = make_ca(directory, "someone-elses-ca")
    cert, key = make_server_cert(directory, ca_key, ca_cert)
    server = TLSRedisServer(cert, key, ca_path)
    server.start()
    try:
        yield server, ca_path, wrong_ca
    finally:
        server.stop()


async def _ping(settings: RedisSettings) -> str | None:
    conn = make_redis(settings, reactor)
    try:
        return await ping(conn, reactor, 10)
    finally:
        await conn.disconnect()


@pytest_twisted.ensureDeferred
async def test_tls_with_private_ca_and_wrong_ca_refused(tls_redis):
    server, ca, wrong_ca = tls_redis
    good = RedisSettings(host=server.host, port=server.tls_port, tls="verify", tls_ca=str(ca))
    conn = make_redis(good, reactor)
    try:
        assert await ping(conn, reactor, 10) is None
        await conn.set("gorge:tls", "over tls")
        assert await conn.get("gorge:tls") == "over tls"
    finally:
        await conn.disconnect()
    wrong = RedisSettings(
        host=server.host, port=server.tls_port, tls="verify", tls_ca=str(wrong_ca)
    )
    assert await _ping(wrong) is not None
    # Plain TCP to the TLS port gets no answer either.
    assert (
        await _ping(RedisSettings(host=server.host, port=server.tls_port, reply_timeout=3))
        is not None
    )


@pytest_twisted.ensureDeferred
async def test_acl_user_and_password(redis_server):
    with redis_server.client() as admin:
        admin.execute("ACL", "SETUSER", "gorge_acl", "on", ">acl-secret", "~*", "&*", "+@all")
    try:
        user = RedisSettings(
            host=redis_server.host,
            port=redis_server.port,
            username="gorge_acl",
            password="acl-secret",
        )
        conn = make_redis(user, reactor)
        try:
            assert await ping(conn, reactor, 10) is None
            assert await conn.execute_command("ACL", "WHOAMI") == "gorge_acl"
        finally:
            await conn.disconnect()
        wrong = RedisSettings(
            host=redis_server.host, port=redis_server.port, username="gorge_acl", password="nope"
        )
        # The lazy pool never gets a connection: the ping is unanswered.
        assert await _ping(wrong) is not None
    finally:
        with redis_server.client() as admin:
            admin.execute("ACL", "DELUSER", "gorge_acl")


def test_taskqueue_settings_for_acl_tls_and_sentinel(tmp_path):
    from gorge.config import ConfigError
    from gorge.taskqueue.settings import load_taskqueue_settings

    ca = tmp_path / "ca.pem"
    ca.write_text("pem")
    base = {"GORGE_TASKQUEUE_BACKEND": "redis"}
    redis = load_taskqueue_settings(
        base
        | {
            "GORGE_TASKQUEUE_REDIS_USERNAME": "queue",
            "GORGE_TASKQUEUE_REDIS_TLS": "verify",
            "GORGE_TASKQUEUE_REDIS_TLS_CA": str(ca),
        }
    ).redis
    assert (redis.username, redis.tls, redis.tls_ca) == ("queue", "verify", str(ca))
    sentinel = load_taskqueue_settings(
        base
        | {
            "GORGE_TASKQUEUE_REDIS_SENTINELS": "127.0.0.1:26379, [::1]:26380",
            "GORGE_TASKQUEUE_REDIS_SENTINEL_SERVICE": "queue",
        }
    ).redis
    assert sentinel.sentinels == (("127.0.0.1", 26379), ("::1", 26380))
    assert sentinel.sentinel_service == "queue"
    refused = {
        "GORGE_TASKQUEUE_REDIS_SENTINELS": {"GORGE_TASKQUEUE_REDIS_SENTINELS": "nowhere"},
        "GORGE_TASKQUEUE_REDIS_TLS_CA": {"GORGE_TASKQUEUE_REDIS_TLS_CA": str(ca)},
        "GORGE_TASKQUEUE_REDIS_TLS": {"GORGE_TASKQUEUE_REDIS_TLS": "maybe"},
    }
    for setting, env in refused.items():
        with pytest.raises(ConfigError) as error:
            load_taskqueue_settings(base | env)
        assert setting in str(error.value)
    with pytest.raises(ConfigError, match="no such file"):
        load_taskqueue_settings(
            base
            | {
                "GORGE_TASKQUEUE_REDIS_TLS": "verify",
                "GORGE_TASKQUEUE_REDIS_TLS_CA": str(tmp_path / "missing.pem"),
            }
        )
