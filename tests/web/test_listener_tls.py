"""HTTPS on the shared listener: the files checked before start-up (one line
naming the setting), served on real sockets, read again on SIGHUP (a renewed
certificate served to new connections, a broken renewal refused with the
loaded one kept), client certificates asked for with GORGE_TLS_CLIENT_CA."""

from __future__ import annotations

import os
import signal
import socket
import ssl as stdlib_ssl

import pytest
import pytest_twisted
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from prometheus_client import CollectorRegistry
from twisted.internet import reactor
from twisted.internet.threads import deferToThread

from gorge.config import ConfigError, Env, ListenerTLS, load_listener_tls
from gorge.taskqueue.service import Options, makeService
from gorge.web.listener import listener
from gorge.web.site import build_site
from gorge.web.tls import ServerTLS
from tests.support.certs import PrivateCA
from tests.support.logcapture import first_event
from tests.web.test_site import ExampleApi, Readiness


@pytest.fixture
def ca():
    return PrivateCA()


@pytest.fixture
def files(tmp_path, ca):
    cert, key = ca.issue(tmp_path / "server.pem", tmp_path / "server-key.pem")
    return {"cert": cert, "key": key, "ca": ca.write(tmp_path / "ca.pem"), "tmp": tmp_path}


@pytest.fixture
def hangup_restored():
    original = signal.getsignal(signal.SIGHUP)
    yield
    signal.signal(signal.SIGHUP, original)


def tls_env(**values):
    return Env({f"GORGE_TLS_{k.upper()}": v for k, v in values.items()})


# ---------------------------------------------------------------- settings


def test_no_certificate_means_plain_http():
    assert load_listener_tls(Env({})) is None


@pytest.mark.parametrize(
    ("given", "setting"),
    [
        (("cert",), "GORGE_TLS_KEY"),
        (("key",), "GORGE_TLS_CERT"),
        (("client_ca",), "GORGE_TLS_CLIENT_CA"),
    ],
)
def test_half_a_configuration_names_the_missing_setting(files, given, setting):
    paths = {"cert": files["cert"], "key": files["key"], "client_ca": files["ca"]}
    with pytest.raises(ConfigError) as refused:
        load_listener_tls(tls_env(**{name: paths[name] for name in given}))
    assert refused.value.setting == setting


@pytest.mark.parametrize("which", ["cert", "key", "client_ca"])
def test_an_unreadable_file_names_its_setting(files, which):
    paths = {"cert": files["cert"], "key": files["key"], which: str(files["tmp"] / "missing.pem")}
    with pytest.raises(ConfigError) as refused:
        load_listener_tls(tls_env(**paths))
    assert refused.value.setting == f"GORGE_TLS_{which.upper()}"
    assert "missing.pem" in refused.value.reason


def _encrypted(key_path: str) -> bytes:
    with open(key_path, "rb") as f:
        key = serialization.load_pem_private_key(f.read(), password=None)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )


@pytest.mark.parametrize(
    ("broken", "setting", "words"),
    [
        ("cert", "GORGE_TLS_CERT", "no PEM certificate"),
        ("key", "GORGE_TLS_KEY", "no unencrypted PEM private key"),
        ("encrypted key", "GORGE_TLS_KEY", "no unencrypted PEM private key"),
        ("other key", "GORGE_TLS_KEY", "is not the key of the certificate"),
        ("client_ca", "GORGE_TLS_CLIENT_CA", "no PEM certificate"),
    ],
)
def test_files_that_cannot_serve_are_refused_naming_the_setting(files, ca, broken, setting, words):
    tmp = files["tmp"]
    tls = ListenerTLS(cert=files["cert"], key=files["key"], client_ca=files["ca"])
    bad = tmp / "bad.pem"
    if broken == "encrypted key":
        bad.write_bytes(_encrypted(files["key"]))
    elif broken == "other key":
        ca.issue(tmp / "other.pem", bad)
    else:
        bad.write_bytes(b"-----BEGIN NOTHING-----\nAAAA\n-----END NOTHING-----\n")
    field = {"cert": "cert", "client_ca": "client_ca"}.get(broken, "key")
    with pytest.raises(ConfigError) as refused:
        ServerTLS(ListenerTLS(**{**tls.__dict__, field: str(bad)}))
    assert refused.value.setting == setting
    assert words in refused.value.reason


