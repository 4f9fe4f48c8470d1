"""The Redis queue's key layout, and its rows as the scripts exchange them.

Key layout, ``B`` being the key base derived from the prefix
(:func:`key_base`):

* ``B task:{id}`` hash, ``B data:{dataID}`` string, ``B archived:{id}`` hash;
* ``B idx:active`` / ``B idx:unleased`` (score = priority),
  ``B idx:leased`` (score = leaseExpires), ``B idx:archived``
  (score = archivedEpoch);
* ``B next_task_id``, ``B next_data_id``, ``B counter:archived``,
  ``B counter:failed``.

The prefix is used verbatim (``gorge:tq:task:17``), as in the reference, so
an existing single-instance queue keeps its keys.  On a Redis Cluster
the operator picks a prefix that is a hash tag (``{gorge:tq}:``): every key of
the queue then lies in one slot, and every script declares at least one key
so the Cluster can route it.

One deliberate departure from the reference layout:

* Index members are ids zero-padded to 20 digits and the score of
  ``idx:active``/``idx:unleased`` is the bare priority: Redis orders equal
  scores by member, so ``priority ASC, id ASC`` holds exactly for every
  unsigned 32-bit priority, where the reference's ``priority * 10^12 + id``
  double loses FIFO order above priority ~9000.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gorge.taskqueue.model import Followup, Task, task_from_columns

DEFAULT_KEY_PREFIX = "gorge:tq:"
MEMBER_WIDTH = 20


def hash_tag(key: str) -> str | None:
    """The part of ``key`` Redis Cluster hashes when it has a tag, else None.

    Redis' rule: the text between the first ``{`` and the first ``}`` after it,
    when that text is non-empty.
    """
    start = key.find("{")
    if start < 0:
        return None
    end = key.find("}", start + 1)
    if end <= start + 1:
        return None
    return key[start + 1 : end]


def key_base(prefix: str) -> str:
    """The string every key of this queue starts with: the prefix itself.

    Raises ValueError for a prefix whose first ``{`` does not open a non-empty
    tag closed inside the prefix: the operator meant a Cluster hash tag, but
    the keys' slot would then depend on the suffix and a script's keys could
    land on different Cluster nodes.
    """
    if "{" not in prefix:
        return prefix
    if hash_tag(prefix) is None:
        raise ValueError("the first '{' must open a non-empty hash tag closed by '}'")
    return prefix


def member(task_id: int) -> str:
    """Sorted-set member for an id: fixed width so equal scores sort by id."""
    return f"{task_id:0{MEMBER_WIDTH}d}"


class Keys:
    """Names of one queue's keys."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.base = key_base(prefix)
        b = self.base
        self.active = b + "idx:active"
        self.unleased = b + "idx:unleased"
        self.leased = b + "idx:leased"
        self.archived_idx = b + "idx:archived"
        self.next_task_id = b + "next_task_id"
        self.next_data_id = b + "next_data_id"
        self.counter_archived = b + "counter:archived"
        self.counter_failed = b + "counter:failed"

    def task(self, task_id: int) -> str:
        return f"{self.base}task:{task_id}"

    def data(self, data_id: int) -> str:
        return f"{self.base}data:{data_id}"

    def archived(self, task_id: int) -> str:
        return f"{self.base}archived:{task_id}"

    def migrated(self, ledger: str) -> str:
        """The watermark of a migration into this queue (docs/taskqueue.md)."""
        return f"{self.base}migrated:{ledger}"


# ensure_ascii off: the text goes to Redis as the same UTF-8 it would have as
# separate arguments.
pack = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def task_of(doc: dict[str, Any]) -> Task:
    """A task row decoded from a script's JSON, ``data`` being the payload if loaded."""
    payload = doc.pop("data", None)
    return task_from_columns(doc, payload)


def followup_fields(followup: Followup) -> list[str]:
    """A follow-up as the archive step takes it (lua/parts/followups.lua)."""
    request = followup.enqueue
    return [
        request.task_class,
        "" if followup.inherits_priority else str(request.priority),
        request.object_phid or "",
        request.container_phid or "",
        "" if request.delay_until is None else str(request.delay_until),
        request.data,
    ]


def children_of(
    followups: Sequence[Followup], parent_priority: int, ids: Sequence[Sequence[str]], now: int
) -> tuple[Task, ...]:
    """The tasks the archive step inserted for ``followups`` under ``ids``."""
    return tuple(
        followup.request(parent_priority).new_task(int(task_id), int(data_id), now)
        for followup, (task_id, data_id) in zip(followups, ids, strict=True)
    )
