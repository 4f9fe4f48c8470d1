"""Environment and twistd options -> frozen settings, validated once at start-up.

Nothing else in gorge reads ``os.environ``: each service's ``makeService``
hands the environment to an :class:`Env` and builds its settings from it. The
first bad value raises :class:`ConfigError`, which ``gorge.app.twistd`` turns
into one line on stderr and exit status 2.
"""

from __future__ import annotations

import builtins
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from twisted.logger import LogLevel

__all__ = [
    "ConfigError",
    "Env",
    "HttpSettings",
    "JsonFields",
    "ListenerTLS",
    "MYSQL_TLS_MODES",
    "MySQLSettings",
    "TypedReader",
    "load_http_settings",
    "load_listener_tls",
    "load_mysql_tls",
    "parse_bool",
    "parse_int",
    "parse_listen_addr",
    "parse_size",
]


class ConfigError(Exception):
    """A setting that stops the daemon at start-up."""

    def __init__(self, setting: str, reason: str) -> None:
        super().__init__(f"{setting}: {reason}")
        self.setting = setting
        self.reason = reason


_TRUE = frozenset({"1", "true", "yes", "on", "y", "t"})
_FALSE = frozenset({"0", "false", "no", "off", "n", "f"})


def parse_int(text: str) -> int:
    """Decimal integer with optional sign; nothing else (no floats, no hex)."""
    stripped = text.strip()
    if not re.fullmatch(r"[+-]?[0-9]+", stripped):
        raise ValueError(f"not an integer: {text!r}")
    return int(stripped)


def parse_float(text: str) -> float:
    stripped = text.strip()
    if not re.fullmatch(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)", stripped):
        raise ValueError(f"not a number: {text!r}")
    return float(stripped)


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"not a boolean (use true/false, 1/0, yes/no, on/off): {text!r}")


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kb": 1024,
    "m": 1024**2,
    "mb": 1024**2,
    "g": 1024**3,
    "gb": 1024**3,
}


def parse_size(text: str) -> int:
    """``10M``, ``512kb``, ``2048``: binary multiples, case-insensitive."""
    match = re.fullmatch(r"\s*([0-9]+)\s*([a-zA-Z]*)\s*", text)
    if match is None or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"not a size (use a number with optional B, K, M or G): {text!r}")
    return int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]


def parse_listen_addr(addr: str) -> str:
    """Go ``host:port`` -> a twisted strports description.

    ``:8160`` listens on every interface, ``127.0.0.1:8160`` on one,
    ``[::]:8160`` on IPv6. Colons inside the interface are escaped because
    strports splits on them.
    """
    text = addr.strip()
    match = re.fullmatch(r"(?:\[([0-9A-Fa-f:.]+)\]|([^:\[\]]*)):([0-9]+)", text)
    if match is None:
        raise ValueError(f"not a host:port listen address: {addr!r}")
    port = int(match.group(3))
    if not 0 <= port <= 65535:
        raise ValueError(f"port out of range: {addr!r}")
    if match.group(1) is not None:
        interface = match.group(1).replace(":", "\\:")
        return f"tcp6:{port}:interface={interface}"
    host = match.group(2)
    if host in ("", "0.0.0.0"):
        return f"tcp:{port}" if host == "" else f"tcp:{port}:interface=0.0.0.0"
    if host == "localhost":
        host = "127.0.0.1"
    if not re.fullmatch(r"[0-9A-Za-z.\-]+", host):
        raise ValueError(f"not a host:port listen address: {addr!r}")
    return f"tcp:{port}:interface={host}"


_LOG_LEVELS = {
    "debug": LogLevel.debug,
    "info": LogLevel.info,
    "warn": LogLevel.warn,
    "warning": LogLevel.warn,
    "error": LogLevel.error,
    "critical": LogLevel.critical,
}


def parse_level(text: str) -> LogLevel:
    try:
        return _LOG_LEVELS[text.strip().lower()]
    except KeyError:
        raise ValueError(
            f"unknown log level {text!r} (accepted: debug, info, warn, error)"
        ) from None


#: One setting name, or a canonical name and its legacy aliases.
Names = str | Sequence[str]
T = TypeVar("T")


