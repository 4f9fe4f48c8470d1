"""The queued rows one gorge-webhook process knows of, and when each is due.

Part of the queue view (gorge/webhook/queueview.py), which decides what to
remember; this keeps it in the shapes the dispatcher asks for:

* each row with the database second from which the candidate query would
  return it (its lease, its retry backoff, a Retry-After hold);
* per hook, the rows due now in id order, merged oldest first into the
  candidates; the rows not due yet in a heap by the second they become due;
* the rows under another process's lease, re-read on every poll, and per
  hook the oldest of them on its first attempt, which the hook's later rows
  wait behind (one POST in flight per hook, in id order);
* the Retry-After holds of this process and when their leases need renewing.

It does no I/O.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from gorge.webhook.rows import QUEUED, RESULT_FAIL


class Seen(NamedTuple):
    """The columns that decide whether and when a row is a candidate."""

    id: int
    hook: str
    status: str
    result: str
    epoch: int
    created: int
    modified: int


@dataclass
class QueuedRow:
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


class QueuedRows:
    """The queued rows remembered, in id order, per hook and by due time."""

    def __init__(self) -> None:
        self.lease: int | None = None
        self.backoff: int | None = None
        self.reset()

    def reset(self) -> None:
        """Forget every row; the windows (lease, backoff) stay."""
        self.now = 0  # the latest database second seen
        self._rows: dict[int, QueuedRow] = {}
        self._ids: list[int] = []  # the keys of _rows, sorted
        self._due: dict[str, list[int]] = {}  # per hook, sorted
        self._waiting: list[tuple[int, int]] = []  # (due_at, id), lazily cleaned
        self._per_hook: Counter[str] = Counter()
        self._leased: set[int] = set()  # under another process's lease: re-read every poll
        self._holds: set[int] = set()  # held rows whose lease may still need renewing
        self._lost: list[int] = []  # held rows another writer changed, not reported yet

    # -- what is known ------------------------------------------------------

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._rows

    def get(self, request_id: int) -> QueuedRow | None:
        return self._rows.get(request_id)

    def ids(self) -> list[int]:
        """Every known id, in order (a copy: rows may be removed while it is walked)."""
        return list(self._ids)

    def ids_below(self, lowest: int) -> list[int]:
        return self._ids[: bisect.bisect_left(self._ids, lowest)]

    def ids_between(self, low: int, high: int) -> tuple[int, ...]:
        """The known ids ``low < id <= high``."""
        return tuple(
            self._ids[bisect.bisect_right(self._ids, low) : bisect.bisect_right(self._ids, high)]
        )

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

    def leased_elsewhere(self) -> list[int]:
        """Rows another process claimed and has not finished: re-read on every poll, so
        its outcome (or its death) is seen at once rather than after the lease."""
        return sorted(self._leased)

    def held_until(self, request_id: int) -> int | None:
        """The Retry-After time this process holds the row until, if it does."""
        row = self._rows.get(request_id)
        return row.not_before if row is not None and row.not_before > self.now else None

    # -- the candidates -----------------------------------------------------

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

    # -- rows coming and going ----------------------------------------------

    def add(self, seen: Seen) -> None:
        row = QueuedRow(
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

    def refresh(self, seen: Seen) -> None:
        """A known row read again, still queued."""
        row = self._rows[seen.id]
        if row.not_before and seen.modified != row.modified:
            # Written by someone else since our last write: our hold is over.
            row.not_before = 0
            self._holds.discard(seen.id)
            self._lost.append(seen.id)
        row.created, row.modified = seen.created, seen.modified
        row.result, row.epoch, row.stale = seen.result, seen.epoch, False
        self._place(seen.id, row)

    def remove(self, request_id: int) -> None:
        row = self._rows.pop(request_id)
        self._leased.discard(request_id)
        self._holds.discard(request_id)
        del self._ids[bisect.bisect_left(self._ids, request_id)]
        if row.in_due:
            self._drop_due(request_id, row)
        self._per_hook[row.hook] -= 1
        if self._per_hook[row.hook] <= 0:
            del self._per_hook[row.hook]

    # -- this process's own writes ------------------------------------------

    def wrote(self, request_id: int, stamp: int) -> None:
        """This process's write to the row completed at ``stamp``."""
        self._rows[request_id].written = stamp

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

    def attempt_written(self, request_id: int, version: int, result: str, stamp: int) -> None:
        """Our outcome write (claimed at ``version``) left the row queued, to be tried again."""
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

    # -- when a row is due ----------------------------------------------------

    def _due_at(self, row: QueuedRow) -> int:
        """The first database second at which the candidate query would return the row."""
        if row.stale or self.lease is None or self.backoff is None:
            return 0
        at = 0
        if row.modified != row.created:  # touched since insert: under the lease
            at = row.modified + self.lease
        if row.result == RESULT_FAIL:
            at = max(at, row.epoch + self.backoff)
        return max(at, row.not_before)

    def _place(self, request_id: int, row: QueuedRow) -> None:
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

    def _add_due(self, request_id: int, row: QueuedRow) -> None:
        line = self._due.setdefault(row.hook, [])
        if not line or request_id > line[-1]:
            line.append(request_id)
        else:
            bisect.insort(line, request_id)
        row.in_due = True

    def _drop_due(self, request_id: int, row: QueuedRow) -> None:
        line = self._due[row.hook]
        del line[bisect.bisect_left(line, request_id)]
        if not line:
            del self._due[row.hook]
        row.in_due = False
