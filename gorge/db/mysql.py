"""MySQL access through ``twisted.enterprise.adbapi`` with pymysql: the pool,
and what the error codes mean. The MySQL engine of the SQL layer
(gorge/sql/engine.py) stands on these; stores use the layer, not the pool.

The pool is lazy: creating it connects nowhere, so a daemon starts (and
answers ``/healthz``) before Phorge has created its databases."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

import pymysql
from twisted.enterprise import adbapi

from gorge.config import MySQLSettings

__all__ = [
    "connect",
    "make_pool",
    "is_transient",
    "is_retryable",
    "is_read_only",
    "error_reason",
    "READ_ONLY_QUERY",
    "reads_only",
]

DEADLOCK, LOCK_WAIT_TIMEOUT = 1213, 1205

# A server that refuses writes: started with --read-only or SET GLOBAL
# read_only=1 (1290, ER_OPTION_PREVENTS_STATEMENT, for a user without the
# READ ONLY ADMIN / SUPER privilege; super_read_only gives it to everyone),
# MySQL's read-only mode (1836), and a write in a READ ONLY transaction (1792).
_READ_ONLY_CODES = frozenset({1290, 1836, 1792})

# What the health check asks. super_read_only (MySQL) sets read_only as well,
# so one variable answers for both; MariaDB 10.11 answers 0/1, later releases
# may spell it OFF/ON/NO_LOCK..., anything but off means no writes.
READ_ONLY_QUERY = "SELECT @@global.read_only"

# A transaction the server rolled back because of other transactions: the
# same transaction run again may well succeed.
_RETRYABLE_CODES = frozenset({DEADLOCK, LOCK_WAIT_TIMEOUT})

# Those, and client-side codes for a connection that is gone or never came up.
_TRANSIENT_CODES = frozenset({2002, 2003, 2005, 2006, 2013, 2014, 2055, 1040}) | _RETRYABLE_CODES

_REASONS = {
    1044: "access denied to database",
    1045: "access denied",
    1049: "unknown database",
    2002: "unreachable",
    2003: "unreachable",
    2005: "unknown host",
    2006: "connection lost",
    2013: "connection lost",
    1290: "database read-only",
    1836: "database read-only",
    1792: "database read-only",
}


def _set_session(connection: Any) -> None:
    # Epoch columns are written from our clock, but NOW()-style defaults and
    # strict mode must not depend on the server's configuration.
    with connection.cursor() as cursor:
        cursor.execute("SET SESSION time_zone = '+00:00'")


def _tls_context(settings: MySQLSettings) -> ssl.SSLContext:
    if settings.tls == "verify":
        return ssl.create_default_context(cafile=settings.tls_ca or None)
    # preferred and required encrypt without checking whom they talk to, as
    # the MySQL clients do; the system's CAs would go unused, so none are loaded.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class _Driver:
    """The part of a DB-API module adbapi uses: ``connect``."""

    def __init__(self, connect: Callable[..., Any]) -> None:
        self.connect = connect


def _connect_with(settings: MySQLSettings) -> Callable[..., Any]:
    """How each pool connection opens, with one TLS context shared by all of them.

    Left to itself pymysql builds a context, and loads the system's CA
    certificates into it, for every connection (about 45 ms of CPU each),
    which a pool of twenty paid whenever it grew.
    """
    if settings.tls == "disabled":
        return lambda **kw: pymysql.connect(ssl_disabled=True, **kw)
    context = _tls_context(settings)
    if settings.tls in ("required", "verify"):
        return lambda **kw: pymysql.connect(ssl=context, **kw)

    class _PreferredTLS(pymysql.connections.Connection):
        # pymysql (1.2 and later) asks for a context of its own ({} options)
        # in its "preferred" mode, which is what this mode is.
        def _create_ssl_ctx(self, sslp: Any) -> Any:
            return context if sslp == {} else super()._create_ssl_ctx(sslp)

    return _PreferredTLS


def _connection_arguments(settings: MySQLSettings, *, autocommit: bool) -> dict[str, Any]:
    """What every connection of ours is opened with, pooled or not."""
    return dict(
        host=settings.host,
        port=settings.port,
        user=settings.user,
        password=settings.password,
        database=settings.database,
        charset="utf8mb4",
        autocommit=autocommit,
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.read_timeout,
        write_timeout=settings.write_timeout,
    )


def connect(settings: MySQLSettings) -> Any:
    """One blocking autocommit connection of its own, opened as the pool's are
    (TLS, timeouts, session), for what must stay on one session: named locks.
    Call it in a thread, never in the reactor's."""
    connection = _connect_with(settings)(**_connection_arguments(settings, autocommit=True))
    _set_session(connection)
    return connection


def make_pool(
    settings: MySQLSettings, reactor: Any, *, autocommit: bool = False
) -> adbapi.ConnectionPool:
    """``autocommit``: every statement commits on its own."""
    pool = adbapi.ConnectionPool(
        "pymysql",
        **_connection_arguments(settings, autocommit=autocommit),
        cp_min=1,
        cp_max=settings.max_connections,
        cp_reconnect=True,
        cp_noisy=False,
        cp_openfun=_set_session,
        cp_reactor=reactor,
    )
    pool.dbapi = _Driver(_connect_with(settings))
    return pool


def _error_code(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return None


def is_transient(exc: BaseException) -> bool:
    """A failure that the next tick or request may not see again."""
    if isinstance(exc, adbapi.ConnectionLost):
        return True
    return _error_code(exc) in _TRANSIENT_CODES


def is_retryable(exc: BaseException) -> bool:
    """A deadlock or lock wait timeout: worth running the whole transaction again."""
    return _error_code(exc) in _RETRYABLE_CODES


def is_read_only(exc: BaseException) -> bool:
    """The server refused a write because it is read-only (a demoted or
    fenced master): nothing a retry now can change, only a writable master."""
    return _error_code(exc) in _READ_ONLY_CODES


def reads_only(value: Any) -> bool:
    """Whether ``@@global.read_only``'s answer means the server takes no writes."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if isinstance(value, str):
        return value.strip().upper() not in ("0", "OFF", "")
    return bool(value)


def error_reason(exc: BaseException) -> str:
    """A short cause for ``/readyz``: never the DSN, host or password."""
    if isinstance(exc, adbapi.ConnectionLost):
        return "connection lost"
    code = _error_code(exc)
    if code in _REASONS:
        return _REASONS[code]
    return f"database error {code}" if code is not None else "database unavailable"