class TypedReader:
    """Typed getters over one source of settings, shared by :class:`Env`
    (environment variables, text) and :class:`JsonFields` (a JSON object,
    typed values), so both bound values alike and name the setting alike in
    their one-line :class:`ConfigError`.

    A subclass says how names are looked up (:meth:`_lookup`: the setting as
    an error names it, and its raw value or None when unset) and how a raw
    value becomes an int, a float, a bool or a size (``_to_*``, raising
    ``ValueError`` with the reason).
    """

    def _lookup(self, names: Names) -> tuple[builtins.str, Any]:
        raise NotImplementedError

    def _to_int(self, value: object) -> builtins.int:
        raise NotImplementedError

    def _to_float(self, value: object) -> builtins.float:
        raise NotImplementedError

    def _to_bool(self, value: object) -> builtins.bool:
        raise NotImplementedError

    def _to_size(self, value: object) -> builtins.int:
        raise NotImplementedError

    def _to_str(self, value: object) -> builtins.str:
        raise NotImplementedError

    def _typed(
        self,
        names: Names,
        default: T,
        parse: Callable[[Any], T],
        minimum: Any = None,
        maximum: Any = None,
    ) -> T:
        name, value = self._lookup(names)
        if value is None:
            return default
        try:
            parsed = parse(value)
        except ValueError as e:
            raise ConfigError(name, str(e)) from None
        if minimum is not None and parsed < minimum:
            raise ConfigError(name, f"must be >= {minimum}, got {value!r}")
        if maximum is not None and parsed > maximum:
            raise ConfigError(name, f"must be <= {maximum}, got {value!r}")
        return parsed

    def str(self, names: Names, default: builtins.str = "") -> builtins.str:
        return self._typed(names, default, self._to_str)

    def int(
        self,
        names: Names,
        default: builtins.int,
        *,
        min: builtins.int | None = None,
        max: builtins.int | None = None,
    ) -> builtins.int:
        return self._typed(names, default, self._to_int, min, max)

    def float(
        self,
        names: Names,
        default: builtins.float,
        *,
        min: builtins.float | None = None,
        max: builtins.float | None = None,
    ) -> builtins.float:
        return self._typed(names, default, self._to_float, min, max)

    def bool(self, names: Names, default: builtins.bool) -> builtins.bool:
        return self._typed(names, default, self._to_bool)

    def size(
        self, names: Names, default: builtins.int, *, min: builtins.int | None = None
    ) -> builtins.int:
        return self._typed(names, default, self._to_size, min)

    def choice(
        self, names: Names, default: builtins.str, choices: Sequence[builtins.str]
    ) -> builtins.str:
        name, value = self._lookup(names)
        if value is None:
            return default
        text = self._to_str(value)
        if text not in choices:
            accepted = ", ".join(choices)
            raise ConfigError(name, f"unknown value {text!r} (accepted: {accepted})")
        return text


class Env(TypedReader):
    """Typed reads of environment variables, with legacy aliases.

    ``names`` is one variable name or a tuple (canonical first, then legacy
    aliases): the first non-empty one wins. An empty value counts as unset.
    A legacy alias in use adds one line to :attr:`warnings`, which the
    service logs at start-up.
    """

    def __init__(
        self, environ: Mapping[builtins.str, builtins.str], service: builtins.str = "gorge"
    ) -> None:
        self._environ = environ
        self.service = service
        self.warnings: list[builtins.str] = []

    def _lookup(self, names: builtins.str | Sequence[builtins.str]) -> tuple[builtins.str, Any]:
        candidates = (names,) if isinstance(names, builtins.str) else tuple(names)
        for index, name in enumerate(candidates):
            value = self._environ.get(name, "")
            if value != "":
                if index > 0:
                    warning = f"{name} is deprecated, use {candidates[0]}"
                    if warning not in self.warnings:
                        self.warnings.append(warning)
                return name, value
        return candidates[0], None

    def raw(self, names: builtins.str | Sequence[builtins.str]) -> builtins.str | None:
        return self._lookup(names)[1]

    def str(
        self, names: builtins.str | Sequence[builtins.str], default: builtins.str = ""
    ) -> builtins.str:
        value = self._lookup(names)[1]
        return default if value is None else value

    def _to_int(self, value: Any) -> builtins.int:
        return parse_int(value)

    def _to_float(self, value: Any) -> builtins.float:
        return parse_float(value)

    def _to_bool(self, value: Any) -> builtins.bool:
        return parse_bool(value)

    def _to_size(self, value: Any) -> builtins.int:
        return parse_size(value)

    def _to_str(self, value: Any) -> builtins.str:
        return value


