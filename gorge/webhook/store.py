"""The herald tables: candidates, claim, outcome writes, hook lookups, counts,
Retry-After holds, and the delivery log with its replays.

Every statement stands alone (autocommit; a few of them may share one short
``runInteraction``). Every time value compared with or stored into
``dateModified`` / ``lastRequestEpoch`` is the database's clock, so several
instances agree on every window.

Phorge's table has no index on ``status``: a query "WHERE status = 'queued'"
would read the whole delivery history. No statement here does. The store
keeps a :class:`~gorge.webhook.queueview.QueueView` of the table and reads
only primary-key ranges above the last id seen, rows by id, one block of ids
at a time for the background recount, and ``key_ratelimit`` for the breaker
(docs/webhook.md, "Polling").

The SQL is written once, in MySQL's spelling; the engine (gorge/db/engine.py)
adapts it to SQLite for the demo, and every read or write runs through
:meth:`gorge.db.database.Database.run`, named after what it does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred, DeferredLock
from twisted.internet.interfaces import IReactorTime

from gorge.config import MySQLSettings
from gorge.db import Database
from gorge.log.logger import Logger
from gorge.webhook.queueview import BLOCK, Counts, QueueView, Seen, SweepStep, block_of

log = Logger()

QUEUED, SENT, FAILED = "queued", "sent", "failed"
RESULT_NONE, RESULT_OKAY, RESULT_FAIL = "none", "okay", "fail"

DATABASE_NAME = "webhook"  # prefixes the transactions' log events: WEBHOOK_TXN_RETRY

NEW_ROWS_PER_POLL = 5000  # new ids read per poll; a larger burst is read over several
START_OVERLAP = 1000  # the newest ids at start-up are read as new ones (holes tracked)
LOAD_CHUNK = 40 * BLOCK  # ids counted per statement by the start-up pass
SWEEP_RATE = 2000.0  # ids recounted per second by the background pass
SWEEP_MAX_STEPS = 4  # blocks per poll at most, however long since the last one
# A batch write of this many rows or fewer runs the one-row statement per row
# (begin, n writes, commit: no more round trips than lock, write, begin, commit).
PER_ROW_WRITES = 2
IDS_PER_STATEMENT = 500  # SQLite's old limit is 999 bound parameters
LIST_WINDOW = 2000  # ids per statement of the delivery log's listing
LIST_BUDGET = 10_000  # ids one listing call reads at most
SINCE_SLACK = 60  # seconds: how much older a row with a higher id may be

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

# The candidate query, asked only about rows known to be queued and
# due: the two time conditions stay separate and are judged by the database.
SQL_CANDIDATES = (
    "SELECT id, phid, webhookPHID, objectPHID, status, properties,"
    " lastRequestResult, lastRequestEpoch, dateCreated, dateModified"
    " FROM herald_webhookrequest"
    " WHERE status = 'queued' AND id IN ({ids})"
    " AND (dateModified = dateCreated OR dateModified <= %s)"
    " AND (lastRequestResult <> 'fail' OR lastRequestEpoch <= %s)"
    " ORDER BY id ASC"
    " LIMIT %s"
)

# "+ 1" makes a same-second claim still change the version.
SQL_CLAIM = (
    "UPDATE herald_webhookrequest"
    " SET dateModified = GREATEST(dateModified + 1, UNIX_TIMESTAMP())"
    " WHERE id = %s AND status = 'queued' AND dateModified = %s"
)

# A batch claim (docs/webhook.md, "Claiming and writing back") moves every
# candidate's row still at the version it was read at, in one statement. When
# that moved some rows but not all, it is undone and the rows are locked first,
# so the versions read are the ones won.
SQL_LOCK_ROWS = "SELECT id, status, dateModified FROM herald_webhookrequest WHERE id IN ({marks})"

SQL_CLAIM_ROWS = (
    "UPDATE herald_webhookrequest"
    " SET dateModified = GREATEST(dateModified + 1, UNIX_TIMESTAMP())"
    " WHERE id IN ({marks}) AND status = 'queued' AND dateModified = CASE id{versions} END"
)

# A delivery result follows a won claim.
SQL_FINISH = (
    "UPDATE herald_webhookrequest"
    " SET status = %s, lastRequestResult = %s, lastRequestEpoch = UNIX_TIMESTAMP(),"
    " properties = %s, dateModified = GREATEST(dateModified + 1, UNIX_TIMESTAMP())"
    " WHERE id = %s AND status = 'queued'"
)

# The same for several rows at once (a batch write, docs/webhook.md, "Claiming and
# writing back"): each row gets exactly the values SQL_FINISH would give it.
SQL_FINISH_ROWS = (
    "UPDATE herald_webhookrequest"
    " SET status = CASE id{statuses} END, lastRequestResult = CASE id{results} END,"
    " lastRequestEpoch = UNIX_TIMESTAMP(), properties = CASE id{documents} END,"
    " dateModified = GREATEST(dateModified + 1, UNIX_TIMESTAMP())"
    " WHERE id IN ({marks}) AND status = 'queued'"
)

# Configuration failures are written without a claim, so only over the version we read.
SQL_RETIRE = (
    "UPDATE herald_webhookrequest"
    " SET status = 'failed', lastRequestResult = 'none', lastRequestEpoch = 0,"
    " properties = %s, dateModified = GREATEST(dateModified + 1, UNIX_TIMESTAMP())"
    " WHERE id = %s AND status = 'queued' AND dateModified = %s"
)

# A Retry-After hold keeps other replicas off the row by claiming it again
# (docs/webhook.md, "Retry-After and 410 Gone"): dateModified moves to now, as
# every write of ours does, and nothing else changes.
SQL_RENEW_HOLD = SQL_CLAIM

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

# -- the delivery log (docs/webhook.md, "Delivery log and replay") -------------

_REQUEST_COLUMNS = (
    "id, phid, webhookPHID, objectPHID, status, properties,"
    " lastRequestResult, lastRequestEpoch, dateCreated, dateModified"
)

# Newest first, one window of the primary key at a time: a call reads a
# bounded number of rows whatever the filters (fragments from LIST_FILTERS).
SQL_LIST_WINDOW = (
    f"SELECT {_REQUEST_COLUMNS} FROM herald_webhookrequest"
    " WHERE id < %s AND id >= %s{filters} ORDER BY id DESC LIMIT %s"
)

LIST_FILTERS = {
    "hook": " AND webhookPHID = %s",
    "status": " AND status = %s",
    "result": " AND lastRequestResult = %s",
    "since": " AND dateCreated >= %s",
}

# The lowest id created at or after a second: one entry of key_collect(dateCreated).
SQL_FIRST_ID_SINCE = (
    "SELECT id FROM herald_webhookrequest WHERE dateCreated >= %s"
    " ORDER BY dateCreated ASC, id ASC LIMIT 1"
)

SQL_REQUEST_BY_ID = f"SELECT {_REQUEST_COLUMNS} FROM herald_webhookrequest WHERE id = %s"

SQL_REQUEST_BY_PHID = f"SELECT {_REQUEST_COLUMNS} FROM herald_webhookrequest WHERE phid = %s"

# A hook's finished requests created in a time range, oldest first from an id on.
SQL_REPLAY_RANGE = (
    f"SELECT {_REQUEST_COLUMNS} FROM herald_webhookrequest"
    " WHERE webhookPHID = %s AND dateCreated >= %s AND dateCreated < %s"
    " AND status IN ({statuses}) AND id > %s ORDER BY id ASC LIMIT %s"
)

# A replay puts a finished row back in the state Phorge inserts it in: queued,
# no attempt made, dateModified = dateCreated (an untouched row, a candidate at
# once for every replica). Only over the state read, so a row that changed
# meanwhile is not replayed twice, and never a row that is still queued.
SQL_REPLAY = (
    "UPDATE herald_webhookrequest"
    " SET status = 'queued', lastRequestResult = 'none', lastRequestEpoch = 0,"
    " dateModified = dateCreated"
    " WHERE id = %s AND status = %s AND dateModified = %s"
)

SQL_HOOK_LIST = "SELECT phid, name, status FROM herald_webhook ORDER BY id ASC"


def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return "" if value is None else str(value)


@dataclass(frozen=True)
class Candidate:
    id: int
    phid: str
    hook_phid: str
    object_phid: str
    properties: str
    last_result: str
    last_epoch: int
    date_created: int
    version: int  # dateModified as read: the claim's compare-and-set value

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Candidate:
        return cls(
            id=int(row[0]),
            phid=_text(row[1]),
            hook_phid=_text(row[2]),
            object_phid=_text(row[3]),
            properties=_text(row[5]),
            last_result=_text(row[6]),
            last_epoch=int(row[7]),
            date_created=int(row[8]),
            version=int(row[9]),
        )


class CandidateBatch(list[Candidate]):
    """The candidates of one poll, oldest first.

    ``more``: the queue view held at least as many due rows as were asked
    for, so more are waiting behind these. The batch itself may be shorter
    than the limit even then: rows claimed or finished while it was read
    are left out.
    """

    more: bool = False


def _seen(row: Sequence[Any]) -> Seen:
    """A row of ``_STATE_COLUMNS``."""
    return Seen(
        id=int(row[0]),
        hook=_text(row[1]),
        status=_text(row[2]),
        result=_text(row[3]),
        epoch=int(row[4]),
        created=int(row[5]),
        modified=int(row[6]),
    )


def _seen_candidate(row: Sequence[Any]) -> Seen:
    """The state columns of a row of the candidate query."""
    return Seen(
        id=int(row[0]),
        hook=_text(row[2]),
        status=_text(row[4]),
        result=_text(row[6]),
        epoch=int(row[7]),
        created=int(row[8]),
        modified=int(row[9]),
    )


def _chunks(ids: Sequence[int]) -> Iterable[Sequence[int]]:
    for start in range(0, len(ids), IDS_PER_STATEMENT):
        yield ids[start : start + IDS_PER_STATEMENT]


def _marks(n: int) -> str:
    return ", ".join(["%s"] * n)


class BatchConflict(Exception):
    """A batch statement changed other rows than the ones it had locked (rolled back)."""


@dataclass(frozen=True)
class Outcome:
    """A delivery result to write over a row this process claimed."""

    candidate: Candidate
    status: str
    result: str
    properties: str


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
class RequestRow:
    """One row of ``herald_webhookrequest``, every column."""

    id: int
    phid: str
    hook_phid: str
    object_phid: str
    status: str
    properties: str
    last_result: str
    last_epoch: int
    date_created: int
    date_modified: int

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> RequestRow:
        return cls(
            id=int(row[0]),
            phid=_text(row[1]),
            hook_phid=_text(row[2]),
            object_phid=_text(row[3]),
            status=_text(row[4]),
            properties=_text(row[5]),
            last_result=_text(row[6]),
            last_epoch=int(row[7]),
            date_created=int(row[8]),
            date_modified=int(row[9]),
        )

    def seen(self) -> Seen:
        return Seen(
            id=self.id,
            hook=self.hook_phid,
            status=self.status,
            result=self.last_result,
            epoch=self.last_epoch,
            created=self.date_created,
            modified=self.date_modified,
        )


@dataclass(frozen=True)
class RequestPage:
    rows: list[RequestRow]
    next_cursor: int | None  # ids below this may match too; None: nothing older matches


@dataclass(frozen=True)
class Replay:
    """A row put back to queued: as it was, and as it is now."""

    before: RequestRow
    after: RequestRow


class NotReplayable(Exception):
    """The row is queued (or changed while it was being replayed)."""

    def __init__(self, row: RequestRow) -> None:
        super().__init__(row.status)
        self.row = row


@dataclass(frozen=True)
class RangeReplay:
    replayed: list[Replay]
    skipped: list[RequestRow]  # changed between the read and the replay
    next_after_id: int | None  # more may match above this id; None: the range is done


@dataclass(frozen=True)
class HookState:
    phid: str
    name: str
    status: str
    failures: int  # failed attempts within the breaker window, all replicas
    queued: int  # queued rows this replica knows of


# Phorge's layout and keys, nothing more: the demo must behave as production does.
SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS herald_webhook (
  id INTEGER PRIMARY KEY AUTOINCREMENT, phid BLOB NOT NULL UNIQUE,
  name TEXT NOT NULL, webhookURI TEXT NOT NULL, viewPolicy BLOB NOT NULL,
  editPolicy BLOB NOT NULL, status TEXT NOT NULL, hmacKey TEXT NOT NULL,
  dateCreated INTEGER NOT NULL, dateModified INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS key_status ON herald_webhook (status);
CREATE TABLE IF NOT EXISTS herald_webhookrequest (
  id INTEGER PRIMARY KEY AUTOINCREMENT, phid BLOB NOT NULL UNIQUE,
  webhookPHID BLOB NOT NULL, objectPHID BLOB NOT NULL, status TEXT NOT NULL,
  properties TEXT NOT NULL, lastRequestResult TEXT NOT NULL,
  lastRequestEpoch INTEGER NOT NULL, dateCreated INTEGER NOT NULL,
  dateModified INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS key_ratelimit ON herald_webhookrequest
  (webhookPHID, lastRequestResult, lastRequestEpoch);
CREATE INDEX IF NOT EXISTS key_collect ON herald_webhookrequest (dateCreated);
"""


