"""Mailer configuration from the environment or a JSON file.

``load_mailer_settings(environ, listen=..., config_file=...)`` returns a
frozen :class:`MailerSettings` or raises ``ConfigError`` for anything that
stops start-up. It only shape-checks the backend list; building each
entry (unknown type, missing credential, bad port) happens in the service
builder, also before listening.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gorge.config import (
    ConfigError,
    Env,
    HttpSettings,
    JsonFields,
    MySQLSettings,
    load_http_settings,
    load_listener_tls,
    load_mysql_tls,
    parse_listen_addr,
)
from gorge.mailer.backends.base import BackendEntry

SERVICE = "gorge-mailer"
DEFAULT_LISTEN = ":8110"
TRANSPORT_BODY_LIMIT = 10 * 1024 * 1024

# Flat single-backend variables -> option keys; only these are mapped.
FLAT_OPTIONS = {
    "SMTP_HOST": "host",
    "SMTP_PORT": "port",
    "SMTP_USER": "user",
    "SMTP_PASSWORD": "password",
    "SMTP_PROTOCOL": "protocol",
    "MAILER_ACCESS_KEY": "access-key",
    "MAILER_SECRET_KEY": "secret-key",
    "MAILER_REGION": "region",
    "MAILER_ENDPOINT": "endpoint",
    "MAILER_API_KEY": "api-key",
    "MAILER_DOMAIN": "domain",
    "MAILER_API_HOSTNAME": "api-hostname",
    "MAILER_ACCESS_TOKEN": "access-token",
}
_FILE_KEYS = {
    "listenAddr",
    "serviceToken",
    "mailers",
    "maxRetries",
    "retryWaitSec",
    "bodyLimit",
    "sendTimeoutSec",
}
# Read in env mode only; in file mode each one that is set is named
# in a warning. Legacy spellings and the flat backend variables included.
_ENV_ONLY = (
    "GORGE_LISTEN_ADDR",
    "LISTEN_ADDR",
    "GORGE_MAILER_CONFIG",
    "MAILER_CONFIG",
    "GORGE_MAILER_MAX_RETRIES",
    "MAX_RETRIES",
    "GORGE_MAILER_RETRY_WAIT",
    "RETRY_WAIT",
    "GORGE_MAILER_BODY_LIMIT",
    "BODY_LIMIT",
    "GORGE_MAILER_SEND_TIMEOUT",
    "GORGE_MAILER_TYPE",
    "MAILER_TYPE",
    "GORGE_MAILER_KEY",
    "MAILER_KEY",
    *FLAT_OPTIONS,
)


IDEMPOTENCY_STORES = ("sqlite", "mysql", "off")
SQLITE_FILE_NAME = "gorge-mailer-idempotency.sqlite3"
DEFAULT_RETENTION = 7 * 24 * 3600
DEFAULT_MAX_ENTRIES = 1_000_000
# An unquoted MySQL identifier: the table is created in it by name.
_DATABASE_NAME = re.compile(r"[A-Za-z0-9_$]{1,64}")


@dataclass(frozen=True)
class IdempotencySettings:
    """Where gorge-mailer keeps what it did with each ``Idempotency-Key``
    (docs/mailer.md, "Sending once"), and for how long. Read from the
    environment in both modes: the file mode's JSON has no such keys."""

    store: str = "sqlite"
    #: SQLite only; the default lies in the state directory (see
    #: :func:`default_sqlite_path`).
    sqlite_path: str = SQLITE_FILE_NAME
    #: MySQL only: gorge-mailer's own database, never one of Phorge's.
    mysql: MySQLSettings | None = None
    retention: int = DEFAULT_RETENTION
    max_entries: int = DEFAULT_MAX_ENTRIES


class MalformedList(ValueError):
    """The backend list is not a well-formed JSON array of entries. The text
    is a short cause without option values (it reaches ``/readyz``)."""


