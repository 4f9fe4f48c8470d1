"""Log output for the person on call: level filter, text or JSON lines.

A plain ``twistd -n gorge-X`` prints through :func:`make_observer` (the
service hands it to twistd, see :func:`gorge.service.run_make_service`);
``twistd --logger=gorge.logging.observer_from_env`` installs the same
observer explicitly. Events are UPPER_SNAKE names first, fields passed as
keywords; this module renders them, stamps the request id of the HTTP
request being served, and never renders a secret."""

from __future__ import annotations

import json
import logging as stdlib_logging
import os
import re
import sys
from collections.abc import Mapping
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import IO, Any

from twisted.logger import (
    FilteringLogObserver,
    ILogObserver,
    LogEvent,
    LogLevel,
    LogLevelFilterPredicate,
    formatEvent,
)
from zope.interface import implementer

from gorge.config import ConfigError, parse_level
from gorge.log.logger import Logger

request_id_var: ContextVar[str | None] = ContextVar("gorge_request_id", default=None)


# Field names whose values never reach a log line, whatever the event.
_SECRET_FIELDS = frozenset(
    {
        "token",
        "password",
        "passwd",
        "secret",
        "key",
        "hmac_key",
        "api_key",
        "apikey",
        "authorization",
        "body",
        "service_token",
    }
)


def _event_name(event: Mapping[str, Any]) -> str:
    fmt = event.get("log_format") or ""
    match = re.match(r"([A-Z][A-Z0-9_]+)\b", fmt)
    return match.group(1) if match else ""


def _render_text(event: LogEvent) -> str:
    text = formatEvent(event)
    failure = event.get("log_failure")
    if failure is not None:
        text = f"{text}\n{failure.getTraceback()}"
    return text


def _safe_value(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return repr(value)


@implementer(ILogObserver)
class LineObserver:
    """One line per event, text or JSON, to a stream."""

    def __init__(self, stream: IO[str], fmt: str = "text") -> None:
        self._stream = stream
        self._json = fmt == "json"

    def __call__(self, event: LogEvent) -> None:
        level = event.get("log_level", LogLevel.info)
        ts = datetime.fromtimestamp(event.get("log_time") or 0, tz=UTC)
        stamp = ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"
        request_id = event.get("request_id") or event.get("gorge_request_id")
        try:
            message = _render_text(event) if not self._json else formatEvent(event)
        except Exception:  # a broken format string must not kill logging
            message = repr(event.get("log_format"))
        if self._json:
            record: dict[str, Any] = {
                "ts": stamp,
                "level": level.name,
                "event": _event_name(event),
                "namespace": event.get("log_namespace", ""),
                "msg": message,
            }
            if request_id:
                record["request_id"] = request_id
            for key, value in event.items():
                if key.startswith("log_") or key in record or key.startswith("gorge_"):
                    continue
                if key in _SECRET_FIELDS:
                    continue
                record[key] = _safe_value(value)
            failure = event.get("log_failure")
            if failure is not None:
                record["traceback"] = failure.getTraceback()
            line = json.dumps(record, separators=(",", ":"), ensure_ascii=False, default=repr)
        else:
            rid = f" request_id={request_id}" if request_id else ""
            line = (
                f"{stamp} {level.name.upper():<5} [{event.get('log_namespace', '')}] {message}{rid}"
            )
        try:
            self._stream.write(line + "\n")
            self._stream.flush()
        except Exception:
            pass


@implementer(ILogObserver)
class _RequestIdStamp:
    """Copies the current request id onto events emitted while serving it."""

    def __init__(self, inner: ILogObserver) -> None:
        self._inner = inner

    def __call__(self, event: dict) -> None:
        if "request_id" not in event and "gorge_request_id" not in event:
            rid = request_id_var.get()
            if rid:
                event["gorge_request_id"] = rid
        self._inner(event)


class _ForwardToTwisted(stdlib_logging.Handler):
    """Third-party stdlib logging goes through the same filter and format."""

    def __init__(self) -> None:
        super().__init__()
        self._log = Logger(namespace="stdlib")

    def emit(self, record: stdlib_logging.LogRecord) -> None:
        level = (
            LogLevel.error
            if record.levelno >= stdlib_logging.ERROR
            else LogLevel.warn
            if record.levelno >= stdlib_logging.WARNING
            else LogLevel.info
            if record.levelno >= stdlib_logging.INFO
            else LogLevel.debug
        )
        self._log.emit(level, "{name}: {message}", name=record.name, message=record.getMessage())


def make_observer(environ: Mapping[str, str], stream: IO[str]) -> ILogObserver:
    """Build the filtered observer from ``GORGE_LOG_LEVEL`` / ``GORGE_LOG_FORMAT``.

    A bad value raises :class:`ConfigError` naming the variable.
    """
    level_text = environ.get("GORGE_LOG_LEVEL") or "info"
    try:
        level = parse_level(level_text)
    except ValueError as e:
        raise ConfigError("GORGE_LOG_LEVEL", str(e)) from None
    fmt = (environ.get("GORGE_LOG_FORMAT") or "text").strip().lower()
    if fmt not in ("text", "json"):
        raise ConfigError("GORGE_LOG_FORMAT", f"unknown log format {fmt!r} (accepted: text, json)")
    predicate = LogLevelFilterPredicate(defaultLogLevel=level)
    return _RequestIdStamp(FilteringLogObserver(LineObserver(stream, fmt), [predicate]))


def forward_stdlib_logging() -> None:
    """Send third-party ``logging`` records through the twisted observers, once."""
    root = stdlib_logging.getLogger()
    if not any(isinstance(h, _ForwardToTwisted) for h in root.handlers):
        root.addHandler(_ForwardToTwisted())
        root.setLevel(stdlib_logging.INFO)


def observer_from_env() -> ILogObserver:
    """``twistd --logger`` factory.

    twistd gives no way to fail cleanly from here, so a bad setting is
    reported as one line on stderr and the process exits with status 2.
    """
    try:
        observer = make_observer(os.environ, sys.stdout)
    except ConfigError as e:
        sys.stderr.write(f"gorge: {e}\n")
        sys.stderr.flush()
        os._exit(2)
    forward_stdlib_logging()
    return observer
