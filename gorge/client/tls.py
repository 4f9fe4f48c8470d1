"""Client TLS towards another gorge daemon: the server's certificate checked
against a private CA (a PEM file of one or more CA certificates) or the
system's CAs, its name against the host, and optionally a client
certificate of our own for a listener that asks for one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twisted.internet import ssl

from gorge.app.pem import read_certificates, read_key_pair
from gorge.config import ConfigError

__all__ = ["ClientCertificate", "client_tls"]


@dataclass(frozen=True)
class ClientCertificate:
    """Our certificate and key (PEM files), with the settings that name them."""

    cert_setting: str
    cert: str
    key_setting: str
    key: str

    def load(self) -> ssl.PrivateCertificate:
        certificate = read_certificates(self.cert_setting, self.cert)[0]
        key = read_key_pair(self.key_setting, self.key)
        if key.keyHash() != certificate.getPublicKey().keyHash():
            raise ConfigError(
                self.key_setting,
                f"{self.key} is not the key of the certificate in {self.cert_setting}",
            )
        return ssl.PrivateCertificate.fromCertificateAndKeyPair(certificate, key)


def client_tls(
    host: str,
    *,
    ca_setting: str,
    ca: str = "",
    client_certificate: ClientCertificate | None = None,
) -> Any:
    """The TLS connection creator for ``host``: its certificate verified
    against the CAs in ``ca`` (empty: the system's), raising
    :class:`ConfigError` naming ``ca_setting`` (or the client certificate's
    settings) for a file that cannot be used."""
    options: dict[str, Any] = {}
    if ca:
        options["trustRoot"] = ssl.trustRootFromCertificates(read_certificates(ca_setting, ca))
    if client_certificate is not None:
        options["clientCertificate"] = client_certificate.load()
    return ssl.optionsForClientTLS(host, **options)