@dataclass(frozen=True)
class MailerSettings:
    http: HttpSettings
    entries: tuple[BackendEntry, ...] = ()
    max_retries: int = 2
    retry_wait: float = 2.0
    body_limit: int = 524288
    send_timeout: float = 25.0
    strict: bool = False
    idempotency: IdempotencySettings = IdempotencySettings()
    #: Lenient mode only: why the list was ignored (reported by /readyz).
    config_problem: str | None = None
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @property
    def drain_budget(self) -> float:
        """Shutdown waits this long for in-flight sends."""
        return self.send_timeout + 5.0


def parse_backend_list(text: str, source: str) -> list[BackendEntry] | None:
    """Entries of a JSON backend list, with effective priorities.

    Returns ``None`` for JSON ``null`` (= unset). Raises
    :class:`MalformedList` for syntax/shape errors and ``ConfigError`` for
    semantic ones (empty or duplicate key)."""
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise MalformedList(f"invalid JSON at line {e.lineno} column {e.colno}") from None
    except ValueError:
        raise MalformedList("invalid JSON") from None
    if doc is None:
        return None
    return entries_from_json(doc, source)


def entries_from_json(doc: Any, source: str) -> list[BackendEntry]:
    if not isinstance(doc, list):
        raise MalformedList("the mailer list must be a JSON array")
    return _with_priorities([_entry_shape(item, i) for i, item in enumerate(doc)], source)


def _entry_shape(item: Any, index: int) -> tuple[str, str, int, dict[str, str]]:
    """One element's fields, typed; a wrong JSON type is a shape error,
    raised as :class:`MalformedList` naming the field."""
    where = f"element {index}"
    if not isinstance(item, dict):
        raise MalformedList(f"{where} is not an object")
    fields = JsonFields(item, prefix=f"{where}.")
    try:
        # Absent (or null) is not a shape error but an empty value, which
        # _with_priorities rejects in both modes (required).
        key = fields.str("key", "")
        typ = fields.str("type", "")
        priority = fields.int("priority", 0)
        options = fields.object("options")
    except ConfigError as e:
        raise MalformedList(str(e)) from None
    coerced = {}
    for name, value in options.items():
        if isinstance(value, (dict, list)):
            raise MalformedList(f"{where}: option {name[:40]!r} must be a scalar")
        coerced[name] = _scalar(value)
    return key, typ, priority, coerced


def _with_priorities(
    raw_entries: list[tuple[str, str, int, dict[str, str]]], source: str
) -> list[BackendEntry]:
    """The semantic checks (required, unique keys) and effective priorities:
    an unset priority counts down from -1 in declaration order."""
    seen: set[str] = set()
    entries = []
    auto = 0
    for i, (key, typ, priority, options) in enumerate(raw_entries):
        if key.strip() == "":
            raise ConfigError(f"{source} [element {i}].key", "key must not be empty")
        if key in seen:
            raise ConfigError(f"{source} [{key}].key", "duplicate mailer key")
        seen.add(key)
        if typ.strip() == "":
            raise ConfigError(f"{source} [{key}].type", "type is required")
        if priority == 0:
            auto -= 1
            priority = auto
        entries.append(
            BackendEntry(key=key, type=typ, priority=priority, options=options, source=source)
        )
    return entries


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def _scalar(value: Any) -> str:
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def load_mailer_settings(
    environ: Mapping[str, str], *, listen: str | None = None, config_file: str | None = None
) -> MailerSettings:
    env = Env(environ, SERVICE)
    # GORGE_STRICT_CONFIG is the project-wide switch, not a deprecated alias.
    strict = env.bool("GORGE_MAILER_STRICT", env.bool("GORGE_STRICT_CONFIG", False))
    path = config_file or env.str(("GORGE_MAILER_CONFIG_FILE", "MAILER_CONFIG_FILE"), "")
    if path:
        settings = _from_file(env, environ, path, listen, strict, config_file is not None)
    else:
        settings = _from_env(env, environ, listen, strict)
    warnings = list(settings.warnings) + env.warnings
    if settings.max_retries * settings.retry_wait > 10:
        warnings.append(
            f"max retries x retry wait = {settings.max_retries * settings.retry_wait:g} s "
            "exceeds 10 s; the send deadline still bounds each request"
        )
    if settings.send_timeout >= 30:
        warnings.append(
            f"send timeout {settings.send_timeout:g} s is not below the PHP client's 30 s"
        )
    if strict and not settings.entries:
        setting = "GORGE_MAILER_CONFIG_FILE" if path else "GORGE_MAILER_CONFIG"
        reason = settings.config_problem or "no mailers configured"
        raise ConfigError(setting, f"{reason} (strict mode)")
    idempotency = load_idempotency_settings(env, environ)
    return replace(settings, idempotency=idempotency, warnings=tuple(warnings))


