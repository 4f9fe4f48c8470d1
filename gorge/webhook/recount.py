"""The sent and failed counts of ``herald_webhookrequest``, per block of ids,
and the plan of the background recount (the "sweep") that keeps them true.

Part of the queue view (gorge/webhook/queueview.py). Finished rows are
counted in the block their id falls in, so a block recounted from the table
replaces its own figures and nothing else, and the blocks below the lowest
id still in the table (Phorge's garbage collector deleted them) are dropped
whole. The sweep recounts one block at a time, from the lowest block up to
the cursor's and round again; a block whose recount could not be read, or
the lowest one once rows below it went, is recounted first next time.
It does no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from gorge.webhook.rows import FAILED, SENT

BLOCK = 500  # ids per counted block, and per sweep step


def block_of(request_id: int) -> int:
    """Block ``b`` holds the ids ``b * BLOCK + 1 … (b + 1) * BLOCK``."""
    return (request_id - 1) // BLOCK


class Counts(NamedTuple):
    queued: int
    sent: int
    failed: int


class SweepStep(NamedTuple):
    """One block to recount: ids ``low < id <= high``, and the queued rows we know there."""

    block: int
    low: int
    high: int
    known: tuple[int, ...]


@dataclass
class _Block:
    sent: int = 0
    failed: int = 0
    counted_at: float = float("-inf")


class BlockCounts:
    """Finished rows counted per block, their totals, and where the sweep is."""

    def __init__(self) -> None:
        self.sent = 0
        self.failed = 0
        self._blocks: dict[int, _Block] = {}
        self._sweep_block: int | None = None  # None until the start-up pass is done
        self._low_block = 0
        self._recount_first: set[int] = set()

    # -- the counts ---------------------------------------------------------

    def count(self, request_id: int, status: str, delta: int) -> None:
        """A row of ``status`` finished (``delta`` 1) or was put back (-1)."""
        block = self._blocks.setdefault(block_of(request_id), _Block())
        if status == SENT:
            block.sent += delta
            self.sent += delta
        elif status == FAILED:
            block.failed += delta
            self.failed += delta

    def set_block(self, index: int, counts: Counts, at: float) -> None:
        """A block as counted in the table at pacing-clock time ``at``."""
        block = self._blocks.setdefault(index, _Block())
        self.sent += counts.sent - block.sent
        self.failed += counts.failed - block.failed
        block.sent, block.failed, block.counted_at = counts.sent, counts.failed, at

    def counted_at(self, index: int) -> float:
        """When the block was last counted in the table (-inf: never)."""
        block = self._blocks.get(index)
        return block.counted_at if block is not None else float("-inf")

    def drop_all(self) -> None:
        """The table is empty: nothing is counted any more."""
        for index in list(self._blocks):
            self._drop_block(index)

    def forget_below(self, low_block: int) -> None:
        """The lowest id in the table is now in ``low_block``: the blocks below
        it are gone, and rows deleted from it are still counted, so it is
        recounted first."""
        if low_block > self._low_block:
            for index in [b for b in self._blocks if b < low_block]:
                self._drop_block(index)
            self._low_block = low_block
            self._recount_first.add(low_block)

    def _drop_block(self, index: int) -> None:
        block = self._blocks.pop(index)
        self.sent -= block.sent
        self.failed -= block.failed

    # -- the sweep ----------------------------------------------------------

    def start(self, low_block: int) -> None:
        """The start-up pass counted everything: sweep from ``low_block`` up."""
        self._low_block = low_block
        self._sweep_block = low_block

    def plan(
        self, steps: int, cursor: int, known: Callable[[int, int], tuple[int, ...]]
    ) -> list[SweepStep]:
        """Blocks to recount now: any pending one, then ``steps`` more from the lowest
        block up to the cursor's, round and round. ``known(low, high)``: the queued
        ids remembered in ``low < id <= high``."""
        if self._sweep_block is None or cursor == 0:
            return []

        def step(block: int) -> SweepStep:
            low, high = block * BLOCK, min((block + 1) * BLOCK, cursor)
            return SweepStep(block, low, high, known(low, high))

        last = block_of(cursor)
        plan = [step(b) for b in sorted(self._recount_first) if self._low_block <= b <= last]
        self._recount_first.clear()
        block = self._sweep_block
        for _ in range(min(steps, last - self._low_block + 1)):
            if block > last or block < self._low_block:
                block = self._low_block
            plan.append(step(block))
            block += 1
        self._sweep_block = block
        return plan

    def rewind(self, plan: list[SweepStep]) -> None:
        """The planned recounts were not read (database error): do them next time."""
        self._recount_first.update(step.block for step in plan)
