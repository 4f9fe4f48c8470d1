"""Self-signed certificates for tests that need a TLS server on loopback."""

from __future__ import annotations

import datetime
import ipaddress

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

from gorge.client.tls import client_tls


def self_signed(
    names: tuple[str, ...] = (), ips: tuple[str, ...] = ("127.0.0.1",)
) -> tuple[bytes, bytes]:
    """(key PEM, certificate PEM): a CA certificate for ``names`` (DNS SANs) and
    ``ips`` (IP SANs), named after the first of them, valid from a day ago
    for two days."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, (names or ips)[0])])
    now = datetime.datetime.now(datetime.UTC)
    san = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class PrivateCA:
    """A CA made for one test, which issues server and client certificates
    into files (PEM), as a site's private CA would."""

    def __init__(self, name: str = "gorge test CA") -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.name = subject
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def write(self, path) -> str:
        """The CA certificate into ``path`` (a CA bundle of one)."""
        with open(path, "wb") as f:
            f.write(self.pem)
        return str(path)

    def issue(
        self,
        cert_path,
        key_path,
        *,
        common_name: str = "127.0.0.1",
        ips: tuple[str, ...] = ("127.0.0.1",),
        names: tuple[str, ...] = (),
        client: bool = False,
        days: int = 2,
    ) -> tuple[str, str]:
        """A certificate signed by this CA (a server's, or a client's with
        ``client``) and its key, written to the two paths; returns them."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        san = [x509.DNSName(n) for n in names] + [
            x509.IPAddress(ipaddress.ip_address(i)) for i in ips
        ]
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        usage = (
            x509.ExtendedKeyUsageOID.CLIENT_AUTH if client else x509.ExtendedKeyUsageOID.SERVER_AUTH
        )
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        with open(cert_path, "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        with open(key_path, "wb") as f:
            f.write(_key_pem(key))
        return str(cert_path), str(key_path)


@implementer(IPolicyForHTTPS)
class TrustOnly:
    """A treq/Agent TLS policy for a test's own calls to a daemon whose
    certificate a test CA signed: that CA only (a PEM file)."""

    def __init__(self, ca_path: str) -> None:
        self._ca = str(ca_path)

    def creatorForNetloc(self, hostname: bytes, port: int):
        return client_tls(hostname.decode(), ca_setting="the test's CA", ca=self._ca)
