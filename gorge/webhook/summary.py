"""The once-a-minute summary line of the delivery loop."""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime

from gorge.log.logger import Logger

log = Logger()

SUMMARY_EVERY = 60.0


class Summary:
    """Counters since the last summary line; a minute without any logs nothing."""

    FIELDS = (
        "claims_won",
        "claims_lost",
        "breaker_skips",
        "delivered",
        "failed",
        "config_failures",
    )
    claims_won: int
    claims_lost: int
    breaker_skips: int
    delivered: int
    failed: int
    config_failures: int

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self._logged_at = clock.seconds()
        self.reset()

    def reset(self) -> None:
        for name in self.FIELDS:
            setattr(self, name, 0)

    def snapshot(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.FIELDS}

    def maybe_log(self) -> None:
        """Log and restart the counters once SUMMARY_EVERY seconds have passed."""
        now = self._clock.seconds()
        if now - self._logged_at < SUMMARY_EVERY:
            return
        self._logged_at = now
        counts = self.snapshot()
        if any(counts.values()):
            log.info(
                "WEBHOOK_SUMMARY claims_won={claims_won} claims_lost={claims_lost}"
                " breaker_skips={breaker_skips} delivered={delivered} failed={failed}"
                " config_failures={config_failures}",
                **counts,
            )
        self.reset()
