"""Per-hook circuit breaker.

The database decides: a hook is open while it has ``threshold`` failed
attempts within the last ``window`` seconds. This object only remembers which
hooks were found open, so the candidate query can leave them out, they are
re-evaluated as soon as the window allows (at most ``recheck`` seconds
later), and the log gets one line per transition instead of one per row and
tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from twisted.internet.interfaces import IReactorTime

from gorge.log.logger import Logger
from gorge.webhook.metrics import WebhookMetrics

log = Logger()

RECHECK_SECONDS = 30.0
CLOSED_TRUST_SECONDS = 1.0


class FailureCounter(Protocol):
    async def recent_failures(self, hook_phid: str, window: int) -> int: ...

    async def queued_for_hook(self, hook_phid: str) -> int: ...


@dataclass
class _Open:
    checked_at: float
    queued: int


class Breaker:
    def __init__(
        self,
        store: FailureCounter,
        *,
        threshold: int,
        window: int,
        clock: IReactorTime,
        metrics: WebhookMetrics,
        recheck: float = RECHECK_SECONDS,
        trust: float = CLOSED_TRUST_SECONDS,
    ) -> None:
        self._store = store
        self._threshold = threshold
        self._window = window
        self._clock = clock
        self._metrics = metrics
        # A failure is counted while it is at most ``window`` whole seconds
        # old, so the failures that opened a hook have all left the window
        # ``window + 1`` seconds after it was found open: the first look
        # that can find it closed. Long windows are still looked at every
        # ``recheck`` seconds (another replica's successes may close them).
        self._recheck = min(recheck, window + 1)
        self._open: dict[str, _Open] = {}
        # Hooks counted closed, and when, with no failure of ours since: their
        # next rows within ``trust`` seconds need no new count. Our own
        # failures always force a count; another instance's failures are seen
        # within ``trust``.
        self._closed: dict[str, float] = {}
        self._trust = trust

    def excluded(self) -> list[str]:
        """Hooks found open within the recheck interval: no candidate of theirs is read."""
        now = self._clock.seconds()
        return sorted(
            hook for hook, state in self._open.items() if now - state.checked_at < self._recheck
        )

    def failed(self, hook_phid: str) -> None:
        """A failed attempt of ours: the hook's next row counts again."""
        self._closed.pop(hook_phid, None)

    async def is_open(self, hook_phid: str) -> bool:
        """Count the hook's recent failures; raises when the count fails (caller skips the row)."""
        now = self._clock.seconds()
        counted_at = self._closed.get(hook_phid)
        if counted_at is not None and now - counted_at < self._trust:
            return False
        failures = await self._store.recent_failures(hook_phid, self._window)
        is_open = failures >= self._threshold
        if is_open:
            queued = await self._store.queued_for_hook(hook_phid)
            if hook_phid not in self._open:
                log.warn(
                    "WEBHOOK_HOOK_IN_ERROR_BACKOFF hook={hook} failures={failures}"
                    " threshold={threshold} window={window}",
                    hook=hook_phid,
                    failures=failures,
                    threshold=self._threshold,
                    window=self._window,
                )
                self._metrics.breaker_transitions.labels(state="open").inc()
            self._open[hook_phid] = _Open(checked_at=now, queued=queued)
        else:
            self._closed[hook_phid] = now
            if self._open.pop(hook_phid, None) is not None:
                log.info(
                    "WEBHOOK_HOOK_BACKOFF_CLEARED hook={hook} failures={failures}"
                    " threshold={threshold} window={window}",
                    hook=hook_phid,
                    failures=failures,
                    threshold=self._threshold,
                    window=self._window,
                )
                self._metrics.breaker_transitions.labels(state="closed").inc()
        self._metrics.open_breaker_rows.set(sum(s.queued for s in self._open.values()))
        return is_open

    async def recheck_due(self) -> None:
        """Re-evaluate open hooks whose last look is older than the recheck interval.

        Done from the tick, not through candidates, so an open hook's backlog
        never takes the place of another hook's new row in the candidate batch.
        """
        now = self._clock.seconds()
        # Forget stale closed verdicts so the map does not grow with every hook ever seen.
        for hook in [h for h, at in self._closed.items() if now - at >= self._trust]:
            del self._closed[hook]
        for hook in [h for h, s in self._open.items() if now - s.checked_at >= self._recheck]:
            try:
                await self.is_open(hook)
            except Exception:
                log.debug("WEBHOOK_BACKOFF_CHECK_FAILED hook={hook}", hook=hook)
