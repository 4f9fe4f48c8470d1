"""Native emulation of Phorge's PhabricatorTestWorker, for
the demo and benchmarks without PHP."""

from __future__ import annotations

import json
import math
from typing import Any

from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

from gorge.worker.outcome import PermanentFailure, RetryLater

TASK_CLASS = "PhabricatorTestWorker"


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _seconds(value: Any) -> float | None:
    """PHP multiplies ``duration`` by 10^6 for usleep, so fractions and
    numeric strings are waits too."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


class TestWorker:
    __test__ = False  # not a pytest class

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock

    async def __call__(self, task: dict, data: str | None) -> None:
        try:
            payload = json.loads(data) if data else {}
        except (ValueError, RecursionError):  # too deep is as broken as bad syntax
            raise PermanentFailure("invalid task data: not JSON") from None
        if not isinstance(payload, dict):
            payload = {}
        maximum = _int(payload.get("getMaximumRetryCount"))
        if maximum is not None and int(task.get("failureCount") or 0) > maximum:
            raise PermanentFailure(f"task has exceeded its maximum retry count ({maximum})")
        duration = _seconds(payload.get("duration"))
        if duration is not None and duration > 0:
            await deferLater(self._clock, duration)
        action = payload.get("doWork")
        if action == "fail-temporary":
            raise RetryLater(
                "temporary failure requested", retry_wait=_int(payload.get("getWaitBeforeRetry"))
            )
        if action == "fail-permanent":
            raise PermanentFailure("permanent failure requested")
