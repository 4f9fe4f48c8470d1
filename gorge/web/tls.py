"""HTTPS on a daemon's listener: the certificate and key from
:class:`~gorge.config.ListenerTLS`'s files, loaded before the daemon starts
and again on SIGHUP, so a renewed certificate is served without a restart.

A file that cannot be used stops start-up with one line naming its setting
(:class:`~gorge.config.ConfigError`); on SIGHUP the same trouble is logged
(``HTTP_TLS_RELOAD_FAILED``) and the certificate already loaded is kept, so a
half-written renewal never takes the listener down. Connections made before a
reload keep the certificate they were made with."""

from __future__ import annotations

from typing import Any

from OpenSSL import SSL
from twisted.internet import ssl
from twisted.internet.interfaces import IOpenSSLServerConnectionCreator
from zope.interface import implementer

from gorge.app.pem import read_certificates, read_key_pair
from gorge.config import TLS_SETTINGS, ConfigError, ListenerTLS
from gorge.log.logger import Logger

__all__ = ["ServerTLS"]

log = Logger()

_CERT, _KEY, _CLIENT_CA = TLS_SETTINGS


def _options(settings: ListenerTLS) -> tuple[ssl.CertificateOptions, ssl.Certificate]:
    """The TLS options for ``settings``' files and the server certificate,
    or :class:`ConfigError` naming the file at fault."""
    chain = read_certificates(_CERT, settings.cert)
    key = read_key_pair(_KEY, settings.key).original
    trust: dict[str, Any] = {}
    if settings.client_ca:
        roots = read_certificates(_CLIENT_CA, settings.client_ca)
        # A client without a certificate from one of these is refused in the handshake.
        trust = {"trustRoot": ssl.trustRootFromCertificates(roots)}
    options = ssl.CertificateOptions(
        privateKey=key,
        certificate=chain[0].original,
        extraCertChain=[c.original for c in chain[1:]],
        **trust,
    )
    try:
        options.getContext()  # made now: a key that does not match fails here
    except SSL.Error:
        raise ConfigError(
            _KEY, f"{settings.key} is not the key of the certificate in {_CERT} ({settings.cert})"
        ) from None
    return options, chain[0]


@implementer(IOpenSSLServerConnectionCreator)
class ServerTLS:
    """The server side of each TLS connection, from the files last loaded
    without trouble. Builds fail with :class:`ConfigError` (start-up);
    :meth:`reload` logs instead."""

    def __init__(self, settings: ListenerTLS) -> None:
        self._settings = settings
        self._options, self.certificate = _options(settings)

    def serverConnectionForTLS(self, tlsProtocol: Any) -> SSL.Connection:
        return SSL.Connection(self._options.getContext(), None)

    def describe(self) -> dict[str, object]:
        """For the log lines: whom the certificate names and until when."""
        cert = self.certificate.original.to_cryptography()
        return {
            "subject": cert.subject.rfc4514_string(),
            "not_after": cert.not_valid_after_utc.isoformat(),
            "client_ca": bool(self._settings.client_ca),
        }

    def reload(self) -> None:
        """Read the files again (SIGHUP); keep the loaded ones on trouble."""
        try:
            self._options, self.certificate = _options(self._settings)
        except ConfigError as e:
            log.error(
                "HTTP_TLS_RELOAD_FAILED setting={setting} reason={reason}",
                setting=e.setting,
                reason=e.reason,
            )
            return
        fields = self.describe()
        log.info(
            "HTTP_TLS_RELOADED subject={subject} not_after={not_after} client_ca={client_ca}",
            **fields,
        )
