"""Phorge's silent mode (``phabricator.silent``), read where stock Phorge keeps it.

Phorge reads its configuration as a stack of sources, the later ones winning:
its defaults, ``conf/local/local.json`` under the Phorge root, then the
``config_entry`` table of ``{namespace}_config`` (namespace ``default``, rows
not deleted, the value JSON). ``phabricator.silent`` is a locked option, so
``bin/config set`` puts it in one of those two places. While it is on,
Phorge's ``HeraldWebhookWorker`` does not call the hook: it fails the request
as ``failed`` / ``none`` / epoch 0 with ``errorType`` ``hook`` and
``errorCode`` ``silent`` (docs/webhook.md, "Silent mode").

The sources are read again every ``interval`` seconds of the clock, at the
start of a poll. While the answer is unknown (never read yet, or a source
that exists could not be read at start-up) the daemon neither posts nor
retires anything: a staging copy must not fire real webhooks because a
permission is missing, and production rows must not be failed as "silent"
because a file is garbled. A source that fails later keeps the last answer.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet.interfaces import IReactorTime

from gorge.db import Database
from gorge.db import mysql as platform_mysql
from gorge.log.logger import Logger

log = Logger()

KEY = "phabricator.silent"
CONFIG_NAMESPACE = "default"  # PhabricatorConfigDatabaseSource('default')
LOCAL_JSON = os.path.join("conf", "local", "local.json")

SOURCE_DATABASE = "database"
SOURCE_LOCAL = "local"
SOURCES = (SOURCE_DATABASE, SOURCE_LOCAL)

# Phorge skips its database source when the schema is not there yet (a site
# being set up); so do we: no database, no table = no value from there.
_ABSENT_CODES = frozenset({1049, 1146})  # unknown database, table does not exist

_DATABASE_NAME = re.compile(r"[A-Za-z0-9_]+\Z")

SQL_SILENT = (
    "SELECT value FROM `{database}`.config_entry"
    " WHERE namespace = %s AND configKey = %s AND isDeleted = 0"
)


class SourceUnreadable(Exception):
    """A configuration source exists but cannot be read."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"{source}: {reason}")
        self.source = source
        self.reason = reason


def php_truthy(value: Any) -> bool:
    """``if (PhabricatorEnv::getEnvConfig('phabricator.silent'))`` on a decoded JSON value."""
    if isinstance(value, str):
        return value not in ("", "0")
    if isinstance(value, (list, dict)):
        return bool(value)
    return bool(value)  # None, booleans, numbers


@dataclass(frozen=True)
class Reading:
    """One reading of the sources: silent or not, and which source decided."""

    silent: bool
    source: str  # "database", "local" or "default"


class SilentMode:
    """Whether Phorge is in silent mode, as of the last reading."""

    def __init__(
        self,
        *,
        sources: tuple[str, ...],
        interval: float,
        clock: IReactorTime,
        db: Database | None = None,
        config_database: str = "",
        phorge_root: str = "",
        read_file: Callable[[str], bytes] | None = None,
    ) -> None:
        if SOURCE_DATABASE in sources and not _DATABASE_NAME.match(config_database):
            raise ValueError(f"not a database name: {config_database!r}")
        self._sources = sources
        self._interval = interval
        self._clock = clock
        self._db = db
        self._config_database = config_database
        self._local_path = os.path.join(phorge_root, LOCAL_JSON) if phorge_root else ""
        self._read_file = read_file if read_file is not None else _read_bytes
        self._reading: Reading | None = None if sources else Reading(False, "default")
        self._next_at = float("-inf")
        self._failure = ""  # the last failure logged, so an outage logs once

    @property
    def enabled(self) -> bool:
        """Any source to read at all (``GORGE_WEBHOOK_SILENT_FROM=none``: no)."""
        return bool(self._sources)

    @property
    def known(self) -> bool:
        return self._reading is not None

    @property
    def silent(self) -> bool:
        return self._reading is not None and self._reading.silent

    async def refresh_if_due(self) -> None:
        """Read the sources again when ``interval`` has passed since the last reading."""
        if not self._sources or self._clock.seconds() < self._next_at:
            return
        self._next_at = self._clock.seconds() + self._interval
        try:
            reading = await self._read()
        except SourceUnreadable as e:
            self._unreadable(e)
            return
        self._failure = ""
        if reading != self._reading:
            previous = self._reading
            self._reading = reading
            log.info(
                "WEBHOOK_SILENT_MODE silent={silent} source={source} previous={previous}",
                silent=reading.silent,
                source=reading.source,
                previous="unknown" if previous is None else previous.silent,
            )

    def _unreadable(self, e: SourceUnreadable) -> None:
        if str(e) == self._failure:
            return
        self._failure = str(e)
        kept = "unknown: nothing is delivered" if self._reading is None else self._reading.silent
        log.error(
            "WEBHOOK_SILENT_CHECK_FAILED source={source} reason={reason} silent={silent}",
            source=e.source,
            reason=e.reason,
            silent=kept,
        )

    async def _read(self) -> Reading:
        # The database wins over local.json, as in Phorge's stack.
        if SOURCE_DATABASE in self._sources:
            found = await self._read_database()
            if found is not None:
                return Reading(php_truthy(found), SOURCE_DATABASE)
        if SOURCE_LOCAL in self._sources and self._local_path:
            document = self._read_local()
            if document is not None and KEY in document:
                return Reading(php_truthy(document[KEY]), SOURCE_LOCAL)
        return Reading(False, "default")

    async def _read_database(self) -> Any | None:
        """The decoded value of the live config entry, or None when there is none."""
        assert self._db is not None
        statement = SQL_SILENT.format(database=self._config_database)

        def read(txn) -> list:
            self._db.execute(txn, statement, (CONFIG_NAMESPACE, KEY))  # type: ignore[union-attr]
            return list(txn.fetchall())

        try:
            rows = await self._db.run("silent_mode", read)
        except Exception as e:
            if _error_code(e) in _ABSENT_CODES:
                return None
            raise SourceUnreadable(
                f"{self._config_database}.config_entry", platform_mysql.error_reason(e)
            ) from e
        if not rows:
            return None
        raw = rows[0][0]
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else str(raw)
        try:
            return json.loads(text)
        except ValueError:
            raise SourceUnreadable(
                f"{self._config_database}.config_entry", f"{KEY} is not JSON"
            ) from None

    def _read_local(self) -> dict | None:
        """local.json as Phorge reads it: absent is empty; unreadable or not JSON is an error.

        Read in the reactor thread: a local file of a few hundred bytes, once
        per interval, costs less than a thread hand-off."""
        path = self._local_path
        try:
            data = self._read_file(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise SourceUnreadable(path, e.strerror or type(e).__name__) from None
        try:
            document = json.loads(data)
        except ValueError:
            raise SourceUnreadable(path, "not valid JSON") from None
        if not isinstance(document, dict):
            raise SourceUnreadable(path, "not a JSON object")
        return document


def _error_code(exc: BaseException) -> int | None:
    """The MySQL error number of a driver error (its first argument)."""
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
