"""A database outage as the poll loop sees it: one line when it starts, one a
minute while it lasts, one when a whole poll works again."""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime

from gorge.db import mysql as platform_mysql
from gorge.log.logger import Logger

log = Logger()

OUTAGE_LOG_EVERY = 60.0


class Outage:
    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self._since: float | None = None
        self._logged_at = 0.0

    def failed(self, exc: Exception, event: str) -> None:
        """A poll failed; ``event`` takes ``error``, ``reason`` and ``since``."""
        now = self._clock.seconds()
        if self._since is None:
            self._since = now
        elif now - self._logged_at < OUTAGE_LOG_EVERY:
            return
        self._logged_at = now
        log.error(
            event,
            error=type(exc).__name__,
            reason=platform_mysql.error_reason(exc),
            since=self._since,
        )

    def recovered(self) -> None:
        if self._since is not None:
            log.info(
                "WEBHOOK_POLL_RECOVERED down_seconds={seconds}",
                seconds=round(self._clock.seconds() - self._since, 3),
            )
            self._since = None
