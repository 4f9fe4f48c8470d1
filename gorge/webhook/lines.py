"""The per-hook lines a tick's candidates wait in, and which hooks the slots are working.

A slot only starts a candidate whose hook is idle, so a slow or broken hook
never holds more than one slot. A hook stays busy while any of its rows is
in process: until its row's result is written, and while the slot that posts
it has already taken the hook's next row to claim ahead
(:meth:`HookLines.take_following`). So its rows go out one at a time and in
order. Each tick replaces the lines with fresh candidates; rows not started
by then are simply read again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from gorge.webhook.claims import Candidate
from gorge.webhook.observation import Hook


class HookLines:
    """The last tick's candidates by hook, oldest first, with the hooks' rows.

    Lines only ever hold rows that were not in process when the tick read
    them, and a row leaves its line when a slot takes it.
    """

    def __init__(self, on_idle: Callable[[str], None] | None = None) -> None:
        """``on_idle(hook)``: the hook has no row in process any more (its lock goes)."""
        self._on_idle = on_idle
        self._lines: dict[str, deque[Candidate]] = {}
        self._hooks: dict[str, Hook] = {}
        # Rows in process per hook: a hook is busy while it has any.
        self._busy: dict[str, int] = {}
        self._in_process: set[int] = set()

    def replace(self, rows: Iterable[Candidate], hooks: dict[str, Hook]) -> None:
        """A tick's candidates and the hooks it looked up for them, together: every
        candidate a slot takes from a line finds its hook's row here. A hook
        with a row in process keeps the row it was checked against while the
        tick has none of its rows (they may all be in process, or wait behind
        another process's claim): the slot's next row of it still finds it."""
        kept = {phid: self._hooks[phid] for phid in self._busy if phid in self._hooks}
        self._hooks = {**kept, **hooks}
        lines: dict[str, deque[Candidate]] = {}
        for candidate in rows:
            if candidate.id not in self._in_process:
                lines.setdefault(candidate.hook_phid, deque()).append(candidate)
        self._lines = lines

    def hook(self, phid: str) -> Hook | None:
        return self._hooks.get(phid)

    def clear(self) -> None:
        """Nothing waiting any more; the rows being worked stay marked."""
        self._lines = {}

    def drop(self, hook_phid: str) -> int:
        """Forget a hook's waiting rows (the next tick reads them again); how many."""
        return len(self._lines.pop(hook_phid, ()))

    def waiting(self) -> int:
        return sum(len(line) for line in self._lines.values())

    def take_next(self) -> Candidate | None:
        """The oldest waiting candidate of any idle hook, marked as being worked."""
        return self._take(self._next_idle())

    def take_following(self, candidate: Candidate) -> Candidate | None:
        """The next waiting row of ``candidate``'s hook, taken while ``candidate``
        is still in process (its hook stays busy until both are released): the
        slot claims it during ``candidate``'s POST and posts it after."""
        if candidate.id not in self._in_process:
            return None
        return self._take(self._next_of_hook(candidate.hook_phid))

    def continue_after(self, candidate: Candidate, *, stopping: bool) -> Candidate | None:
        """A row dealt with before its POST: the slot goes on with the next row of the
        same hook, else with the oldest row of any idle hook (none once stopping)."""
        following = None if stopping else self._next_of_hook(candidate.hook_phid)
        if following is not None:
            self._take(following)
        self.release(candidate)
        if following is None and not stopping:
            following = self._take(self._next_idle())
        return following

    def release(self, candidate: Candidate) -> None:
        """The row's result is written (or abandoned): its hook is idle again,
        unless another of its rows is in process."""
        if candidate.id not in self._in_process:
            return
        self._in_process.discard(candidate.id)
        left = self._busy.get(candidate.hook_phid, 0) - 1
        if left > 0:
            self._busy[candidate.hook_phid] = left
        else:
            self._busy.pop(candidate.hook_phid, None)
            if self._on_idle is not None:
                self._on_idle(candidate.hook_phid)

    def _next_idle(self) -> Candidate | None:
        best: deque[Candidate] | None = None
        for hook, line in self._lines.items():
            if line and hook not in self._busy and (best is None or line[0].id < best[0].id):
                best = line
        return best.popleft() if best is not None else None

    def _next_of_hook(self, hook: str) -> Candidate | None:
        line = self._lines.get(hook)
        return line.popleft() if line else None

    def _take(self, candidate: Candidate | None) -> Candidate | None:
        if candidate is not None and candidate.id not in self._in_process:
            self._busy[candidate.hook_phid] = self._busy.get(candidate.hook_phid, 0) + 1
            self._in_process.add(candidate.id)
        return candidate
