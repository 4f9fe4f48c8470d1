"""Waiting for an answer through ``treq.testing.StubTreq`` when the server
side needs the real reactor (a store that answers from a pool thread)."""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

PUMP_INTERVAL = 0.002


async def pumped(stub: Any, d: Deferred, *, bound: float) -> Any:
    """``d``'s result, flushing ``stub``'s in-memory connections on the real
    reactor until it fires; ``AssertionError`` (and ``d`` cancelled) if it has
    not fired within ``bound`` seconds."""
    from twisted.internet import reactor

    deadline = reactor.seconds() + bound
    while True:
        stub.flush()
        if d.called:
            return await d
        if reactor.seconds() > deadline:
            d.cancel()
            raise AssertionError(f"no answer within {bound:g} s")
        await deferLater(reactor, PUMP_INTERVAL)