def test_a_key_that_does_not_match_stops_start_up_with_one_line(files, ca, monkeypatch, capsys):
    _, other_key = ca.issue(files["tmp"] / "other.pem", files["tmp"] / "other-key.pem")
    monkeypatch.setenv("GORGE_TASKQUEUE_BACKEND", "sqlite")
    monkeypatch.setenv("GORGE_TASKQUEUE_SQLITE_PATH", str(files["tmp"] / "q.sqlite3"))
    monkeypatch.setenv("GORGE_TLS_CERT", files["cert"])
    monkeypatch.setenv("GORGE_TLS_KEY", other_key)
    options = Options()
    options.parseOptions(["--listen", "127.0.0.1:0"])
    with pytest.raises(SystemExit) as info:
        makeService(options)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("gorge-taskqueue: GORGE_TLS_KEY: ") and other_key in err


# ---------------------------------------------------------------- serving


def started(tls: ListenerTLS):
    site = build_site(
        api_resource=ExampleApi().app.resource(),
        prefix="/api/example/",
        token="",
        body_limit=1024 * 1024,
        readiness=Readiness(),
        registry=CollectorRegistry(),
        clock=reactor,
    )
    service = listener("tcp:0:interface=127.0.0.1", site, clock=reactor, tls=tls)
    service.startService()
    return service, service.listening_port.getHost().port


def fetch(port: int, ca_path: str, client: tuple[str, str] | None = None):
    """In a thread (the server runs on this reactor): a GET /healthz over TLS
    verified against ``ca_path``; the server certificate's serial and the answer."""
    context = stdlib_ssl.create_default_context(cafile=ca_path)
    if client is not None:
        context.load_cert_chain(*client)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
            tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := tls.recv(65536):
                answer += chunk
    return x509.load_der_x509_certificate(der).serial_number, answer


def refused(port: int, ca_path: str, client: tuple[str, str] | None) -> bool:
    """Whether the server turned the client away: under TLS 1.3 the refusal of
    a client certificate comes after the client's side of the handshake, as
    an alert or the end of the connection instead of an answer."""
    try:
        _, answer = fetch(port, ca_path, client)
    except (stdlib_ssl.SSLError, ConnectionError):
        return True
    return answer == b""


def serial_of(path: str) -> int:
    with open(path, "rb") as f:
        return x509.load_pem_x509_certificate(f.read()).serial_number


@pytest_twisted.ensureDeferred
async def test_sighup_serves_a_renewed_certificate_and_keeps_it_through_a_broken_one(
    files, ca, hangup_restored
):
    before = signal.getsignal(signal.SIGHUP)
    service, port = started(ListenerTLS(cert=files["cert"], key=files["key"]))
    try:
        first, answer = await deferToThread(fetch, port, files["ca"])
        assert first == serial_of(files["cert"])
        assert answer.startswith(b"HTTP/1.1 200 ")

        # Renewed in place, as certbot or a site's CA tooling does.
        ca.issue(files["cert"], files["key"])
        with first_event("HTTP_TLS_RELOADED") as reloaded:
            os.kill(os.getpid(), signal.SIGHUP)
            await reloaded.addTimeout(10, reactor)
        renewed, answer = await deferToThread(fetch, port, files["ca"])
        assert renewed == serial_of(files["cert"]) != first
        assert answer.startswith(b"HTTP/1.1 200 ")

        # Half a renewal: a new certificate, the old key.
        kept_key = open(files["key"], "rb").read()
        ca.issue(files["cert"], files["key"])
        with open(files["key"], "wb") as f:
            f.write(kept_key)
        with first_event("HTTP_TLS_RELOAD_FAILED") as failed:
            os.kill(os.getpid(), signal.SIGHUP)
            event = await failed.addTimeout(10, reactor)
        assert event["setting"] == "GORGE_TLS_KEY"
        still, answer = await deferToThread(fetch, port, files["ca"])
        assert still == renewed
        assert answer.startswith(b"HTTP/1.1 200 ")
    finally:
        await service.stopService()
    assert signal.getsignal(signal.SIGHUP) == before  # the listener's handler is off again


@pytest_twisted.ensureDeferred
async def test_a_client_ca_admits_its_clients_and_refuses_the_others(files, ca):
    tmp = files["tmp"]
    tls = ListenerTLS(cert=files["cert"], key=files["key"], client_ca=files["ca"])
    service, port = started(tls)
    ours = ca.issue(tmp / "c.pem", tmp / "c-key.pem", common_name="worker-1", client=True)
    stranger = PrivateCA("a stranger's CA").issue(
        tmp / "s.pem", tmp / "s-key.pem", common_name="worker-2", client=True
    )
    try:
        _, answer = await deferToThread(fetch, port, files["ca"], ours)
        assert answer.startswith(b"HTTP/1.1 200 ")
        for client in (None, stranger):
            assert await deferToThread(refused, port, files["ca"], client)
    finally:
        await service.stopService()
