"""What gorge-webhook reads without writing: the queue view's polls, hooks, counts.

Phorge's table has no index on ``status``: a query "WHERE status = 'queued'"
would read the whole delivery history. No statement here does. The
:class:`~gorge.webhook.queueview.QueueView` remembers the table; this module
feeds it with primary-key ranges above the last id seen, rows by id, one
block of ids at a time for the background recount, and reads
``key_ratelimit`` for the breaker (docs/webhook.md, "Polling").

Every time value compared with ``dateModified`` / ``lastRequestEpoch`` is
the database's clock, so several instances agree on every window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred, DeferredLock

from gorge.db import Database
from gorge.log.logger import Logger
from gorge.webhook.queuedrows import Seen
from gorge.webhook.queueview import QueueView
from gorge.webhook.recount import BLOCK, Counts, SweepStep, block_of
from gorge.webhook.rows import QUEUED, chunks, marks, text

log = Logger()

NEW_ROWS_PER_POLL = 5000  # new ids read per poll; a larger burst is read over several
START_OVERLAP = 1000  # the newest ids at start-up are read as new ones (holes tracked)
LOAD_CHUNK = 40 * BLOCK  # ids counted per statement by the start-up pass
SWEEP_RATE = 2000.0  # ids recounted per second by the background pass
SWEEP_MAX_STEPS = 4  # blocks per poll at most, however long since the last one

SQL_NOW = "SELECT UNIX_TIMESTAMP()"

SQL_BOUNDS = "SELECT MIN(id), MAX(id) FROM herald_webhookrequest"

_STATE_COLUMNS = (
    "id, webhookPHID, status, lastRequestResult, lastRequestEpoch, dateCreated, dateModified"
)

# New ids, oldest first: a primary-key range, whatever the history below it.
SQL_NEW_ROWS = (
    f"SELECT {_STATE_COLUMNS} FROM herald_webhookrequest"
    " WHERE id > %s AND id <= %s ORDER BY id ASC LIMIT %s"
)

SQL_ROWS_BY_ID = f"SELECT {_STATE_COLUMNS} FROM herald_webhookrequest WHERE id IN ({{marks}})"

_STATUS_COUNTS = (
    "COUNT(CASE WHEN status = 'queued' THEN 1 END), COUNT(CASE WHEN status = 'sent' THEN 1 END),"
    " COUNT(CASE WHEN status = 'failed' THEN 1 END)"
)

# Per block of ids: how many rows are in each status (start-up pass).
SQL_BLOCK_COUNTS = (
    f"SELECT (id - 1) DIV {BLOCK}, {_STATUS_COUNTS}"
    " FROM herald_webhookrequest WHERE id > %s AND id <= %s GROUP BY 1 ORDER BY NULL"
)

# The same for one block (the recount; no GROUP BY, no temporary table).
SQL_RANGE_COUNTS = f"SELECT {_STATUS_COUNTS} FROM herald_webhookrequest WHERE id > %s AND id <= %s"

SQL_QUEUED_IN_RANGE = (
    f"SELECT {_STATE_COLUMNS} FROM herald_webhookrequest"
    " WHERE id > %s AND id <= %s AND status = 'queued'"
)

SQL_HOOKS = (
    "SELECT id, phid, name, webhookURI, status, hmacKey FROM herald_webhook WHERE phid IN ({marks})"
)

# Every row of the hook counts, whatever its status. A range of
# key_ratelimit(webhookPHID, lastRequestResult, lastRequestEpoch).
SQL_BREAKER_COUNT = (
    "SELECT COUNT(*) FROM herald_webhookrequest"
    " WHERE webhookPHID = %s AND lastRequestResult = 'fail'"
    " AND lastRequestEpoch >= UNIX_TIMESTAMP() - %s"
)

# herald_webhook holds one row per hook, never a history.
SQL_ACTIVE_HOOKS = "SELECT COUNT(*) FROM herald_webhook WHERE status <> 'disabled'"

SQL_HOOK_TOTAL = "SELECT COUNT(*) FROM herald_webhook"

SQL_HOOK_LIST = "SELECT phid, name, status FROM herald_webhook ORDER BY id ASC"


def _seen(row: Sequence[Any]) -> Seen:
    """A row of ``_STATE_COLUMNS``."""
    return Seen(
        id=int(row[0]),
        hook=text(row[1]),
        status=text(row[2]),
        result=text(row[3]),
        epoch=int(row[4]),
        created=int(row[5]),
        modified=int(row[6]),
    )


@dataclass(frozen=True)
class Hook:
    id: int
    phid: str
    name: str
    uri: str = field(repr=False)
    status: str
    hmac_key: str = field(repr=False)

    @property
    def disabled(self) -> bool:
        return self.status == "disabled"


@dataclass(frozen=True)
class Stats:
    queued: int
    sent: int
    failed: int
    active_hooks: int


@dataclass(frozen=True)
class HookState:
    phid: str
    name: str
    status: str
    failures: int  # failed attempts within the breaker window, all replicas
    queued: int  # queued rows this replica knows of
    oldest_queued: int | None  # seconds its oldest queued row has been in the table


@dataclass
class _Loading:
    """Progress of the start-up pass, kept across a failure so it resumes."""

    position: int
    start: int
    lowest: int
    highest: int
    started: float


class Observation:
    """The reads that keep the queue view current, and the ones the breaker and the
    API ask for.

    The database's clock (``db.clock``: an injected one in tests) also paces
    the background recount. Methods taking ``txn`` run in a pool thread, inside
    another part's interaction, and never touch the view.
    """

    def __init__(self, db: Database, view: QueueView) -> None:
        self._db = db
        self.view = view
        self._pace = db.clock.seconds
        self._load_lock = DeferredLock()
        self._loading: _Loading | None = None
        self._sweep_budget = 0.0
        self._swept_at: float | None = None

    # -- reads run inside one interaction (pool thread: no view access) ----

    def read_bounds(self, txn) -> tuple[int | None, int | None]:
        self._db.execute(txn, SQL_BOUNDS)
        lowest, highest = txn.fetchone()
        return (None if lowest is None else int(lowest), None if highest is None else int(highest))

    def read_by_id(self, txn, ids: Sequence[int]) -> list[Seen]:
        rows: list[Seen] = []
        for chunk in chunks(ids):
            self._db.execute(txn, SQL_ROWS_BY_ID.format(marks=marks(len(chunk))), chunk)
            rows.extend(_seen(row) for row in txn.fetchall())
        return rows

    def _read_new(self, txn, cursor: int, highest: int | None) -> tuple[list[Seen], int]:
        """Rows above the cursor, and how far they reach."""
        if highest is None or highest <= cursor:
            return [], cursor
        self._db.execute(txn, SQL_NEW_ROWS, (cursor, highest, NEW_ROWS_PER_POLL))
        rows = [_seen(row) for row in txn.fetchall()]
        return rows, rows[-1].id if len(rows) == NEW_ROWS_PER_POLL else highest

    def _read_counts(self, txn, low: int, high: int) -> dict[int, Counts]:
        self._db.execute(txn, SQL_BLOCK_COUNTS, (low, high))
        return {
            int(row[0]): Counts(*(int(value or 0) for value in row[1:])) for row in txn.fetchall()
        }

    def _read_queued(self, txn, low: int, high: int) -> list[Seen]:
        self._db.execute(txn, SQL_QUEUED_IN_RANGE, (low, high))
        return [_seen(row) for row in txn.fetchall()]

    def _read_range(self, txn, low: int, high: int) -> tuple[dict[int, Counts], list[Seen]]:
        counts = self._read_counts(txn, low, high)
        queued = self._read_queued(txn, low, high) if any(c.queued for c in counts.values()) else []
        return counts, queued

    def _read_changes(self, txn, cursor: int, recheck: list[int], plan: list[SweepStep]):
        """One poll's reads: clock, bounds, new ids, rows to look at again by id (holes,
        rows leased elsewhere), the blocks due for a recount."""
        self._db.execute(txn, SQL_NOW)
        now = int(txn.fetchone()[0])
        lowest, highest = self.read_bounds(txn)
        if highest is not None and highest < cursor:
            return now, lowest, highest, [], cursor, [], []
        new_rows, upto = self._read_new(txn, cursor, highest)
        rechecked = self.read_by_id(txn, recheck)
        swept = []
        for step in plan:
            refreshed = self.read_by_id(txn, step.known)
            self._db.execute(txn, SQL_RANGE_COUNTS, (step.low, step.high))
            counts = Counts(*(int(value or 0) for value in txn.fetchone()))
            still_queued = sum(1 for seen in refreshed if seen.status == QUEUED)
            queued = (
                self._read_queued(txn, step.low, step.high) if counts.queued > still_queued else []
            )
            swept.append((step, refreshed, counts, queued))
        return now, lowest, highest, new_rows, upto, rechecked, swept

    # -- what this process knows of the table --------------------------------

    async def load(self) -> None:
        """The start-up pass, once (again after the table was emptied or recreated)."""
        if not self.view.loaded:
            await self._load_lock.run(lambda: Deferred.fromCoroutine(self._load_once()))

    async def _load_once(self) -> None:
        view = self.view
        if view.loaded:
            return
        if self._loading is None:
            lowest, highest = await self._db.run("load_bounds", self.read_bounds)
            if highest is None:
                view.finish_load(0, None)
                return
            assert lowest is not None
            # The newest ids are read as new ones, so commits arriving late
            # among them (or below the lowest row) are waited for like any poll's.
            start = max(highest - START_OVERLAP, 0)
            self._loading = _Loading(
                position=block_of(lowest) * BLOCK,
                start=start,
                lowest=lowest,
                highest=highest,
                started=self._pace(),
            )
        loading = self._loading
        while loading.position < loading.start:
            upto = min(loading.position + LOAD_CHUNK, loading.start)
            stamp = view.stamp()
            counts, queued = await self._db.run(
                "load_range", self._read_range, loading.position, upto
            )
            view.loaded_range(counts, queued, stamp, self._pace())
            loading.position = upto
        stamp = view.stamp()
        rows, upto = await self._db.run(
            "load_newest", self._read_new, loading.start, loading.highest
        )
        view.finish_load(loading.start, loading.lowest)
        view.scanned(rows, upto, stamp, self._pace())
        self._loading = None
        totals = view.counts()
        log.info(
            "WEBHOOK_QUEUE_LOADED lowest_id={lowest} highest_id={highest} queued={queued}"
            " sent={sent} failed={failed} seconds={seconds}",
            lowest=loading.lowest,
            highest=loading.highest,
            queued=totals.queued,
            sent=totals.sent,
            failed=totals.failed,
            seconds=round(self._pace() - loading.started, 3),
        )

    def _sweep_steps(self, at: float) -> int:
        """Blocks to recount this poll: SWEEP_RATE ids a second, spread over the polls."""
        if self._swept_at is not None:
            self._sweep_budget = min(
                self._sweep_budget + (at - self._swept_at) * SWEEP_RATE,
                float(SWEEP_MAX_STEPS * BLOCK),
            )
        self._swept_at = at
        steps = int(self._sweep_budget // BLOCK)
        self._sweep_budget -= steps * BLOCK
        return steps

    async def observe(self) -> int:
        """Read what changed since the last poll into the view; returns the database clock."""
        view = self.view
        at = self._pace()
        plan = view.sweep_plan(self._sweep_steps(at))
        holes, leased = view.holes(), view.leased_elsewhere()
        stamp = view.stamp()
        try:
            now, lowest, highest, new_rows, upto, rechecked, swept = await self._db.run(
                "poll", self._read_changes, view.cursor, holes + leased, plan
            )
        except Exception:
            view.sweep_rewind(plan)
            raise
        if not view.bounds(lowest, highest, at):
            log.info(
                "WEBHOOK_QUEUE_RELOAD reason={reason} highest_id={highest} cursor={cursor}",
                reason="ids went back: the table was emptied or recreated",
                highest=highest,
                cursor=view.cursor,
            )
            view.reset()
            await self.load()
            return now
        view.scanned(new_rows, upto, stamp, at)
        view.holes_checked([seen for seen in rechecked if not view.knows(seen.id)], stamp, at)
        answered = {seen.id for seen in rechecked}
        for seen in rechecked:
            if view.knows(seen.id):
                view.saw(seen, stamp)
        for request_id in leased:
            if request_id not in answered:
                view.gone(request_id)
        found = 0
        for step, refreshed, counts, queued in swept:
            found += view.swept(step, refreshed, counts, queued, stamp, at)
        if found:
            # Queued rows nobody told us about: put back to queued from outside
            # (Phorge, an operator), or committed later than the hole window.
            log.info("WEBHOOK_QUEUED_ROWS_FOUND rows={rows}", rows=found)
        return now

    # -- hooks, breaker, counts ----------------------------------------------

    async def load_hooks(self, phids: Sequence[str]) -> dict[str, Hook]:
        """The hooks of one batch of candidates, by PHID; a missing hook is absent."""
        if not phids:
            return {}

        def select(txn) -> dict[str, Hook]:
            statement = SQL_HOOKS.format(marks=marks(len(phids)))
            self._db.execute(txn, statement, [phid.encode("utf-8") for phid in phids])
            hooks = (
                Hook(
                    id=int(row[0]),
                    phid=text(row[1]),
                    name=text(row[2]),
                    uri=text(row[3]),
                    status=text(row[4]),
                    hmac_key=text(row[5]),
                )
                for row in txn.fetchall()
            )
            return {hook.phid: hook for hook in hooks}

        return await self._db.run("hooks", select)

    async def _count(self, statement: str, params: Sequence[Any] = (), *, description: str) -> int:
        def select(txn) -> int:
            self._db.execute(txn, statement, params)
            return int(txn.fetchone()[0])

        return await self._db.run(description, select)

    async def recent_failures(self, hook_phid: str, window: int) -> int:
        return await self._count(
            SQL_BREAKER_COUNT, (hook_phid.encode("utf-8"), window), description="recent_failures"
        )

    async def queued_for_hook(self, hook_phid: str) -> int:
        """Queued rows of the hook as this process knows them (no query: no index serves it)."""
        await self.load()
        return self.view.queued_for_hook(hook_phid)

    async def stats(self) -> Stats:
        """Status counts as of the last poll (docs/webhook.md, "HTTP API"); hooks counted live."""
        await self.load()
        active_hooks = await self._count(SQL_ACTIVE_HOOKS, description="active_hooks")
        counts = self.view.counts()
        return Stats(
            queued=counts.queued, sent=counts.sent, failed=counts.failed, active_hooks=active_hooks
        )

    async def hook_total(self) -> int:
        return await self._count(SQL_HOOK_TOTAL, description="hook_total")

    async def hook_states(self, window: int) -> list[HookState]:
        """Every hook, with its failures in the breaker window (the breaker's own
        count) and the queued rows this process knows of."""
        await self.load()

        def read(txn) -> list[tuple[str, str, str, int]]:
            self._db.execute(txn, SQL_HOOK_LIST)
            hooks = [(text(r[0]), text(r[1]), text(r[2])) for r in txn.fetchall()]
            counted = []
            for phid, name, status in hooks:
                self._db.execute(txn, SQL_BREAKER_COUNT, (phid.encode("utf-8"), window))
                counted.append((phid, name, status, int(txn.fetchone()[0])))
            return counted

        counted = await self._db.run("hook_states", read)
        ages = self.view.oldest_queued()
        return [
            HookState(
                phid=phid,
                name=name,
                status=status,
                failures=failures,
                queued=self.view.queued_for_hook(phid),
                oldest_queued=ages.get(phid),
            )
            for phid, name, status, failures in counted
        ]