@dataclass
class _Loading:
    """Progress of the start-up pass, kept across a failure so it resumes."""

    position: int
    start: int
    lowest: int
    highest: int
    started: float


class WebhookStore:
    """The herald tables in one database, and what this process knows of them.

    The database's clock (``db.clock``: an injected one in tests) also
    paces the background recount.
    """

    def __init__(self, db: Database, *, view: QueueView | None = None) -> None:
        self.db = db
        self._engine = db.engine
        self._view = view if view is not None else QueueView()
        self._pace = db.clock.seconds
        self._load_lock = DeferredLock()
        self._loading: _Loading | None = None
        self._sweep_budget = 0.0
        self._swept_at: float | None = None

    @classmethod
    def mysql(
        cls, settings: MySQLSettings, reactor, *, db_clock: IReactorTime | None = None
    ) -> WebhookStore:
        # Every statement stands alone: autocommit, no COMMIT round trips.
        return cls(
            Database.mysql(
                settings, reactor, name=DATABASE_NAME, autocommit=True, db_clock=db_clock
            )
        )

    @classmethod
    def sqlite(cls, path: str, reactor, *, db_clock: IReactorTime | None = None) -> WebhookStore:
        """The embedded store (the demo's): the file and its tables are created on first use."""
        return cls(
            Database.sqlite(
                path, reactor, name=DATABASE_NAME, schema=SQLITE_SCHEMA, db_clock=db_clock
            )
        )

    @property
    def view(self) -> QueueView:
        return self._view

    def _execute(self, txn, statement: str, params: Sequence[Any] = ()) -> None:
        self._engine.execute(txn, statement, params)

    # -- reads run inside one interaction (pool thread: no view access) ----

    def _read_bounds(self, txn) -> tuple[int | None, int | None]:
        self._execute(txn, SQL_BOUNDS)
        lowest, highest = txn.fetchone()
        return (None if lowest is None else int(lowest), None if highest is None else int(highest))

    def _read_new(self, txn, cursor: int, highest: int | None) -> tuple[list[Seen], int]:
        """Rows above the cursor, and how far they reach."""
        if highest is None or highest <= cursor:
            return [], cursor
        self._execute(txn, SQL_NEW_ROWS, (cursor, highest, NEW_ROWS_PER_POLL))
        rows = [_seen(row) for row in txn.fetchall()]
        return rows, rows[-1].id if len(rows) == NEW_ROWS_PER_POLL else highest

    def _read_by_id(self, txn, ids: Sequence[int]) -> list[Seen]:
        rows: list[Seen] = []
        for chunk in _chunks(ids):
            self._execute(txn, SQL_ROWS_BY_ID.format(marks=_marks(len(chunk))), chunk)
            rows.extend(_seen(row) for row in txn.fetchall())
        return rows

    def _read_counts(self, txn, low: int, high: int) -> dict[int, Counts]:
        self._execute(txn, SQL_BLOCK_COUNTS, (low, high))
        return {
            int(row[0]): Counts(*(int(value or 0) for value in row[1:])) for row in txn.fetchall()
        }

    def _read_queued(self, txn, low: int, high: int) -> list[Seen]:
        self._execute(txn, SQL_QUEUED_IN_RANGE, (low, high))
        return [_seen(row) for row in txn.fetchall()]

    def _read_range(self, txn, low: int, high: int) -> tuple[dict[int, Counts], list[Seen]]:
        counts = self._read_counts(txn, low, high)
        queued = self._read_queued(txn, low, high) if any(c.queued for c in counts.values()) else []
        return counts, queued

    def _read_changes(self, txn, cursor: int, recheck: list[int], plan: list[SweepStep]):
        """One poll's reads: clock, bounds, new ids, rows to look at again by id (holes,
        rows leased elsewhere), the blocks due for a recount."""
        self._execute(txn, SQL_NOW)
        now = int(txn.fetchone()[0])
        lowest, highest = self._read_bounds(txn)
        if highest is not None and highest < cursor:
            return now, lowest, highest, [], cursor, [], []
        new_rows, upto = self._read_new(txn, cursor, highest)
        rechecked = self._read_by_id(txn, recheck)
        swept = []
        for step in plan:
            refreshed = self._read_by_id(txn, step.known)
            self._execute(txn, SQL_RANGE_COUNTS, (step.low, step.high))
            counts = Counts(*(int(value or 0) for value in txn.fetchone()))
            still_queued = sum(1 for seen in refreshed if seen.status == QUEUED)
            queued = (
                self._read_queued(txn, step.low, step.high) if counts.queued > still_queued else []
            )
            swept.append((step, refreshed, counts, queued))
        return now, lowest, highest, new_rows, upto, rechecked, swept

    def _read_candidates(
        self, txn, ids: list[int], lease_cutoff: int, fail_cutoff: int, limit: int
    ):
        rows: list = []
        for chunk in _chunks(ids):
            statement = SQL_CANDIDATES.format(ids=_marks(len(chunk)))
            self._execute(txn, statement, (*chunk, lease_cutoff, fail_cutoff, limit))
            rows.extend(txn.fetchall())
        rows.sort(key=lambda row: int(row[0]))
        answered = {int(row[0]) for row in rows}
        others = self._read_by_id(txn, [i for i in ids if i not in answered])
        return rows, others

    # -- what this process knows of the table --------------------------------

    async def _load(self) -> None:
        """The start-up pass, once (again after the table was emptied or recreated)."""
        if not self._view.loaded:
            await self._load_lock.run(lambda: Deferred.fromCoroutine(self._load_once()))

    async def _load_once(self) -> None:
        view = self._view
        if view.loaded:
            return
        if self._loading is None:
            lowest, highest = await self.db.run("load_bounds", self._read_bounds)
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
            counts, queued = await self.db.run(
                "load_range", self._read_range, loading.position, upto
            )
            view.loaded_range(counts, queued, stamp, self._pace())
            loading.position = upto
        stamp = view.stamp()
        rows, upto = await self.db.run(
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

    async def _observe(self) -> int:
        """Read what changed since the last poll into the view; returns the database clock."""
        view = self._view
        at = self._pace()
        plan = view.sweep_plan(self._sweep_steps(at))
        holes, leased = view.holes(), view.leased_elsewhere()
        stamp = view.stamp()
        try:
            now, lowest, highest, new_rows, upto, rechecked, swept = await self.db.run(
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
            await self._load()
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

    async def candidates(
        self, *, limit: int, lease: int, backoff: int, exclude_hooks: Sequence[str] = ()
    ) -> CandidateBatch:
        """Queued rows due now, oldest first; both cutoffs from one reading of the DB clock."""
        await self._load()
        view = self._view
        view.configure(lease, backoff)
        now = await self._observe()
        ids = view.take(now, limit, exclude_hooks)
        batch = CandidateBatch()
        batch.more = len(ids) >= limit
        if not ids:
            return batch
        stamp = view.stamp()
        rows, others = await self.db.run(
            "candidates", self._read_candidates, ids, now - lease, now - backoff, limit
        )
        answered = set()
        for seen in [_seen_candidate(row) for row in rows] + others:
            view.saw(seen, stamp)
            answered.add(seen.id)
        for request_id in ids:
            if request_id not in answered:
                view.gone(request_id)
        batch.extend(Candidate.from_row(row) for row in rows)
        return batch

    # -- writes --------------------------------------------------------------

    async def _rowcount(self, statement: str, params: Sequence[Any], *, description: str) -> int:
        def update(txn) -> int:
            self._execute(txn, statement, params)
            return txn.rowcount

        return await self.db.run(description, update)

    async def claim(self, candidate: Candidate) -> bool:
        """True iff this process now owns the row (exactly one row changed)."""
        try:
            won = (
                await self._rowcount(
                    SQL_CLAIM, (candidate.id, candidate.version), description="claim"
                )
                == 1
            )
        except Exception:
            self._view.changed_elsewhere(candidate.id, self._view.stamp())
            raise
        stamp = self._view.stamp()
        if won:
            self._view.claimed(candidate.id, candidate.version, stamp)
        else:
            self._view.changed_elsewhere(candidate.id, stamp)
        return won

    async def claim_many(self, candidates: Sequence[Candidate]) -> list[bool]:
        """Claim several candidates at once; for each, True iff this process now owns it.

        One transaction and one compare-and-set statement for all of them. If it
        moved every row, or none, that decides; if it moved some, it is rolled
        back, the rows are locked and read, those still at the version their
        candidate was read at are won and moved again in one statement.
        Whoever locks a row second reads the version the first one wrote, so
        every row has at most one winner.
        """
        if not candidates:
            return []
        if len(candidates) == 1:
            return [await self.claim(candidates[0])]
        try:
            won = await self.db.run("claim_batch", self._claim_rows, list(candidates))
        except Exception:
            stamp = self._view.stamp()
            for candidate in candidates:
                self._view.changed_elsewhere(candidate.id, stamp)
            raise
        stamp = self._view.stamp()
        for candidate in candidates:
            if candidate.id in won:
                self._view.claimed(candidate.id, candidate.version, stamp)
            else:
                self._view.changed_elsewhere(candidate.id, stamp)
        return [candidate.id in won for candidate in candidates]

    def _claim_rows(self, txn, candidates: list[Candidate]) -> set[int]:
        """All rows moved or none: the count says which. Some of them: roll back and
        decide under lock which ones are still at the version read."""
        self._engine.begin_atomic(txn)
        moved = self._move_versions(txn, candidates)
        if moved in (0, len(candidates)):
            self._engine.commit_atomic(txn)
            return {candidate.id for candidate in candidates} if moved else set()
        self._engine.rollback_atomic(txn)
        self._engine.begin_atomic(txn)
        current = self._lock_rows(txn, [candidate.id for candidate in candidates])
        winners = [c for c in candidates if current.get(c.id) == (QUEUED, c.version)]
        if self._move_versions(txn, winners) != len(winners):
            raise BatchConflict(f"not every one of {len(winners)} locked rows was claimed")
        self._engine.commit_atomic(txn)
        return {candidate.id for candidate in winners}

    def _lock_rows(self, txn, ids: list[int]) -> dict[int, tuple[str, int]]:
        """Status and version of each row, locked until the transaction ends."""
        statement = SQL_LOCK_ROWS.format(marks=_marks(len(ids))) + self._engine.for_update
        self._execute(txn, statement, ids)
        return {int(row[0]): (_text(row[1]), int(row[2])) for row in txn.fetchall()}

    def _move_versions(self, txn, candidates: list[Candidate]) -> int:
        """The claim's write for each row still at the version it was read at; the
        rows moved."""
        if not candidates:
            return 0
        statement = SQL_CLAIM_ROWS.format(
            marks=_marks(len(candidates)), versions=" WHEN %s THEN %s" * len(candidates)
        )
        versions = [value for c in candidates for value in (c.id, c.version)]
        self._execute(txn, statement, [c.id for c in candidates] + versions)
        return int(txn.rowcount)

    async def finish(self, candidate: Candidate, status: str, result: str, properties: str) -> int:
        """Write a delivery outcome; returns the rows changed (0: row gone)."""
        (changed,) = await self.finish_many([Outcome(candidate, status, result, properties)])
        return changed

    async def finish_many(self, outcomes: Sequence[Outcome]) -> list[int]:
        """Write several delivery outcomes in one transaction; the rows changed for
        each (0: row gone). A failure writes none of them."""
        try:
            changed = await self._write_outcomes(list(outcomes))
        except Exception:
            stamp = self._view.stamp()
            for outcome in outcomes:
                self._view.changed_elsewhere(outcome.candidate.id, stamp)
            raise
        stamp = self._view.stamp()
        for outcome, count in zip(outcomes, changed, strict=True):
            self._note_finished(outcome, count, stamp)
        return changed

    async def _write_outcomes(self, outcomes: list[Outcome]) -> list[int]:
        if not outcomes:
            return []
        if len(outcomes) == 1:
            statement, values = self._finish_statement(outcomes[0])
            return [await self._rowcount(statement, values, description="finish")]
        # Rows in id order: the order a batch claim locks them in.
        ordered = sorted(outcomes, key=lambda outcome: outcome.candidate.id)
        changed = await self.db.run("finish_batch", self._write_in_order, ordered)
        by_id = {
            outcome.candidate.id: count for outcome, count in zip(ordered, changed, strict=True)
        }
        return [by_id[outcome.candidate.id] for outcome in outcomes]

    def _write_in_order(self, txn, outcomes: list[Outcome]) -> list[int]:
        """Lock the rows, then write every row still queued in one statement; up to
        PER_ROW_WRITES rows, one statement per row costs no more round trips."""
        self._engine.begin_atomic(txn)
        if len(outcomes) <= PER_ROW_WRITES:
            changed = []
            for outcome in outcomes:
                self._execute(txn, *self._finish_statement(outcome))
                changed.append(txn.rowcount)
            self._engine.commit_atomic(txn)
            return changed
        current = self._lock_rows(txn, [outcome.candidate.id for outcome in outcomes])
        queued = [o for o in outcomes if current.get(o.candidate.id, ("", 0))[0] == QUEUED]
        self._write_rows(txn, queued)
        self._engine.commit_atomic(txn)
        written = {outcome.candidate.id for outcome in queued}
        return [int(outcome.candidate.id in written) for outcome in outcomes]

    def _write_rows(self, txn, outcomes: list[Outcome]) -> None:
        if not outcomes:
            return
        cases = " WHEN %s THEN %s" * len(outcomes)
        statement = SQL_FINISH_ROWS.format(
            statuses=cases, results=cases, documents=cases, marks=_marks(len(outcomes))
        )
        values: list[Any] = []
        for column in ("status", "result", "properties"):
            values += [v for o in outcomes for v in (o.candidate.id, getattr(o, column))]
        values += [outcome.candidate.id for outcome in outcomes]
        self._execute(txn, statement, values)
        if txn.rowcount != len(outcomes):
            raise BatchConflict(f"{txn.rowcount} of {len(outcomes)} locked rows written")

    @staticmethod
    def _finish_statement(outcome: Outcome) -> tuple[str, tuple[Any, ...]]:
        values = (outcome.status, outcome.result, outcome.properties, outcome.candidate.id)
        return SQL_FINISH, values

    def _note_finished(self, outcome: Outcome, changed: int, stamp: int) -> None:
        candidate = outcome.candidate
        if changed:
            self._view.finished(
                candidate.id, candidate.version, outcome.status, outcome.result, stamp
            )
        else:
            self._view.changed_elsewhere(candidate.id, stamp)

    async def retire(self, candidate: Candidate, properties: str) -> int:
        """Configuration failure: failed / none / 0, only over the version read."""
        try:
            changed = await self._rowcount(
                SQL_RETIRE, (properties, candidate.id, candidate.version), description="retire"
            )
        except Exception:
            self._view.changed_elsewhere(candidate.id, self._view.stamp())
            raise
        if changed:
            self._view.finished(
                candidate.id, candidate.version, FAILED, RESULT_NONE, self._view.stamp()
            )
        else:
            self._view.changed_elsewhere(candidate.id, self._view.stamp())
        return changed

    # -- Retry-After holds ------------------------------------------------------

    async def hold(self, candidate: Candidate, delay: float) -> int | None:
        """After a failed attempt left the row queued: do not offer it again
        before ``delay`` seconds after that attempt (the database's second of
        the write). Returns the second held until, or None when the row is due
        no earlier anyway (or is no longer ours)."""
        stamp = self._view.stamp()
        rows = await self.db.run("hold", self._read_by_id, [candidate.id])
        seen = rows[0] if rows else None
        if seen is None or seen.status != QUEUED or seen.result != RESULT_FAIL:
            return None
        not_before = seen.epoch + int(math.ceil(delay))
        return not_before if self._view.hold(seen, not_before, stamp) else None

    async def renew_holds(self) -> list[int]:
        """Renew the leases of held rows that need it; returns the ids whose row
        someone else changed meanwhile (the hold is dropped)."""
        due = self._view.renewals(self._view.now)
        if not due:
            return self._view.lost_holds()

        def renew(txn) -> tuple[list[int], list[Seen]]:
            changed = []
            for request_id, version in due:
                self._execute(txn, SQL_RENEW_HOLD, (request_id, version))
                if txn.rowcount == 1:
                    changed.append(request_id)
            return changed, self._read_by_id(txn, changed)

        changed, rows = await self.db.run("renew_holds", renew)
        stamp = self._view.stamp()  # an own write is stamped when it has completed
        versions = {seen.id: seen.modified for seen in rows}
        for request_id, _ in due:
            if request_id in versions:
                self._view.renewed(request_id, versions[request_id], stamp)
            else:
                self._view.hold_lost(request_id, stamp)
        return self._view.lost_holds()

    def held_until(self, request_id: int) -> int | None:
        return self._view.held_until(request_id)

    # -- hooks, breaker, diagnostics -----------------------------------------

    async def load_hooks(self, phids: Sequence[str]) -> dict[str, Hook]:
        """The hooks of one batch of candidates, by PHID; a missing hook is absent."""
        if not phids:
            return {}

        def select(txn) -> dict[str, Hook]:
            statement = SQL_HOOKS.format(marks=_marks(len(phids)))
            self._execute(txn, statement, [phid.encode("utf-8") for phid in phids])
            hooks = (
                Hook(
                    id=int(row[0]),
                    phid=_text(row[1]),
                    name=_text(row[2]),
                    uri=_text(row[3]),
                    status=_text(row[4]),
                    hmac_key=_text(row[5]),
                )
                for row in txn.fetchall()
            )
            return {hook.phid: hook for hook in hooks}

        return await self.db.run("hooks", select)

    async def _count(self, statement: str, params: Sequence[Any] = (), *, description: str) -> int:
        def select(txn) -> int:
            self._execute(txn, statement, params)
            return int(txn.fetchone()[0])

        return await self.db.run(description, select)

    async def recent_failures(self, hook_phid: str, window: int) -> int:
        return await self._count(
            SQL_BREAKER_COUNT, (hook_phid.encode("utf-8"), window), description="recent_failures"
        )

    async def queued_for_hook(self, hook_phid: str) -> int:
        """Queued rows of the hook as this process knows them (no query: no index serves it)."""
        await self._load()
        return self._view.queued_for_hook(hook_phid)

    async def stats(self) -> Stats:
        """Status counts as of the last poll (docs/webhook.md, "HTTP API"); hooks counted live."""
        await self._load()
        active_hooks = await self._count(SQL_ACTIVE_HOOKS, description="active_hooks")
        counts = self._view.counts()
        return Stats(
            queued=counts.queued, sent=counts.sent, failed=counts.failed, active_hooks=active_hooks
        )

    async def hook_total(self) -> int:
        return await self._count(SQL_HOOK_TOTAL, description="hook_total")

    # -- the delivery log and replays ------------------------------------------

    async def list_requests(
        self,
        *,
        limit: int,
        cursor: int | None = None,
        hook: str | None = None,
        status: str | None = None,
        result: str | None = None,
        since: int | None = None,
        window: int = LIST_WINDOW,
        budget: int = LIST_BUDGET,
    ) -> RequestPage:
        """Requests newest first, filtered; at most ``budget`` ids are read per call."""
        filters = {"hook": hook, "status": status, "result": result, "since": since}
        used = [(name, value) for name, value in filters.items() if value is not None]
        statement = SQL_LIST_WINDOW.format(filters="".join(LIST_FILTERS[n] for n, _ in used))
        values = [
            value.encode("utf-8") if isinstance(value, str) and name == "hook" else value
            for name, value in used
        ]

        def scan(txn) -> RequestPage:
            lowest, highest = self._read_bounds(txn)
            if lowest is None or highest is None:
                return RequestPage([], None)
            floor = lowest
            if since is not None:
                # Commit order is not id order: rows up to a minute older than
                # ``since`` may carry higher ids (docs/webhook.md, Polling).
                self._execute(txn, SQL_FIRST_ID_SINCE, (max(since - SINCE_SLACK, 0),))
                first = txn.fetchone()
                if first is None:
                    return RequestPage([], None)
                floor = max(floor, int(first[0]))
            upper = highest + 1 if cursor is None else min(cursor, highest + 1)
            rows: list[RequestRow] = []
            read = 0
            while upper > floor and read < budget:
                low = max(floor, upper - window, upper - (budget - read))
                wanted = limit - len(rows)
                self._execute(txn, statement, (upper, low, *values, wanted))
                found = [RequestRow.from_row(row) for row in txn.fetchall()]
                rows.extend(found)
                if len(found) == wanted:
                    return RequestPage(rows, found[-1].id if found[-1].id > floor else None)
                read += upper - low
                upper = low
            return RequestPage(rows, upper if upper > floor else None)

        return await self.db.run("list_requests", scan)

    def _read_request(self, txn, request: int | str) -> RequestRow | None:
        if isinstance(request, int):
            self._execute(txn, SQL_REQUEST_BY_ID, (request,))
        else:
            self._execute(txn, SQL_REQUEST_BY_PHID, (request.encode("utf-8"),))
        row = txn.fetchone()
        return None if row is None else RequestRow.from_row(row)

    async def request(self, request: int | str) -> RequestRow | None:
        """One request by id or PHID."""
        return await self.db.run("request", self._read_request, request)

    def _replay_rows(self, txn, rows: list[RequestRow]) -> tuple[list[Replay], list[RequestRow]]:
        replayed, skipped = [], []
        for row in rows:
            self._execute(txn, SQL_REPLAY, (row.id, row.status, row.date_modified))
            if txn.rowcount == 1:
                after = self._read_request(txn, row.id)
                if after is not None:
                    replayed.append(Replay(before=row, after=after))
                    continue
            skipped.append(row)
        return replayed, skipped

    def _requeued(self, replays: list[Replay], stamp: int) -> None:
        for replay in replays:
            self._view.requeued(replay.after.seen(), replay.before.status, stamp)

    async def replay(self, request: int | str) -> Replay | None:
        """Put a sent or failed request back in the queue; None when there is no
        such request. Raises NotReplayable for a queued one."""
        await self._load()

        def replay(txn) -> tuple[RequestRow | None, list[Replay]]:
            row = self._read_request(txn, request)
            if row is None or row.status not in (SENT, FAILED):
                return row, []
            replayed, skipped = self._replay_rows(txn, [row])
            return (self._read_request(txn, row.id) if skipped else row), replayed

        row, replayed = await self.db.run("replay", replay)
        if replayed:
            # This process offers the row at its next poll (docs/webhook.md).
            self._requeued(replayed, self._view.stamp())
            return replayed[0]
        if row is None:
            return None
        raise NotReplayable(row)

    async def replay_range(
        self,
        *,
        hook: str,
        since: int,
        until: int,
        statuses: Sequence[str],
        after_id: int = 0,
        limit: int = 1000,
    ) -> RangeReplay:
        """Replay a hook's finished requests created in ``since <= dateCreated < until``,
        oldest first, at most ``limit`` per call, from ``after_id`` on."""
        await self._load()
        statement = SQL_REPLAY_RANGE.format(statuses=_marks(len(statuses)))

        def replay(txn) -> tuple[list[Replay], list[RequestRow], bool]:
            self._execute(
                txn, statement, (hook.encode("utf-8"), since, until, *statuses, after_id, limit + 1)
            )
            rows = [RequestRow.from_row(row) for row in txn.fetchall()]
            more = len(rows) > limit
            replayed, skipped = self._replay_rows(txn, rows[:limit])
            return replayed, skipped, more

        replayed, skipped, more = await self.db.run("replay_range", replay)
        self._requeued(replayed, self._view.stamp())
        last = max([r.before.id for r in replayed] + [r.id for r in skipped], default=after_id)
        return RangeReplay(replayed=replayed, skipped=skipped, next_after_id=last if more else None)

    async def hook_states(self, window: int) -> list[HookState]:
        """Every hook, with its failures in the breaker window (the breaker's own
        count) and the queued rows this process knows of."""
        await self._load()

        def read(txn) -> list[tuple[str, str, str, int]]:
            self._execute(txn, SQL_HOOK_LIST)
            hooks = [(_text(r[0]), _text(r[1]), _text(r[2])) for r in txn.fetchall()]
            counted = []
            for phid, name, status in hooks:
                self._execute(txn, SQL_BREAKER_COUNT, (phid.encode("utf-8"), window))
                counted.append((phid, name, status, int(txn.fetchone()[0])))
            return counted

        return [
            HookState(
                phid=phid,
                name=name,
                status=status,
                failures=failures,
                queued=self._view.queued_for_hook(phid),
            )
            for phid, name, status, failures in await self.db.run("hook_states", read)
        ]

    async def ping(self) -> str | None:
        """None when the database answers, else a short reason for ``/readyz``."""
        return await self.db.ping()

    def close(self) -> None:
        self.db.close()
