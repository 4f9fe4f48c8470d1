"""The last error of each task that failed: what a worker said when it
reported the failure, for the operator (``GET /api/queue/failures``, the
gorge console's tasks page).

Phorge's task tables keep a failure count and time but no error text, and
the queue never alters them, so the text is kept here, in this process:
bounded in number and in age, the oldest note going first, and gone when
the process restarts (docs/taskqueue.md, Last errors). A task that completes
drops its note: it is no longer failing.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from twisted.internet.interfaces import IReactorTime

#: Notes kept at most; at the worker's 1,000 characters a message, a few MB.
MAX_NOTES = 10_000
#: A note older than this is dropped: a week covers a weekend's failures.
MAX_AGE_SECONDS = 7 * 24 * 3600.0
#: Characters of a message kept (gorge-worker sends at most 1,000).
MAX_MESSAGE_CHARS = 1000


@dataclass(frozen=True)
class FailureNote:
    task_id: int
    task_class: str
    message: str
    permanent: bool
    at: float  # this host's clock when the failure was recorded

    def to_json(self) -> dict:
        return {
            "taskID": self.task_id,
            "taskClass": self.task_class,
            "message": self.message,
            "permanent": self.permanent,
            "failedAt": int(self.at),
        }


class FailureNotes:
    """Each task's last failure note, newest last."""

    def __init__(
        self,
        clock: IReactorTime,
        *,
        max_notes: int = MAX_NOTES,
        max_age: float = MAX_AGE_SECONDS,
    ) -> None:
        self._clock = clock
        self._max_notes = max_notes
        self._max_age = max_age
        self._notes: OrderedDict[int, FailureNote] = OrderedDict()

    def __len__(self) -> int:
        self._expire()
        return len(self._notes)

    def note(self, task_id: int, task_class: str, message: str, permanent: bool) -> None:
        """A failure the store recorded: it replaces the task's earlier note."""
        self._notes.pop(task_id, None)
        self._notes[task_id] = FailureNote(
            task_id, task_class, message[:MAX_MESSAGE_CHARS], permanent, self._clock.seconds()
        )
        while len(self._notes) > self._max_notes:
            self._notes.popitem(last=False)
        self._expire()

    def forget(self, task_id: int) -> None:
        """The task completed: its failures are over."""
        self._notes.pop(task_id, None)

    def last(self, task_id: int) -> FailureNote | None:
        self._expire()
        return self._notes.get(task_id)

    def recent(
        self, limit: int, *, task_ids: frozenset[int] | None = None, permanent: bool | None = None
    ) -> list[FailureNote]:
        """The newest notes first, at most ``limit``; only ``task_ids`` and
        only permanent (or temporary) failures when given."""
        self._expire()
        out: list[FailureNote] = []
        for note in reversed(self._notes.values()):
            if task_ids is not None and note.task_id not in task_ids:
                continue
            if permanent is not None and note.permanent != permanent:
                continue
            out.append(note)
            if len(out) >= limit:
                break
        return out

    def _expire(self) -> None:
        horizon = self._clock.seconds() - self._max_age
        while self._notes:
            oldest = next(iter(self._notes.values()))
            if oldest.at >= horizon:
                break
            self._notes.popitem(last=False)
