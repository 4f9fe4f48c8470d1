"""Capturing what the code under test logs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from twisted.internet.defer import Deferred
from twisted.logger import globalLogPublisher


@contextmanager
def logged_events() -> Iterator[list[dict]]:
    """Every log event emitted inside the block, in order; the list stays
    readable after the block and receives nothing more."""
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    try:
        yield events
    finally:
        globalLogPublisher.removeObserver(events.append)


@contextmanager
def first_event(prefix: str) -> Iterator[Deferred]:
    """A Deferred that fires with the first event logged inside the block
    whose format starts with ``prefix``; bound the wait with ``addTimeout``."""
    seen: Deferred = Deferred()

    def observe(event: dict) -> None:
        if not seen.called and str(event.get("log_format", "")).startswith(prefix):
            seen.callback(event)

    globalLogPublisher.addObserver(observe)
    try:
        yield seen
    finally:
        globalLogPublisher.removeObserver(observe)
