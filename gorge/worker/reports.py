"""Result reports that finish close together go to the queue in one call
(docs/worker.md, Batched reports).

A finished task's report waits up to ``delay`` seconds for others, then all
of them (at most ``max_size``) go out as one ``POST /api/queue/report``,
which the queue records in one transaction. Each report keeps its own
Deferred and its own answer, so the consumer's retry rules still apply task
by task. A queue that has no such route (an older gorge-taskqueue answers
404) gets single calls from then on.

A success may carry follow-up tasks, whose size has no bound but the
queue's request body limit: a batch carries at most ``max_bytes`` of them
(a report whose own follow-ups are larger goes alone), and a batch the
queue still finds too large (413: a lower ``GORGE_BODY_LIMIT`` there) is
sent again as single calls.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import LogLevel
from twisted.python.failure import Failure

from gorge.log.logger import Logger
from gorge.worker.queueerror import QueueError

log = Logger()

REPORT_PATH = "/api/queue/report"
#: Bytes of follow-ups (encoded) one batched call carries at most: half of
#: the queue's default request body limit (``GORGE_BODY_LIMIT``, 2 MiB), the
#: other half being room for up to 1000 plain reports around them.
FOLLOWUP_BATCH_BYTES = 1024 * 1024

_encoder = json.JSONEncoder(separators=(",", ":"))

# What a refused entry would have been answered as a single call.
_STATUS_OF_CODE = {"ERR_NOT_FOUND": 404, "ERR_LEASE_CONFLICT": 409, "ERR_BAD_REQUEST": 400}

PostBatch = Callable[[list[dict], float], Awaitable[Any]]
Single = Callable[[float], Coroutine[Any, Any, None]]


@dataclass
class _Pending:
    entry: dict
    deadline: float
    single: Single
    done: Deferred
    size: int  # bytes of the entry's follow-ups, 0 without


def _followup_bytes(entry: dict) -> int:
    followups = entry.get("followups")
    return len(_encoder.encode(followups)) if followups else 0


class ReportBatcher:
    """Coalesces reports into batched calls; see the module docstring.

    ``post`` sends one batch (the entries and a timeout) and answers the
    call's ``data``; it raises :class:`QueueError` as a single call would.
    """

    def __init__(
        self,
        post: PostBatch,
        clock: IReactorTime,
        *,
        max_size: int,
        delay: float,
        max_bytes: int = FOLLOWUP_BATCH_BYTES,
    ) -> None:
        self._post = post
        self._clock = clock
        self._max_size = max_size
        self._delay = delay
        self._max_bytes = max_bytes
        self._pending: list[_Pending] = []
        self._pending_bytes = 0
        self._timer: IDelayedCall | None = None
        self.enabled = max_size > 1

    def submit(self, entry: dict, timeout: float, single: Single) -> Deferred:
        """Report ``entry`` within ``timeout`` seconds; ``single`` is the
        one-task call to fall back on. Fires with None once the queue recorded
        it, fails with :class:`QueueError` as the single call would."""
        if not self.enabled:
            return Deferred.fromCoroutine(single(timeout))
        item = _Pending(
            entry,
            self._clock.seconds() + timeout,
            single,
            Deferred(lambda d: self._withdraw(item)),
            _followup_bytes(entry),
        )
        self._pending.append(item)
        self._pending_bytes += item.size
        if len(self._pending) >= self._max_size or self._pending_bytes >= self._max_bytes:
            self._flush()
        elif self._timer is None:
            self._timer = self._clock.callLater(self._delay, self._flush)
        return item.done

    def _withdraw(self, item: _Pending) -> None:
        # Cancelled before it was sent: it must not be sent at all.
        if item in self._pending:
            self._pending.remove(item)
            self._pending_bytes -= item.size

    def _flush(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        while self._pending:
            batch = self._next_batch()
            d = Deferred.fromCoroutine(self._send(batch))
            d.addErrback(
                lambda f: log.failure("WORKER_REPORT_BATCH_FAILED", f, level=LogLevel.error)
            )

    def _next_batch(self) -> list[_Pending]:
        """The oldest pending reports, as many as ``max_size`` allows and
        as their follow-ups fit in ``max_bytes``; always at least one."""
        count, size = 0, 0
        for item in self._pending[: self._max_size]:
            if count and size + item.size > self._max_bytes:
                break
            count, size = count + 1, size + item.size
        batch = self._pending[:count]
        del self._pending[:count]
        self._pending_bytes -= size
        return batch

    async def _send(self, batch: list[_Pending]) -> None:
        if not self.enabled:
            self._send_each(batch)
            return
        now = self._clock.seconds()
        timeout = max(0.0, min(item.deadline for item in batch) - now)
        try:
            data = await self._post([item.entry for item in batch], timeout)
        except QueueError as exc:
            if exc.status == 404 and exc.code == "ERR_NOT_FOUND" and not exc.transient:
                self._fall_back(str(exc))
                self._send_each(batch)
                return
            if exc.status == 413 and len(batch) > 1:
                # The queue's body limit is below what the batch was cut
                # to: each report alone may well fit.
                self._send_each(batch)
                return
            for item in batch:
                _settle(item, Failure(exc))
            return
        answers = _answers(data, batch)
        for item, answer in zip(batch, answers, strict=True):
            _settle(item, answer)

    def _send_each(self, batch: list[_Pending]) -> None:
        now = self._clock.seconds()
        for item in batch:
            self._settle_with(item, item.single(max(0.0, item.deadline - now)))

    def _fall_back(self, error: str) -> None:
        if self.enabled:
            self.enabled = False
            log.warn("WORKER_REPORT_BATCHING_DISABLED error={error}", error=error)

    def _settle_with(self, item: _Pending, single: Coroutine[Any, Any, None]) -> None:
        d: Deferred[None] = Deferred.fromCoroutine(single)
        d.addBoth(lambda result: _settle(item, result))


def _settle(item: _Pending, result: Any) -> None:
    """Fire the item's Deferred unless its caller has cancelled it."""
    if item.done.called:
        if isinstance(result, Failure) and not result.check(CancelledError, QueueError):
            log.failure("WORKER_REPORT_FAILED_AFTER_CANCEL", result, level=LogLevel.error)
        return
    item.done.callback(result)


def _answers(data: Any, batch: list[_Pending]) -> list[Any]:
    """Per item: None when the queue recorded it, else the Failure of a
    :class:`QueueError` its single call would have raised."""
    if not isinstance(data, list) or len(data) != len(batch):
        error = QueueError(
            f"unmarshal (status 200): {REPORT_PATH} answered no list with one answer per report",
            status=200,
            transient=True,
        )
        return [Failure(error)] * len(batch)
    out: list[Any] = []
    for item, answer in zip(batch, data, strict=True):
        if not isinstance(answer, dict) or answer.get("taskID") != item.entry["taskID"]:
            out.append(
                Failure(
                    QueueError(
                        f"unmarshal (status 200): {REPORT_PATH} answered out of order",
                        status=200,
                        transient=True,
                    )
                )
            )
        elif answer.get("status") == "reported":
            out.append(None)
        else:
            code, message = str(answer.get("code", "")), str(answer.get("message", ""))
            out.append(
                Failure(
                    QueueError(
                        f"api error [{code}]: {message}",
                        status=_STATUS_OF_CODE.get(code, 400),
                        code=code,
                    )
                )
            )
    return out
