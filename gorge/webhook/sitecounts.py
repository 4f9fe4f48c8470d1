"""The site's request counts, read from ``herald_webhookrequest`` for every replica alike.

A replica's own figures (``stats`` at the top level) are its queue view as of
its last poll, so two replicas may each answer a little differently. The
site's figures come from the table itself, whoever delivered the rows
(docs/webhook.md, "HTTP API"): the same for every replica reading the same
database.

Phorge keys ``herald_webhookrequest`` on ``id``, ``phid``, ``key_ratelimit``
and ``key_collect``, none of them on ``status``, and gorge never adds one
to Phorge's tables, so counting by status reads the whole delivery history.
One pass counts all three statuses (the three ``WHERE status = …`` counts
would read it three times); no index serves it better (an index-only scan
of ``key_ratelimit`` reads as much and still cannot tell a retried queued
row from a failed one). The count therefore runs at most once per
``max_age`` seconds per replica, however often ``stats`` is asked: a count
younger than that answers every call, and calls arriving while one runs
share it. Each answer says how old its count is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime

from gorge.app.shared import SharedRun
from gorge.db import Database
from gorge.webhook.observation import SQL_ACTIVE_HOOKS

__all__ = ["SQL_SITE_COUNTS", "SiteCounter", "SiteCounts"]

SQL_SITE_COUNTS = (
    "SELECT UNIX_TIMESTAMP(),"
    " COUNT(CASE WHEN status = 'queued' THEN 1 END),"
    " COUNT(CASE WHEN status = 'sent' THEN 1 END),"
    " COUNT(CASE WHEN status = 'failed' THEN 1 END)"
    " FROM herald_webhookrequest"
)


@dataclass(frozen=True)
class SiteCounts:
    queued: int
    sent: int
    failed: int
    active_hooks: int
    #: The database's clock (Unix seconds) when the rows were counted.
    as_of: int
    #: The counter's clock when the count was asked for: its age runs from here,
    #: so the age said is never less than the real one.
    asked_at: float


class SiteCounter:
    """``read()``: the site's counts, counted at most ``max_age`` seconds ago
    by ``clock``; ``age(counts)``: how long ago."""

    def __init__(self, db: Database, clock: IReactorTime, *, max_age: float) -> None:
        self._db = db
        self._clock = clock
        self._max_age = max_age
        self._last: SiteCounts | None = None
        # Calls that arrive while a count runs share it; a caller that gives
        # up (an HTTP client gone) leaves the count running for the others.
        self._count: SharedRun[SiteCounts] = SharedRun(self._count_once)

    def age(self, counts: SiteCounts) -> float:
        return max(self._clock.seconds() - counts.asked_at, 0.0)

    def read(self) -> Deferred[SiteCounts]:
        last = self._last
        if last is not None and self.age(last) < self._max_age:
            return succeed(last)
        return self._count()

    async def _count_once(self) -> SiteCounts:
        # A failed count is not kept: the next call counts again.
        counts = await self._db.run("site_counts", self._select, self._clock.seconds())
        self._last = counts
        return counts

    def _select(self, txn: Any, asked_at: float) -> SiteCounts:
        self._db.execute(txn, SQL_SITE_COUNTS)
        as_of, queued, sent, failed = txn.fetchone()
        self._db.execute(txn, SQL_ACTIVE_HOOKS)
        (hooks,) = txn.fetchone()
        return SiteCounts(
            queued=int(queued or 0),
            sent=int(sent or 0),
            failed=int(failed or 0),
            active_hooks=int(hooks),
            as_of=int(as_of),
            asked_at=asked_at,
        )
