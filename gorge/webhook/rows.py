"""The words of ``herald_webhookrequest`` and the helpers every statement of ours binds with.

Phorge writes these status and result strings; gorge-webhook compares with
them and writes them back, so they are spelt once, here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

QUEUED, SENT, FAILED = "queued", "sent", "failed"
RESULT_NONE, RESULT_OKAY, RESULT_FAIL = "none", "okay", "fail"

IDS_PER_STATEMENT = 500  # SQLite's old limit is 999 bound parameters


def text(value: Any) -> str:
    """A column as text: PHIDs are binary columns, read back as bytes by the driver."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return "" if value is None else str(value)


def chunks(ids: Sequence[int]) -> Iterable[Sequence[int]]:
    """The ids in slices of at most IDS_PER_STATEMENT, for ``IN (...)`` lists."""
    for start in range(0, len(ids), IDS_PER_STATEMENT):
        yield ids[start : start + IDS_PER_STATEMENT]


def marks(n: int) -> str:
    """``n`` placeholders for an ``IN (...)`` list: values are always bound, never spliced."""
    return ", ".join(["%s"] * n)
