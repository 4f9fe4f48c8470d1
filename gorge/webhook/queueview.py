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
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

QUEUED, SENT, FAILED = "queued", "sent", "failed"
RESULT_FAIL = "fail"

BLOCK = 500  # ids per counted block, and per sweep step
HOLE_SECONDS = 60.0  # how long a missing id is looked for
MAX_HOLES = 2000  # beyond this the oldest holes are left to the sweep
MAX_GAP = 100  # a wider jump in ids (bulk reservations) is left to the sweep
TOMBSTONE_SECONDS = 300.0


def block_of(request_id: int) -> int:
    """Block ``b`` holds the ids ``b * BLOCK + 1 … (b + 1) * BLOCK``."""
    return (request_id - 1) // BLOCK


class Seen(NamedTuple):
    """The columns that decide whether and when a row is a candidate."""

    id: int
    hook: str
    status: str
    result: str
    epoch: int
    created: int
    modified: int


class Counts(NamedTuple):
    queued: int
    sent: int
    failed: int


@dataclass
class _Row:
    hook: str
    created: int
    modified: int
    result: str
    epoch: int
    written: int = 0  # stamp of this process's last write to the row
    ours: bool = False  # claimed by this process, outcome not written yet
    stale: bool = False  # something changed it that we cannot compute: re-read now
    due_at: int = 0
    in_due: bool = False
    not_before: int = 0  # Retry-After: not offered before this database second


@dataclass
class _Block:
    sent: int = 0
    failed: int = 0
    counted_at: float = float("-inf")


class SweepStep(NamedTuple):
    """One block to recount: ids ``low < id <= high``, and the queued rows we know there."""

    block: int
    low: int
    high: int
    known: tuple[int, ...]


