"""HTTPS deliveries: the connection goes to the checked address,
while Host, SNI and the certificate check use the hook's host name."""

from __future__ import annotations

import datetime
import json

import pytest
import pytest_twisted
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet import reactor, ssl

from gorge.webhook.transport import Transport
from gorge.webhook.uripolicy import UriPolicy
from tests.webhook.conftest import Receiver

pytestmark = [
    pytest.mark.integration,
    # Twisted's TLS server options still hand pyOpenSSL objects to pyOpenSSL.
    pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning"),
]


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _certificate(subject: str, issuer: str, key, signing_key, *, ca: bool, san: str | None):
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(san)]), critical=False
        )
    return builder.sign(signing_key, hashes.SHA256())


def _pem(obj) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@pytest.fixture(scope="module")
def ca():
    key = ec.generate_private_key(ec.SECP256R1())
    return key, _certificate("gorge test CA", "gorge test CA", key, key, ca=True, san=None)


def tls_options(ca, name: str):
    """A server certificate for ``name`` signed by the test CA."""
    ca_key, _ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _certificate(name, "gorge test CA", key, ca_key, ca=False, san=name)
    return ssl.PrivateCertificate.loadPEM(_pem(key) + _pem(cert)).options()


@pytest.fixture
def tls_receiver(ca):
    made = []

    def make(name: str) -> Receiver:
        receiver = Receiver(tls_options(ca, name))
        made.append(receiver)
        return receiver

    yield make
    for receiver in made:
        pytest_twisted.blockon(receiver.port.stopListening())


def _transport(trusted_ca):
    async def resolve(host, port):
        return ["127.0.0.1"] if host == "hook.example" else []

    policy = UriPolicy((), resolve, reactor, 5)
    trust = ssl.Certificate.loadPEM(_pem(trusted_ca[1])) if trusted_ca is not None else None
    return resolve, Transport(reactor, policy, 5, trust_root=trust)


@pytest.mark.parametrize(
    "served_name,trusted,code",
    [
        ("hook.example", True, 200),
        ("other.example", True, 60),  # certificate for another name
        ("hook.example", False, 60),  # certificate from an unknown CA
    ],
)
async def test_https_delivery(herald, make_harness, tls_receiver, ca, served_name, trusted, code):
    receiver = tls_receiver(served_name)
    resolve, transport = _transport(ca if trusted else None)
    harness = make_harness(resolver=resolve, http_client=transport)
    port = receiver.port.getHost().port
    hook = herald.insert_hook(uri=f"https://hook.example:{port}/tls")
    request_id = herald.insert_request(hook=hook, properties={"retry": "never"})
    await harness.run_tick()
    row = herald.request(request_id)
    assert json.loads(row["properties"])["errorCode"] == code
    if code == 200:
        (got,) = receiver.requests
        assert got.headers["host"] == [f"hook.example:{port}"]
        assert row["status"] == "sent"
    else:
        assert receiver.requests == [] and row["status"] == "failed"
