"""Capturing what the code under test logs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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