def default_sqlite_path(environ: Mapping[str, str]) -> str:
    """The state directory systemd hands a unit with ``StateDirectory=``
    (the first one when it names several), else the working directory."""
    state = environ.get("STATE_DIRECTORY", "").split(":")[0]
    return os.path.join(state, SQLITE_FILE_NAME) if state else SQLITE_FILE_NAME


def load_idempotency_settings(env: Env, environ: Mapping[str, str]) -> IdempotencySettings:
    store = env.choice("GORGE_MAILER_IDEMPOTENCY_STORE", "sqlite", IDEMPOTENCY_STORES)
    retention = env.int("GORGE_MAILER_IDEMPOTENCY_RETENTION_SEC", DEFAULT_RETENTION, min=3600)
    max_entries = env.int("GORGE_MAILER_IDEMPOTENCY_MAX_ENTRIES", DEFAULT_MAX_ENTRIES, min=1000)
    path = env.str("GORGE_MAILER_IDEMPOTENCY_DB", "") or default_sqlite_path(environ)
    mysql = None
    if store == "sqlite":
        _require_writable(path, "GORGE_MAILER_IDEMPOTENCY_DB")
    elif store == "mysql":
        mysql = _idempotency_mysql(env)
    return IdempotencySettings(
        store=store,
        sqlite_path=path,
        mysql=mysql,
        retention=retention,
        max_entries=max_entries,
    )


def _require_writable(path: str, setting: str) -> None:
    """The file is opened on the first keyed send, not at start-up (a mailer
    that never gets a key makes no file), so check now that it can be."""
    if os.path.isdir(path):
        raise ConfigError(setting, f"{path!r} is a directory; name a file in it")
    if os.path.exists(path):
        if not os.access(path, os.R_OK | os.W_OK):
            raise ConfigError(setting, f"{path!r} is not readable and writable")
        return
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(setting, f"directory {folder!r} does not exist or is not writable")


def _idempotency_mysql(env: Env) -> MySQLSettings:
    prefix = "GORGE_MAILER_IDEMPOTENCY_MYSQL_"
    database = env.str(prefix + "DATABASE", "gorge_mailer")
    if not _DATABASE_NAME.fullmatch(database):
        raise ConfigError(prefix + "DATABASE", f"not a plain database name: {database[:64]!r}")
    tls, tls_ca = load_mysql_tls(env, prefix + "TLS", prefix + "TLS_CA")
    return MySQLSettings(
        host=env.str(prefix + "HOST", "127.0.0.1"),
        port=env.int(prefix + "PORT", 3306, min=1, max=65535),
        user=env.str(prefix + "USER", "phorge"),
        password=env.str(prefix + "PASS", ""),
        database=database,
        max_connections=4,
        tls=tls,
        tls_ca=tls_ca,
    )


