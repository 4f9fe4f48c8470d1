"""How long the oldest waiting task has waited, per task class and priority band.

A task is waiting when a lease call could hand it out now: never leased
(``leaseOwner`` and ``leaseExpires`` NULL), or its lease, yield or retry
wait ran out (``leaseExpires < now``). It has waited since it was created,
or since its ``leaseExpires`` passed if that came later (a retried task's
``leaseExpires`` is 0, as Phorge's unarchive writes it): a task failing and retrying starts
waiting again from its retry time, as a job a queue re-enqueues does.

Reading the whole backlog on every stats loop would cost as much as the
backlog is long, so every backend reads the heads of the queue only, the
way a lease call reads them (docs/taskqueue.md, "Queue age"):

* for each priority holding never-leased tasks (at most
  :data:`MAX_PRIORITIES`), its first :data:`HEAD_ROWS` tasks in id order;
* the first :data:`HEAD_ROWS` tasks whose ``leaseExpires`` passed, oldest
  expiry first.

Within a priority, ids grow with creation, so the head holds the oldest
task of the priority and of every class in its first rows; a class whose
first task lies deeper has waited less than the head's last row, and is
left out rather than reported younger than it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gorge.taskqueue.model import (
    PRIORITY_ALERTS,
    PRIORITY_BULK,
    PRIORITY_COMMIT,
    PRIORITY_DEFAULT,
    PRIORITY_IMPORT,
    PRIORITY_INDEX,
)

HEAD_ROWS = 1000
MAX_PRIORITIES = 64

# PhabricatorWorker's priorities, lowest (runs first) to highest; a priority
# between two belongs to the lower one's band, one below 1000 to "alerts".
BANDS = (
    (PRIORITY_ALERTS, "alerts"),
    (PRIORITY_DEFAULT, "default"),
    (PRIORITY_COMMIT, "commit"),
    (PRIORITY_BULK, "bulk"),
    (PRIORITY_INDEX, "index"),
    (PRIORITY_IMPORT, "import"),
)
BAND_NAMES = tuple(name for _, name in BANDS)


def priority_band(priority: int) -> str:
    """The name of the band ``priority`` falls in."""
    name = BANDS[0][1]
    for start, band in BANDS:
        if priority < start:
            break
        name = band
    return name


@dataclass(frozen=True)
class Waiting:
    """One reading: ``now`` in the store's clock, and per (class, band) the
    time its oldest waiting task has waited since."""

    now: int
    since: dict[tuple[str, str], int] = field(default_factory=dict)

    def ages(self) -> dict[tuple[str, str], int]:
        """Seconds waited per (class, band); never negative (a row stamped by a
        host whose clock runs ahead has just arrived)."""
        return {key: max(self.now - since, 0) for key, since in self.since.items()}

    def to_json(self) -> list[dict[str, Any]]:
        """``oldestWaiting`` of ``GET /api/queue/stats``: oldest first."""
        ages = self.ages()
        return [
            {"taskClass": task_class, "priorityBand": band, "ageSeconds": age}
            for (task_class, band), age in sorted(
                ages.items(), key=lambda item: (-item[1], item[0])
            )
        ]


def oldest_waiting(now: int, heads: Iterable[tuple[str, int, int]]) -> Waiting:
    """The reading from head rows, each ``(taskClass, priority, waiting since)``."""
    since: dict[tuple[str, str], int] = {}
    for task_class, priority, started in heads:
        key = (task_class, priority_band(int(priority)))
        started = int(started)
        if key not in since or started < since[key]:
            since[key] = started
    return Waiting(now=now, since=since)
