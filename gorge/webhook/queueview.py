"""What one gorge-webhook process knows of ``herald_webhookrequest``.

Phorge's schema has no index on ``status``, so "which rows are queued" can
only be answered cheaply by remembering it. This object is that memory; the
store (gorge/webhook/observation.py) issues the reads it asks for and feeds their
answers back. It does no I/O. The design is explained for operators in
docs/webhook.md, "Polling":

* every id up to ``cursor`` has been looked at; ids above it are new and are
  read as a primary-key range;
* ids missing below the cursor when it moved (an insert not committed yet:
  auto-increment ids are handed out before commit) are "holes", looked up
  again by id for ``hole_seconds``;
* every queued row seen is remembered, with the database second from which
  it is due (lease, retry backoff), and re-read by id once due;
* the table is recounted one block of ids at a time (the "sweep"), which keeps
  the sent/failed counts and finds rows put back to ``queued`` by something
  that is not a gorge-webhook (or a commit later than the hole window).

A row whose receiver answered ``Retry-After`` is "held" by this process
until the time asked for: it is not offered before then, and while the hold
lasts longer than the lease the store renews the row's lease (the claim
statement again), so other replicas leave it alone too
(docs/webhook.md, "Retry-After and 410 Gone").

Observations can arrive out of order with this process's own writes (a read
issued before a claim may be answered after it). Each read is stamped when
issued, each own write when it completed; a read older than the last own
write to a row says nothing new about that row and is ignored.

This module holds the cursor, the holes, the tombstones of rows this process
finished, and the rules above; the queued rows and when each is due are kept
by gorge/webhook/queuedrows.py, the counts and the sweep's plan by
gorge/webhook/recount.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from gorge.webhook.queuedrows import QueuedRows, Seen
from gorge.webhook.recount import BlockCounts, Counts, SweepStep, block_of
from gorge.webhook.rows import QUEUED

HOLE_SECONDS = 60.0  # how long a missing id is looked for
MAX_HOLES = 2000  # beyond this the oldest holes are left to the sweep
MAX_GAP = 100  # a wider jump in ids (bulk reservations) is left to the sweep
TOMBSTONE_SECONDS = 300.0


class QueueView:
    def __init__(self, *, hole_seconds: float = HOLE_SECONDS, max_holes: int = MAX_HOLES) -> None:
        self._hole_seconds = hole_seconds
        self._max_holes = max_holes
        self._stamps = itertools.count(1)
        self._queued = QueuedRows()
        self.reset()

    def reset(self) -> None:
        """Forget everything (the table was emptied or recreated): load again."""
        self.loaded = False
        self.loaded_upto = 0
        self.cursor = 0
        self._at = 0.0  # the latest pacing-clock reading seen (holes, tombstones)
        self._queued.reset()
        self._recount = BlockCounts()
        self._holes: dict[int, float] = {}
        self._tombstones: dict[int, tuple[int, float]] = {}

    @property
    def now(self) -> int:
        """The latest database second seen."""
        return self._queued.now

    @property
    def lease(self) -> int | None:
        return self._queued.lease

    @property
    def backoff(self) -> int | None:
        return self._queued.backoff

    # -- reading the view --------------------------------------------------

    def stamp(self) -> int:
        """A stamp for a read about to be issued, or a write just completed."""
        return next(self._stamps)

    def counts(self) -> Counts:
        return Counts(len(self._queued), self._recount.sent, self._recount.failed)

    def queued_for_hook(self, hook: str) -> int:
        return self._queued.queued_for_hook(hook)

    def oldest_queued(self) -> dict[str, int]:
        """Per hook with queued rows, how long its oldest has been in the table."""
        return self._queued.oldest_queued()

    def knows(self, request_id: int) -> bool:
        return request_id in self._queued

    def known(self) -> list[int]:
        """The ids of every queued row remembered, in order."""
        return self._queued.ids()

    def holes(self) -> list[int]:
        return sorted(self._holes)

    def leased_elsewhere(self) -> list[int]:
        """Rows another process claimed and has not finished (re-read every poll)."""
        return self._queued.leased_elsewhere()

    def held_until(self, request_id: int) -> int | None:
        """The Retry-After time this process holds the row until, if it does."""
        return self._queued.held_until(request_id)

    def configure(self, lease: int, backoff: int) -> None:
        """The windows that decide when a row is due; changing them re-plans every row."""
        self._queued.configure(lease, backoff)

    def take(self, now: int, limit: int, exclude: Iterable[str] = ()) -> list[int]:
        """The ``limit`` oldest rows due at ``now`` whose hook is not excluded."""
        return self._queued.take(now, limit, exclude)

    def first_in_flight_elsewhere(self) -> dict[str, int]:
        """Per hook, the oldest row under another process's claim for its first attempt."""
        return self._queued.first_in_flight_elsewhere()

    # -- observations ------------------------------------------------------

    def saw(self, seen: Seen, stamp: int, *, count_finished: bool = False) -> None:
        """A row as a read issued at ``stamp`` found it.

        ``count_finished``: a finished row not known before is added to the
        counts (true only for ids read for the first time: new ids, holes).
        """
        row = self._queued.get(seen.id)
        if row is not None:
            if stamp < row.written:
                return  # issued before our own last write: we know better
            if seen.status != QUEUED:
                self._queued.remove(seen.id)
                self._recount.count(seen.id, seen.status, 1)
                return
            self._queued.refresh(seen)
            return
        tomb = self._tombstones.get(seen.id)
        if tomb is not None and stamp < tomb[0]:
            return
        if seen.status == QUEUED:
            self._queued.add(seen)
        elif count_finished:
            self._recount.count(seen.id, seen.status, 1)

    def gone(self, request_id: int) -> None:
        """Asked for by id, not found: deleted (Phorge's garbage collector, a destroyed hook)."""
        if request_id in self._queued:
            self._queued.remove(request_id)

    # -- this process's own writes ------------------------------------------

    def claimed(self, request_id: int, version: int, stamp: int) -> None:
        """We won the claim: the version moved to at least ``version + 1``."""
        self._queued.claimed(request_id, version, stamp)

    def changed_elsewhere(self, request_id: int, stamp: int) -> None:
        """A conditional write of ours matched nothing: re-read the row on the next poll."""
        self._queued.changed_elsewhere(request_id, stamp)

    def finished(self, request_id: int, version: int, status: str, result: str, stamp: int) -> None:
        """Our outcome write changed the row (claimed at ``version``)."""
        if status != QUEUED:
            if request_id in self._queued:
                self._queued.remove(request_id)
            self._recount.count(request_id, status, 1)
            self._tombstones[request_id] = (stamp, self._at)
            return
        self._queued.attempt_written(request_id, version, result, stamp)

    def requeued(self, seen: Seen, previous: str, stamp: int) -> None:
        """Our replay put a finished row back to queued; ``seen`` is read back after it.

        The row is offered at the next poll. A read issued before the replay
        (it would still say "sent") is ignored, like any read older than our
        own last write.
        """
        self._tombstones.pop(seen.id, None)
        if seen.id not in self._queued:
            if seen.id <= self.cursor and seen.id not in self._holes:
                self._recount.count(seen.id, previous, -1)  # it was counted as finished
            self._queued.add(seen)
        else:
            self.saw(seen, stamp)
        self._queued.wrote(seen.id, stamp)

    # -- Retry-After holds ----------------------------------------------------

    def hold(self, seen: Seen, not_before: int, stamp: int) -> bool:
        """Our outcome write left the row as ``seen`` and the receiver asked us not
        to come back before ``not_before``. False: nothing to hold."""
        return self._queued.hold(seen, not_before, stamp)

    def renewals(self, now: int) -> list[tuple[int, int]]:
        """``(id, version)`` of the held rows whose lease must be renewed now."""
        return self._queued.renewals(now)

    def renewed(self, request_id: int, version: int, stamp: int) -> None:
        """Our renewal moved the row's version (read back after it) to ``version``."""
        self._queued.renewed(request_id, version, stamp)

    def hold_lost(self, request_id: int, stamp: int) -> None:
        """A renewal matched nothing: someone else took or changed the row."""
        self._queued.hold_lost(request_id, stamp)

    def lost_holds(self) -> list[int]:
        """Held rows found changed by another writer since the last call."""
        return self._queued.lost_holds()

    # -- moving the cursor, holes -----------------------------------------

    def scanned(self, rows: list[Seen], upto: int, stamp: int, at: float) -> None:
        """The new ids ``cursor < id <= upto`` as read (rows in id order)."""
        previous = self.cursor
        for seen in rows:
            self._holes_between(previous, seen.id, at)
            previous = seen.id
            self.saw(seen, stamp, count_finished=True)
        self._holes_between(previous, upto + 1, at)
        self.cursor = max(self.cursor, upto)

    def _holes_between(self, low: int, high: int, at: float) -> None:
        if 1 < high - low <= MAX_GAP + 1:
            for request_id in range(low + 1, high):
                self._holes[request_id] = at
            if len(self._holes) > self._max_holes:
                for request_id in sorted(self._holes, key=self._holes.__getitem__)[
                    : len(self._holes) - self._max_holes
                ]:
                    del self._holes[request_id]

    def holes_checked(self, rows: list[Seen], stamp: int, at: float) -> None:
        """The answer for the holes looked up again; expired holes are dropped."""
        self._at = max(self._at, at)
        for seen in rows:
            since = self._holes.pop(seen.id, None)
            if since is None:
                continue
            # A block recounted after the hole appeared may already hold the row.
            recounted = self._recount.counted_at(block_of(seen.id)) > since
            self.saw(seen, stamp, count_finished=not recounted)
        for request_id in [
            i for i, since in self._holes.items() if at - since >= self._hole_seconds
        ]:
            del self._holes[request_id]

    def bounds(self, lowest: int | None, highest: int | None, at: float) -> bool:
        """Smallest and largest id in the table now. False: ids went backwards, reload."""
        self._at = max(self._at, at)
        if highest is not None and highest < self.cursor:
            return False
        for request_id in [
            i for i, (_, when) in self._tombstones.items() if at - when >= TOMBSTONE_SECONDS
        ]:
            del self._tombstones[request_id]
        if lowest is None:  # empty: every id seen so far is gone
            for request_id in self._queued.ids():
                self._queued.remove(request_id)
            self._recount.drop_all()
            return True
        # Holes below the lowest row stay: an id handed out before the oldest
        # committed row may still commit (they expire like any hole).
        for request_id in self._queued.ids_below(lowest):
            self._queued.remove(request_id)
        self._recount.forget_below(block_of(lowest))
        return True

    # -- loading and sweeping ----------------------------------------------

    def loaded_range(
        self, counts: dict[int, Counts], queued: list[Seen], stamp: int, at: float
    ) -> None:
        """Part of the start-up pass: per-block counts and the queued rows of a range."""
        for block, block_counts in counts.items():
            self._recount.set_block(block, block_counts, at)
        for seen in queued:
            self.saw(seen, stamp)

    def finish_load(self, cursor: int, lowest: int | None) -> None:
        self.loaded_upto = cursor  # ids up to here were counted, not watched for late commits
        self.cursor = cursor
        self._recount.start(block_of(lowest) if lowest else 0)
        self.loaded = True

    def sweep_plan(self, steps: int) -> list[SweepStep]:
        """Blocks to recount now: any pending one, then ``steps`` more from the lowest
        block up to the cursor's, round and round."""
        return self._recount.plan(steps, self.cursor, self._queued.ids_between)

    def sweep_rewind(self, plan: list[SweepStep]) -> None:
        """The planned recounts were not read (database error): do them next time."""
        self._recount.rewind(plan)

    def swept(
        self,
        step: SweepStep,
        refreshed: list[Seen],
        counts: Counts,
        queued: list[Seen],
        stamp: int,
        at: float,
    ) -> int:
        """A recounted block. Returns how many queued rows it held that we did not know."""
        answered = {seen.id for seen in refreshed}
        for seen in refreshed:
            self.saw(seen, stamp)
        for request_id in step.known:
            if request_id not in answered:
                self.gone(request_id)
        self._recount.set_block(step.block, counts, at)
        found = 0
        for seen in queued:
            if seen.id not in self._queued:
                self.saw(seen, stamp)
                found += seen.id in self._queued
        return found
