"""``activeCount`` and ``archivedCount`` without reading whole tables.

``worker_archivetask`` keeps every finished task until Phorge's garbage
collector removes it, and ``worker_activetask`` can hold a long backlog; a
``COUNT(*)`` reads an index of the whole table on every stats call (the
metrics loop makes one every 15 s). Instead the store keeps counts per block
of 1,000 ids, taken once, and each stats read brings them up to date from
what changed since the last one (docs/taskqueue.md, "Stats"):

* new tasks: ids above the highest active id counted (a primary-key range;
  ids come from ``lisk_counter`` and only grow);
* archived tasks: archive rows written since the last read, found through
  ``key_modified`` (an archive row's ``dateModified`` is the time it was
  archived), minus the active rows they replace;
* the garbage collector: the lowest archived id moving up;
* anything else (a row deleted by hand, a task moved back from the archive or
  to another backend): one block of each table is recounted per read, round
  and round; a table whose ids span at most 10,000 is recounted whole, so
  small queues are always exact.

Every read runs in one transaction, so its statements see one snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BLOCK = 1000
LOAD_CHUNK = 10 * BLOCK  # ids counted per statement when the counts are first taken
# A table whose ids span no more than this is simply recounted on every read.
EXACT_SPAN = LOAD_CHUNK
# Archive rows are stamped with the clock of whichever host archived them.
ARCHIVE_SKEW = 120

BOUNDS = (
    "SELECT (SELECT MIN(id) FROM worker_activetask), (SELECT MAX(id) FROM worker_activetask),"
    " (SELECT MIN(id) FROM worker_archivetask), (SELECT MAX(id) FROM worker_archivetask)"
)
BLOCK_COUNTS = (
    "SELECT (id - 1) DIV " + str(BLOCK) + ", COUNT(*) FROM {table}"
    " WHERE id > %s AND id <= %s GROUP BY 1 ORDER BY NULL"
)
RECENTLY_ARCHIVED = "SELECT id, dateModified FROM worker_archivetask WHERE dateModified >= %s"

ACTIVE, ARCHIVE = "worker_activetask", "worker_archivetask"


def block_of(task_id: int) -> int:
    return (task_id - 1) // BLOCK


@dataclass
class _Table:
    blocks: dict[int, int] = field(default_factory=dict)
    next_recount: int = 0

    @property
    def total(self) -> int:
        return sum(self.blocks.values())

    def add(self, task_id: int, delta: int) -> None:
        block = block_of(task_id)
        self.blocks[block] = self.blocks.get(block, 0) + delta

    def set(self, counts: dict[int, int], low: int, high: int) -> None:
        """The counts of every block wholly inside ``low < id <= high``, as read."""
        for block in range(block_of(low + 1), block_of(high) + 1):
            self.blocks.pop(block, None)
        self.blocks.update((b, n) for b, n in counts.items() if n)

    def keep_from(self, lowest: int | None) -> None:
        if lowest is None:
            self.blocks.clear()
            return
        for block in [b for b in self.blocks if b < block_of(lowest)]:
            del self.blocks[block]

    def recount_plan(self, lowest: int | None, highest: int | None) -> list[tuple[int, int]]:
        """The id ranges to recount on this read: all of a small table; else the
        lowest block (the collector deletes from there) and the next block of the round."""
        if lowest is None or highest is None:
            return []
        low_block, high_block = block_of(lowest), block_of(highest)
        if (high_block - low_block + 1) * BLOCK <= EXACT_SPAN:
            return [(low_block * BLOCK, (high_block + 1) * BLOCK)]
        if not low_block <= self.next_recount <= high_block:
            self.next_recount = low_block
        plan = {low_block, self.next_recount}
        self.next_recount += 1
        return [(b * BLOCK, (b + 1) * BLOCK) for b in sorted(plan)]


@dataclass
class TaskCounts:
    """The two counts, and what is needed to bring them up to date."""

    active: _Table = field(default_factory=_Table)
    archive: _Table = field(default_factory=_Table)
    loaded: bool = False
    highest_active: int = 0  # every active id up to here is counted
    since: int = 0  # archive rows stamped from here on are looked at
    seen_archived: dict[int, int] = field(default_factory=dict)  # id -> dateModified

    def read(self, txn, execute, now: int) -> dict:
        """The statements of one read (in the pool thread; reads are serialised by the
        store, so this is the only code touching the counts meanwhile)."""
        execute(txn, BOUNDS)
        bounds = tuple(None if v is None else int(v) for v in txn.fetchone())
        active_low, active_high, archive_low, archive_high = bounds

        def counts(table: str, low: int, high: int) -> dict[int, int]:
            out: dict[int, int] = {}
            while low < high:
                upto = min(low + LOAD_CHUNK, high)
                execute(txn, BLOCK_COUNTS.format(table=table), (low, upto))
                out.update((int(b), int(n)) for b, n in txn.fetchall())
                low = upto
            return out

        found: dict = {"bounds": bounds, "now": now}
        if not self.loaded:
            found["active"] = counts(ACTIVE, block_of(active_low or 1) * BLOCK, active_high or 0)
            found["archive"] = counts(
                ARCHIVE, block_of(archive_low or 1) * BLOCK, archive_high or 0
            )
            since = now - ARCHIVE_SKEW
        else:
            found["new_active"] = counts(
                ACTIVE, self.highest_active, max(active_high or 0, self.highest_active)
            )
            found["active_recounts"] = [
                (low, high, counts(ACTIVE, low, high))
                for low, high in self.active.recount_plan(active_low, active_high)
            ]
            found["archive_recounts"] = [
                (low, high, counts(ARCHIVE, low, high))
                for low, high in self.archive.recount_plan(archive_low, archive_high)
            ]
            since = self.since
        execute(txn, RECENTLY_ARCHIVED, (since,))
        found["archived"] = [(int(i), int(m)) for i, m in txn.fetchall()]
        return found

    def apply(self, found: dict) -> tuple[int, int]:
        """Bring the counts up to date with one read; returns (active, archived)."""
        active_low, active_high, archive_low, _ = found["bounds"]
        now = found["now"]
        if not self.loaded:
            self.active.blocks = {b: n for b, n in found["active"].items() if n}
            self.archive.blocks = {b: n for b, n in found["archive"].items() if n}
            self.highest_active = active_high or 0
            # Already in the counts just taken: remembered so as not to count them twice.
            self.seen_archived = dict(found["archived"])
            self.loaded = True
        else:
            previous_high = self.highest_active
            for block, n in found["new_active"].items():
                self.active.blocks[block] = self.active.blocks.get(block, 0) + n
            self.highest_active = max(previous_high, active_high or 0)
            for task_id, modified in found["archived"]:
                if task_id in self.seen_archived:
                    continue
                self.seen_archived[task_id] = modified
                self.archive.add(task_id, 1)
                if task_id <= previous_high:
                    self.active.add(task_id, -1)  # it was counted active, and left
            self.active.keep_from(active_low)
            self.archive.keep_from(archive_low)
            for low, high, counts in found["active_recounts"]:
                self.active.set(counts, low, high)
            for low, high, counts in found["archive_recounts"]:
                self.archive.set(counts, low, high)
        self.since = now - ARCHIVE_SKEW
        self.seen_archived = {i: m for i, m in self.seen_archived.items() if m >= self.since}
        return max(self.active.total, 0), max(self.archive.total, 0)
