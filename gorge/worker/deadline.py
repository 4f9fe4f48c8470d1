"""Bounding a Deferred by our own timer, whatever the cancelled work raises.

A cancelled treq request fails with ``ResponseNeverReceived([CancelledError])``
rather than ``CancelledError``, so ``addTimeout``'s default translation misses
it. Here any failure that follows our timer firing becomes ``TimeoutError``.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, TimeoutError
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure


def _ours(result, timeout):
    if isinstance(result, Failure):
        raise TimeoutError(f"deadline of {timeout:g}s passed")
    return result


def within(d: Deferred, timeout: float, clock: IReactorTime) -> Deferred:
    return d.addTimeout(timeout, clock, onTimeoutCancel=_ours)