class JsonFields(TypedReader):
    """Typed reads of the fields of one JSON object (a config file, one entry
    of a list in it). JSON ``null`` counts as unset; a value of the wrong
    JSON type is refused, never converted from text. Errors name the setting
    as ``prefix`` + field (``"GORGE_MAILER_CONFIG_FILE maxRetries"``)."""

    def __init__(self, doc: Mapping[builtins.str, Any], prefix: builtins.str = "") -> None:
        self._doc = doc
        self._prefix = prefix

    def _lookup(self, names: builtins.str | Sequence[builtins.str]) -> tuple[builtins.str, Any]:
        name = names if isinstance(names, builtins.str) else names[0]
        return self._prefix + name, self._doc.get(name)

    def _to_int(self, value: Any) -> builtins.int:
        # JSON has one number type: 2.0 is the integer 2, 2.5 is not one.
        if isinstance(value, builtins.float) and value.is_integer():
            return builtins.int(value)
        if isinstance(value, builtins.bool) or not isinstance(value, builtins.int):
            raise ValueError(f"not an integer: {_shown(value)}")
        return value

    def _to_float(self, value: Any) -> builtins.float:
        if isinstance(value, builtins.bool) or not isinstance(value, builtins.int | builtins.float):
            raise ValueError(f"not a number: {_shown(value)}")
        return builtins.float(value)

    def _to_bool(self, value: Any) -> builtins.bool:
        if not isinstance(value, builtins.bool):
            raise ValueError(f"not a boolean (use true or false): {_shown(value)}")
        return value

    def _to_size(self, value: Any) -> builtins.int:
        # A byte count, or the environment's text form ("10M").
        if isinstance(value, builtins.str):
            return parse_size(value)
        return self._to_int(value)

    def _to_str(self, value: Any) -> builtins.str:
        if not isinstance(value, builtins.str):
            raise ValueError(f"not a string: {_shown(value)}")
        return value

    def object(self, name: builtins.str) -> dict[builtins.str, Any]:
        """A nested JSON object; unset gives an empty one."""
        setting, value = self._lookup(name)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(setting, f"not an object: {_shown(value)}")
        return value


def _shown(value: Any) -> builtins.str:
    """A JSON value for an error line: its type for a container (it may hold
    secrets), else its repr, cut short."""
    if isinstance(value, dict | list):
        return "an object" if isinstance(value, dict) else "an array"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True)
class ListenerTLS:
    """HTTPS on a daemon's listener: PEM files, read at start-up and again on SIGHUP."""

    #: The server certificate, then any intermediates (GORGE_TLS_CERT).
    cert: str
    #: Its private key, unencrypted (GORGE_TLS_KEY).
    key: str
    #: CAs whose client certificates are required (GORGE_TLS_CLIENT_CA); empty: none asked for.
    client_ca: str = ""


TLS_SETTINGS = ("GORGE_TLS_CERT", "GORGE_TLS_KEY", "GORGE_TLS_CLIENT_CA")


def load_listener_tls(env: Env) -> ListenerTLS | None:
    """``GORGE_TLS_CERT``, ``GORGE_TLS_KEY`` and ``GORGE_TLS_CLIENT_CA``: None
    (plain HTTP) unless the certificate and key are both set. Only whether each
    file can be read is checked here; what is in them is checked when the
    listener loads them, also before the daemon starts."""
    cert_name, key_name, client_ca_name = TLS_SETTINGS
    cert, key, client_ca = env.str(cert_name), env.str(key_name), env.str(client_ca_name)
    if not cert and not key:
        if client_ca:
            raise ConfigError(client_ca_name, f"needs {cert_name} and {key_name}")
        return None
    if not cert:
        raise ConfigError(cert_name, f"must be set with {key_name}")
    if not key:
        raise ConfigError(key_name, f"must be set with {cert_name}")
    for name, path in ((cert_name, cert), (key_name, key), (client_ca_name, client_ca)):
        if path and (not os.path.isfile(path) or not os.access(path, os.R_OK)):
            raise ConfigError(name, f"{path!r} is not a readable file")
    return ListenerTLS(cert=cert, key=key, client_ca=client_ca)


