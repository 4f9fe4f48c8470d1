"""The logger every gorge module writes through.

It is Twisted's :class:`twisted.logger.Logger` with one difference: the check
that a level is a real one looks it up in a set made once. Twisted's own check
sorts the level constants on every event, which on a busy worker or queue was
the largest single cost of logging."""

from __future__ import annotations

from time import time
from typing import Any

from twisted.logger import Logger as _TwistedLogger
from twisted.logger import LogLevel

__all__ = ["Logger"]

_LEVELS = frozenset(LogLevel.iterconstants())


class Logger(_TwistedLogger):
    def emit(self, level: LogLevel, format: str | None = None, **kwargs: object) -> None:
        if level not in _LEVELS:
            super().emit(level, format, **kwargs)  # Twisted reports the bad level
            return
        event: dict[str, Any] = kwargs
        event.update(
            log_logger=self,
            log_level=level,
            log_namespace=self.namespace,
            log_source=self.source,
            log_format=format,
            log_time=time(),
        )
        if "log_trace" in event:
            event["log_trace"].append((self, self.observer))
        self.observer(event)
