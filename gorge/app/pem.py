"""PEM files a daemon reads for TLS (certificates, CA bundles, private
keys), each refusal a :class:`~gorge.config.ConfigError` naming the setting
that points at the file."""

from __future__ import annotations

from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from OpenSSL import crypto
from twisted.internet import ssl

from gorge.config import ConfigError

__all__ = ["read_certificates", "read_key_pair"]

_BEGIN = b"-----BEGIN CERTIFICATE-----"
_END = b"-----END CERTIFICATE-----"


def _read(setting: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(setting, f"cannot read {path}: {e.strerror or e}") from None


def read_certificates(setting: str, path: str) -> list[ssl.Certificate]:
    """Every certificate in ``path``, in order; at least one."""
    blocks = [block + _END for block in _read(setting, path).split(_END) if _BEGIN in block]
    if not blocks:
        raise ConfigError(setting, f"no PEM certificate in {path}")
    try:
        return [ssl.Certificate.loadPEM(block) for block in blocks]
    except (crypto.Error, ValueError):
        raise ConfigError(setting, f"a PEM certificate in {path} cannot be read") from None


def read_key_pair(setting: str, path: str) -> ssl.KeyPair:
    """The unencrypted private key in ``path``.

    Read by cryptography, not by OpenSSL: OpenSSL's reader would ask a
    terminal for the passphrase of an encrypted key."""
    try:
        loaded: Any = serialization.load_pem_private_key(_read(setting, path), password=None)
        # TypeError also for a kind of key TLS cannot use.
        return ssl.KeyPair(crypto.PKey.from_cryptography_key(loaded))
    except (TypeError, ValueError, UnsupportedAlgorithm):
        raise ConfigError(setting, f"no unencrypted PEM private key in {path}") from None