def _from_env(
    env: Env, environ: Mapping[str, str], listen: str | None, strict: bool
) -> MailerSettings:
    http = load_http_settings(
        env,
        default_listen=DEFAULT_LISTEN,
        body_limit=TRANSPORT_BODY_LIMIT,
        listen_override=listen,
        legacy_names=True,
    )
    max_retries = env.int(("GORGE_MAILER_MAX_RETRIES", "MAX_RETRIES"), 2, min=0)
    retry_wait = env.int(("GORGE_MAILER_RETRY_WAIT", "RETRY_WAIT"), 2, min=0)
    body_limit = env.int(("GORGE_MAILER_BODY_LIMIT", "BODY_LIMIT"), 524288)
    send_timeout = env.int("GORGE_MAILER_SEND_TIMEOUT", 25, min=1)
    warnings: list[str] = []
    problem = None
    entries: list[BackendEntry] | None = None
    names = ("GORGE_MAILER_CONFIG", "MAILER_CONFIG")
    text = env.str(names, "")
    if text:
        try:
            entries = parse_backend_list(text, "GORGE_MAILER_CONFIG")
        except MalformedList as e:
            if strict:
                raise ConfigError("GORGE_MAILER_CONFIG", f"malformed mailer list: {e}") from None
            problem = f"mailer configuration invalid: {e}"
            warnings.append(f"GORGE_MAILER_CONFIG ignored: {e}")
    if entries is None:
        typ = env.str(("GORGE_MAILER_TYPE", "MAILER_TYPE"), "")
        if typ:
            key = env.str(("GORGE_MAILER_KEY", "MAILER_KEY"), "default")
            options = {
                opt: environ[var] for var, opt in FLAT_OPTIONS.items() if environ.get(var, "")
            }
            entries = [
                BackendEntry(
                    key=key, type=typ, priority=-1, options=options, source="GORGE_MAILER_TYPE"
                )
            ]
            problem = None
    return MailerSettings(
        http=http,
        entries=tuple(entries or ()),
        max_retries=max_retries,
        retry_wait=float(retry_wait),
        body_limit=body_limit,
        send_timeout=float(send_timeout),
        strict=strict,
        config_problem=problem,
        warnings=tuple(warnings),
    )


def _from_file(
    env: Env,
    environ: Mapping[str, str],
    path: str,
    listen: str | None,
    strict: bool,
    from_option: bool,
) -> MailerSettings:
    setting = "--config" if from_option else "GORGE_MAILER_CONFIG_FILE"
    doc = _read_json_object(path, setting)
    warnings = [
        f"{name} is ignored because a config file is used"
        for name in _ENV_ONLY
        if environ.get(name, "")
    ]
    unknown = sorted(set(doc) - _FILE_KEYS)
    if unknown:
        warnings.append(f"unknown config file keys ignored: {', '.join(k[:40] for k in unknown)}")
    fields = JsonFields(doc, prefix=f"{setting} ")
    http = _file_http(env, fields, listen, setting, "serviceToken" in doc)
    entries: list[BackendEntry] = []
    if doc.get("mailers") is not None:
        try:
            entries = entries_from_json(doc["mailers"], "GORGE_MAILER_CONFIG_FILE")
        except MalformedList as e:
            raise ConfigError(f"{setting} mailers", str(e)) from None
    return MailerSettings(
        http=http,
        entries=tuple(entries),
        max_retries=fields.int("maxRetries", 2, min=0),
        retry_wait=float(fields.int("retryWaitSec", 2, min=0)),
        body_limit=fields.int("bodyLimit", 524288),
        send_timeout=float(fields.int("sendTimeoutSec", 25, min=1)),
        strict=strict,
        warnings=tuple(warnings),
    )


def _read_json_object(path: str, setting: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError(setting, f"cannot read {path}: {e.strerror or e}") from None
    try:
        doc = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ConfigError(setting, f"invalid JSON at line {e.lineno} column {e.colno}") from None
    except (ValueError, UnicodeDecodeError):
        raise ConfigError(setting, "invalid JSON") from None
    if not isinstance(doc, dict):
        raise ConfigError(setting, "the config file must hold a JSON object")
    return doc


def _file_http(
    env: Env, fields: JsonFields, listen: str | None, setting: str, has_token: bool
) -> HttpSettings:
    """The listener of file mode: ``--listen`` over ``listenAddr``; the
    file's ``serviceToken`` (even an empty one) over the environment's."""
    listen_addr = listen or fields.str("listenAddr", "") or DEFAULT_LISTEN
    try:
        endpoint = parse_listen_addr(listen_addr)
    except ValueError as e:
        raise ConfigError("--listen" if listen else f"{setting} listenAddr", str(e)) from None
    token = env.str(("GORGE_SERVICE_TOKEN", "SERVICE_TOKEN"), "")
    if has_token:
        token = fields.str("serviceToken", "")
    return HttpSettings(
        listen_addr=listen_addr,
        endpoint=endpoint,
        token=token,
        body_limit=TRANSPORT_BODY_LIMIT,
        tls=load_listener_tls(env),
    )