class QueueView:
    def __init__(self, *, hole_seconds: float = HOLE_SECONDS, max_holes: int = MAX_HOLES) -> None:
        self._hole_seconds = hole_seconds
        self._max_holes = max_holes
        self.lease: int | None = None
        self.backoff: int | None = None
        self._stamps = itertools.count(1)
        self.reset()

    def reset(self) -> None:
        """Forget everything (the table was emptied or recreated): load again."""
        self.loaded = False
        self.loaded_upto = 0
        self.cursor = 0
        self.now = 0  # the latest database second seen
        self._at = 0.0  # the latest pacing-clock reading seen (holes, tombstones)
        self._rows: dict[int, _Row] = {}
        self._ids: list[int] = []  # the keys of _rows, sorted
        self._due: dict[str, list[int]] = {}  # per hook, sorted
        self._waiting: list[tuple[int, int]] = []  # (due_at, id), lazily cleaned
        self._per_hook: Counter[str] = Counter()
        self._leased: set[int] = set()  # under another process's lease: re-read every poll
        self._holes: dict[int, float] = {}
        self._blocks: dict[int, _Block] = {}
        self._sent = 0
        self._failed = 0
        self._tombstones: dict[int, tuple[int, float]] = {}
        self._sweep_block: int | None = None
        self._low_block = 0
        self._recount_first: set[int] = set()
        self._holds: set[int] = set()  # held rows whose lease may still need renewing
        self._lost: list[int] = []  # held rows another writer changed, not reported yet

    # -- reading the view --------------------------------------------------

    def stamp(self) -> int:
        """A stamp for a read about to be issued, or a write just completed."""
        return next(self._stamps)

    def counts(self) -> Counts:
        return Counts(len(self._rows), self._sent, self._failed)

    def queued_for_hook(self, hook: str) -> int:
        return self._per_hook.get(hook, 0)

    def oldest_queued(self) -> dict[str, int]:
        """Per hook with queued rows, how long its oldest has been in the table
        (``dateCreated`` to the latest database second seen). Ids grow with
        creation, so the walk in id order stops once every such hook is found."""
        ages: dict[str, int] = {}
        for request_id in self._ids:
            row = self._rows[request_id]
            if row.hook not in ages:
                ages[row.hook] = max(self.now - row.created, 0)
                if len(ages) == len(self._per_hook):
                    break
        return ages

    def knows(self, request_id: int) -> bool:
        return request_id in self._rows

    def holes(self) -> list[int]:
        return sorted(self._holes)

    def leased_elsewhere(self) -> list[int]:
        """Rows another process claimed and has not finished: re-read on every poll, so
        its outcome (or its death) is seen at once rather than after the lease."""
        return sorted(self._leased)

    def held_until(self, request_id: int) -> int | None:
        """The Retry-After time this process holds the row until, if it does."""
        row = self._rows.get(request_id)
        return row.not_before if row is not None and row.not_before > self.now else None

    def configure(self, lease: int, backoff: int) -> None:
        """The windows that decide when a row is due; changing them re-plans every row."""
        if (lease, backoff) == (self.lease, self.backoff):
            return
        self.lease, self.backoff = lease, backoff
        self._waiting = []
        self._due = {}
        for request_id in self._ids:
            row = self._rows[request_id]
            row.in_due = False
            self._place(request_id, row)

    def take(self, now: int, limit: int, exclude: Iterable[str] = ()) -> list[int]:
        """The ``limit`` oldest rows due at ``now`` whose hook is not excluded."""
        self.now = max(self.now, now)
        while self._waiting and self._waiting[0][0] <= self.now:
            due_at, request_id = heapq.heappop(self._waiting)
            row = self._rows.get(request_id)
            if row is not None and not row.in_due and row.due_at == due_at:
                self._add_due(request_id, row)
        excluded = set(exclude)
        ahead = self.first_in_flight_elsewhere()
        lines = []
        for hook, ids in self._due.items():
            if not ids or hook in excluded:
                continue
            first = ahead.get(hook)
            # A hook's rows go out in id order: none after a row another process
            # is posting (or died posting) until that one is written or due again.
            lines.append(ids if first is None else ids[: bisect.bisect_left(ids, first)])
        return list(itertools.islice(heapq.merge(*lines), limit))

    def first_in_flight_elsewhere(self) -> dict[str, int]:
        """Per hook, the oldest row under another process's claim for its first
        attempt (a retry's claim cannot be told from its failure write, and
        retries keep no order anyway)."""
        first: dict[str, int] = {}
        for request_id in self._leased:
            row = self._rows.get(request_id)
            if row is None or row.result == RESULT_FAIL or row.in_due or row.due_at <= self.now:
                continue  # gone, a retry, or its lease has run out: it is due itself
            if request_id < first.get(row.hook, request_id + 1):
                first[row.hook] = request_id
        return first

    # -- observations ------------------------------------------------------

    def saw(self, seen: Seen, stamp: int, *, count_finished: bool = False) -> None:
        """A row as a read issued at ``stamp`` found it.

        ``count_finished``: a finished row not known before is added to the
        counts (true only for ids read for the first time: new ids, holes).
        """
        row = self._rows.get(seen.id)
        if row is not None:
            if stamp < row.written:
                return  # issued before our own last write: we know better
            if seen.status != QUEUED:
                self._remove(seen.id)
                self._count(seen.id, seen.status, 1)
                return
            if row.not_before and seen.modified != row.modified:
                # Written by someone else since our last write: our hold is over.
                row.not_before = 0
                self._holds.discard(seen.id)
                self._lost.append(seen.id)
            row.created, row.modified = seen.created, seen.modified
            row.result, row.epoch, row.stale = seen.result, seen.epoch, False
            self._place(seen.id, row)
            return
        tomb = self._tombstones.get(seen.id)
        if tomb is not None and stamp < tomb[0]:
            return
        if seen.status == QUEUED:
            self._add(seen)
        elif count_finished:
            self._count(seen.id, seen.status, 1)

    def gone(self, request_id: int) -> None:
        """Asked for by id, not found: deleted (Phorge's garbage collector, a destroyed hook)."""
        if request_id in self._rows:
            self._remove(request_id)

    # -- this process's own writes ------------------------------------------

    def claimed(self, request_id: int, version: int, stamp: int) -> None:
        """We won the claim: the version moved to at least ``version + 1``."""
        row = self._rows.get(request_id)
        if row is None:
            return
        row.written = stamp
        row.modified = max(row.modified, version + 1)
        row.stale = False
        row.ours = True
        row.not_before = 0
        self._holds.discard(request_id)
        self._place(request_id, row)

    def changed_elsewhere(self, request_id: int, stamp: int) -> None:
        """A conditional write of ours matched nothing: re-read the row on the next poll."""
        row = self._rows.get(request_id)
        if row is None:
            return
        row.written = stamp
        row.stale = True
        row.ours = False
        row.not_before = 0
        self._holds.discard(request_id)
        self._place(request_id, row)

    def finished(self, request_id: int, version: int, status: str, result: str, stamp: int) -> None:
        """Our outcome write changed the row (claimed at ``version``)."""
        if status != QUEUED:
            if request_id in self._rows:
                self._remove(request_id)
            self._count(request_id, status, 1)
            self._tombstones[request_id] = (stamp, self._at)
            return
        row = self._rows.get(request_id)
        if row is None:
            return
        # Lower bounds of what the write stored: the claim and this write each
        # moved dateModified by at least one; the attempt happened after the read.
        row.written = stamp
        row.modified = max(row.modified, version + 2)
        row.result = result
        row.epoch = max(row.epoch, version)
        row.stale = False
        row.ours = False
        self._place(request_id, row)

    def requeued(self, seen: Seen, previous: str, stamp: int) -> None:
        """Our replay put a finished row back to queued; ``seen`` is read back after it.

        The row is offered at the next poll. A read issued before the replay
        (it would still say "sent") is ignored, like any read older than our
        own last write.
        """
        self._tombstones.pop(seen.id, None)
        if seen.id not in self._rows:
            if seen.id <= self.cursor and seen.id not in self._holes:
                self._count(seen.id, previous, -1)  # it was counted as finished
            self._add(seen)
        else:
            self.saw(seen, stamp)
        self._rows[seen.id].written = stamp

    # -- Retry-After holds ----------------------------------------------------

    def hold(self, seen: Seen, not_before: int, stamp: int) -> bool:
        """Our outcome write left the row as ``seen`` (read back after it) and the
        receiver asked us not to come back before ``not_before``. False when that
        is no later than the row is due anyway: nothing to hold."""
        row = self._rows.get(seen.id)
        if row is None or seen.status != QUEUED:
            return False
        row.written = stamp
        row.created, row.modified = seen.created, seen.modified
        row.result, row.epoch, row.stale = seen.result, seen.epoch, False
        row.not_before = 0
        if not_before <= self._due_at(row):
            self._place(seen.id, row)
            return False
        row.not_before = not_before
        self._holds.add(seen.id)
        self._place(seen.id, row)
        return True

    def renewals(self, now: int) -> list[tuple[int, int]]:
        """``(id, version)`` of the held rows whose lease must be renewed now.

        A lease is renewed once two thirds of it have passed, or at
        ``not_before - lease`` when that comes first, so the last lease runs
        out when the hold does. A hold that the current lease already covers
        needs no more renewals.
        """
        self.now = max(self.now, now)
        if self.lease is None:
            return []
        margin = max(1, self.lease // 3)
        due = []
        for request_id in sorted(self._holds):
            row = self._rows.get(request_id)
            if row is None or not row.not_before or row.modified + self.lease >= row.not_before:
                self._holds.discard(request_id)
                continue
            if self.now >= min(row.modified + self.lease - margin, row.not_before - self.lease):
                due.append((request_id, row.modified))
        return due

    def renewed(self, request_id: int, version: int, stamp: int) -> None:
        """Our renewal moved the row's version (read back after it) to ``version``."""
        row = self._rows.get(request_id)
        if row is None:
            return
        row.written = stamp
        row.modified = version
        self._place(request_id, row)

    def hold_lost(self, request_id: int, stamp: int) -> None:
        """A renewal matched nothing: someone else took or changed the row."""
        self.changed_elsewhere(request_id, stamp)
        self._lost.append(request_id)

    def lost_holds(self) -> list[int]:
        """Held rows found changed by another writer since the last call."""
        lost, self._lost = self._lost, []
        return lost

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
            block = self._blocks.get(block_of(seen.id))
            # A block recounted after the hole appeared may already hold the row.
            recounted = block is not None and block.counted_at > since
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
            for request_id in list(self._ids):
                self._remove(request_id)
            for block in list(self._blocks):
                self._drop_block(block)
            return True
        # Holes below the lowest row stay: an id handed out before the oldest
        # committed row may still commit (they expire like any hole).
        for request_id in self._ids[: bisect.bisect_left(self._ids, lowest)]:
            self._remove(request_id)
        low_block = block_of(lowest)
        if low_block > self._low_block:
            for block in [b for b in self._blocks if b < low_block]:
                self._drop_block(block)
            self._low_block = low_block
            # Rows deleted from the lowest block are still counted: recount it now.
            self._recount_first.add(low_block)
        return True

    # -- loading and sweeping ----------------------------------------------

    def loaded_range(
        self, counts: dict[int, Counts], queued: list[Seen], stamp: int, at: float
    ) -> None:
        """Part of the start-up pass: per-block counts and the queued rows of a range."""
        for block, block_counts in counts.items():
            self._set_block(block, block_counts, at)
        for seen in queued:
            self.saw(seen, stamp)

    def finish_load(self, cursor: int, lowest: int | None) -> None:
        self.loaded_upto = cursor  # ids up to here were counted, not watched for late commits
        self.cursor = cursor
        self._low_block = block_of(lowest) if lowest else 0
        self._sweep_block = self._low_block
        self.loaded = True

    def sweep_plan(self, steps: int) -> list[SweepStep]:
        """Blocks to recount now: any pending one, then ``steps`` more from the lowest
        block up to the cursor's, round and round."""
        if self._sweep_block is None or self.cursor == 0:
            return []
        last = block_of(self.cursor)
        plan = [self._step(b) for b in sorted(self._recount_first) if self._low_block <= b <= last]
        self._recount_first.clear()
        block = self._sweep_block
        for _ in range(min(steps, last - self._low_block + 1)):
            if block > last or block < self._low_block:
                block = self._low_block
            plan.append(self._step(block))
            block += 1
        self._sweep_block = block
        return plan

    def _step(self, block: int) -> SweepStep:
        low, high = block * BLOCK, min((block + 1) * BLOCK, self.cursor)
        known = self._ids[
            bisect.bisect_right(self._ids, low) : bisect.bisect_right(self._ids, high)
        ]
        return SweepStep(block, low, high, tuple(known))

    def sweep_rewind(self, plan: list[SweepStep]) -> None:
        """The planned recounts were not read (database error): do them next time."""
        self._recount_first.update(step.block for step in plan)

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
        self._set_block(step.block, counts, at)
        found = 0
        for seen in queued:
            if seen.id not in self._rows:
                self.saw(seen, stamp)
                found += seen.id in self._rows
        return found

    # -- internals ---------------------------------------------------------

    def _add(self, seen: Seen) -> None:
        row = _Row(
            hook=seen.hook,
            created=seen.created,
            modified=seen.modified,
            result=seen.result,
            epoch=seen.epoch,
        )
        self._rows[seen.id] = row
        if not self._ids or seen.id > self._ids[-1]:
            self._ids.append(seen.id)
        else:
            bisect.insort(self._ids, seen.id)
        self._per_hook[seen.hook] += 1
        self._place(seen.id, row)

    def _remove(self, request_id: int) -> None:
        row = self._rows.pop(request_id)
        self._leased.discard(request_id)
        self._holds.discard(request_id)
        del self._ids[bisect.bisect_left(self._ids, request_id)]
        if row.in_due:
            self._drop_due(request_id, row)
        self._per_hook[row.hook] -= 1
        if self._per_hook[row.hook] <= 0:
            del self._per_hook[row.hook]

    def _due_at(self, row: _Row) -> int:
        """The first database second at which the candidate query would return the row."""
        if row.stale or self.lease is None or self.backoff is None:
            return 0
        at = 0
        if row.modified != row.created:  # touched since insert: under the lease
            at = row.modified + self.lease
        if row.result == RESULT_FAIL:
            at = max(at, row.epoch + self.backoff)
        return max(at, row.not_before)

    def _place(self, request_id: int, row: _Row) -> None:
        row.due_at = self._due_at(row)
        if (
            not row.ours
            and not row.not_before
            and row.due_at > self.now
            and self.lease is not None
            and row.due_at == row.modified + self.lease
        ):
            self._leased.add(request_id)
        else:
            self._leased.discard(request_id)
        if row.due_at <= self.now:
            if not row.in_due:
                self._add_due(request_id, row)
            return
        if row.in_due:
            self._drop_due(request_id, row)
        heapq.heappush(self._waiting, (row.due_at, request_id))

    def _add_due(self, request_id: int, row: _Row) -> None:
        line = self._due.setdefault(row.hook, [])
        if not line or request_id > line[-1]:
            line.append(request_id)
        else:
            bisect.insort(line, request_id)
        row.in_due = True

    def _drop_due(self, request_id: int, row: _Row) -> None:
        line = self._due[row.hook]
        del line[bisect.bisect_left(line, request_id)]
        if not line:
            del self._due[row.hook]
        row.in_due = False

    def _count(self, request_id: int, status: str, delta: int) -> None:
        block = self._blocks.setdefault(block_of(request_id), _Block())
        if status == SENT:
            block.sent += delta
            self._sent += delta
        elif status == FAILED:
            block.failed += delta
            self._failed += delta

    def _set_block(self, index: int, counts: Counts, at: float) -> None:
        block = self._blocks.setdefault(index, _Block())
        self._sent += counts.sent - block.sent
        self._failed += counts.failed - block.failed
        block.sent, block.failed, block.counted_at = counts.sent, counts.failed, at

    def _drop_block(self, index: int) -> None:
        block = self._blocks.pop(index)
        self._sent -= block.sent
        self._failed -= block.failed