@dataclass(frozen=True)
class HttpSettings:
    """The diagnostic/API listener every service has."""

    listen_addr: str
    endpoint: str
    token: str = field(repr=False, default="")
    body_limit: int = 2 * 1024 * 1024
    # Whether GORGE_LOG_LEVEL lets the per-request REQUEST line through: when
    # it does not, the line is not even built (a hot API answers thousands
    # of requests a second).
    access_log: bool = True
    # Whether it lets debug lines through: the REQUEST line of routine worker
    # traffic (gorge.web, build_site's ``quiet_paths``) is one of them.
    debug_log: bool = False
    # GORGE_HTTP_FAST: hot routes answered by gorge's own channel (llhttp's
    # parser) rather than twisted.web's; off is the way out if it misbehaves.
    fast: bool = True
    # GORGE_TLS_CERT / GORGE_TLS_KEY: HTTPS instead of plain HTTP.
    tls: ListenerTLS | None = None


def load_http_settings(
    env: Env,
    *,
    default_listen: str,
    body_limit: int = 2 * 1024 * 1024,
    listen_override: str | None = None,
    legacy_names: bool = False,
) -> HttpSettings:
    """``GORGE_LISTEN_ADDR``, ``GORGE_SERVICE_TOKEN``, ``GORGE_BODY_LIMIT``,
    ``GORGE_HTTP_FAST`` and the listener's TLS (:func:`load_listener_tls`).

    ``listen_override`` comes from the twistd ``--listen`` option and wins
    over the environment. ``legacy_names`` accepts the bare ``LISTEN_ADDR`` /
    ``SERVICE_TOKEN`` where an older deployment still sets them.
    """
    listen_names = ("GORGE_LISTEN_ADDR", "LISTEN_ADDR") if legacy_names else "GORGE_LISTEN_ADDR"
    token_names = (
        ("GORGE_SERVICE_TOKEN", "SERVICE_TOKEN") if legacy_names else "GORGE_SERVICE_TOKEN"
    )
    if listen_override:
        setting, listen_addr = "--listen", listen_override
    else:
        setting = "GORGE_LISTEN_ADDR"
        listen_addr = env.str(listen_names, default_listen)
    try:
        endpoint = parse_listen_addr(listen_addr)
    except ValueError as e:
        raise ConfigError(setting, str(e)) from None
    limit = env.size("GORGE_BODY_LIMIT", body_limit, min=1)
    return HttpSettings(
        listen_addr=listen_addr,
        endpoint=endpoint,
        token=env.str(token_names, ""),
        body_limit=limit,
        access_log=_logs_at(env.str("GORGE_LOG_LEVEL", "info"), "info"),
        debug_log=_logs_at(env.str("GORGE_LOG_LEVEL", "info"), "debug"),
        fast=env.bool("GORGE_HTTP_FAST", True),
        tls=load_listener_tls(env),
    )


def _logs_at(level_text: str, wanted: str) -> bool:
    """Whether ``GORGE_LOG_LEVEL`` prints lines of level ``wanted``; a bad
    value counts as yes (the log observer refuses it at start-up with its own
    message)."""
    try:
        return parse_level(level_text) <= LogLevel.levelWithName(wanted)
    except ValueError:
        return True


@dataclass(frozen=True)
class MySQLSettings:
    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "phorge"
    password: str = field(default="", repr=False)
    database: str = ""
    max_connections: int = 20
    connect_timeout: int = 5
    read_timeout: int = 30
    write_timeout: int = 30
    # One of MYSQL_TLS_MODES; ``tls_ca`` (a PEM file) only with ``verify``.
    tls: str = "preferred"
    tls_ca: str = ""

    def describe(self) -> str:
        """For start-up logs: everything but the password."""
        return f"{self.user}@{self.host}:{self.port}/{self.database}"


# disabled: plain TCP. preferred: TLS when the server offers it, unverified
# (what the MySQL clients do by default). required: TLS or no connection,
# unverified. verify: TLS with the server's certificate checked against the
# system's CAs (or the given file) and its name against the host.
MYSQL_TLS_MODES = ("preferred", "disabled", "required", "verify")


def load_mysql_tls(env: Env, mode_name: str, ca_name: str) -> tuple[str, str]:
    """The TLS mode and CA file settings: MySQLSettings' ``tls`` and ``tls_ca``."""
    mode = env.choice(mode_name, "preferred", MYSQL_TLS_MODES)
    ca = env.str(ca_name, "")
    if ca:
        if mode != "verify":
            raise ConfigError(ca_name, f"is only used with {mode_name}=verify")
        if not os.access(ca, os.R_OK) or not os.path.isfile(ca):
            raise ConfigError(ca_name, f"{ca!r} is not a readable file")
    return mode, ca
