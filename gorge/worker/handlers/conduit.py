"""The Conduit delegate: hand a task back to Phorge's PHP via worker.execute
and turn its answer into an outcome."""

from __future__ import annotations

from typing import Any, TypeGuard

from gorge.log.logger import Logger
from gorge.worker.conduit import ConduitClient, ConduitError, ConduitNotReached
from gorge.worker.outcome import (
    MIN_YIELD_SECONDS,
    Completed,
    NotReached,
    PermanentFailure,
    RetryLater,
    Yield,
)
from gorge.worker.registry import is_php_class_name

log = Logger()


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def interpret_result(task_id: int, task_class: str, result: Any) -> None:
    """Return for success, raise the outcome otherwise."""
    if result is not None and not isinstance(result, dict):
        raise RetryLater(
            f"decode worker.execute result for {task_class} (id={task_id}): "
            f"expected an object, got {type(result).__name__}"
        )
    kind = result.get("result") if isinstance(result, dict) else None
    reason = result.get("failureReason", "") if isinstance(result, dict) else ""
    retry = result.get("retry") if isinstance(result, dict) else None
    if kind == "success":
        return
    if kind == "yield":
        seconds = retry if _is_int(retry) else MIN_YIELD_SECONDS
        raise Yield(max(seconds, MIN_YIELD_SECONDS), f"{task_class} yielded")
    if kind == "permanent-failure":
        raise PermanentFailure(f"{task_class} permanently failed: {reason}")
    if kind == "failure":
        wait = retry if _is_int(retry) and retry >= 0 else None
        raise RetryLater(f"{task_class} failed: {reason}", retry_wait=wait)
    shown = kind if isinstance(kind, str) else ("" if kind is None else str(kind))
    raise RetryLater(
        f'worker.execute for {task_class} (id={task_id}) returned unexpected result "{shown}"'
    )


#: The most follow-ups one success report may carry (the taskqueue's limit).
MAX_FOLLOWUPS = 1000


def parse_followups(task_class: str, task_id: int, answer: dict) -> tuple[dict, ...]:
    """The answer's follow-ups, checked for shape (the queue checks the rest)."""
    raw = answer.get("followups", [])
    if not isinstance(raw, list) or not all(isinstance(item, dict) for item in raw):
        raise RetryLater(
            f"php executor answered unreadable followups for {task_class} (id={task_id})"
        )
    if len(raw) > MAX_FOLLOWUPS:
        # The queue would refuse the report, and the task would run again
        # and again to the same end: fail it for good, saying why.
        raise PermanentFailure(
            f"{task_class} (id={task_id}) queued {len(raw)} follow-up tasks, more than the "
            f"{MAX_FOLLOWUPS} one report can carry"
        )
    return tuple(raw)


class ConduitDelegate:
    def __init__(self, client: ConduitClient, metrics=None) -> None:
        self._client = client
        self._metrics = metrics

    def _count(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.conduit_calls.labels(result=result).inc()

    async def __call__(self, task: dict, data: str | None) -> Completed:
        task_id, task_class = task["id"], task["taskClass"]
        if not is_php_class_name(task_class):
            raise PermanentFailure("invalid task class")
        try:
            result = await self._client.execute(task_id, task_class, data)
        except ConduitNotReached as exc:
            # PHP never saw the call: the task did nothing, so it costs the
            # task nothing either.
            self._count("error")
            raise NotReached(
                f"conduit worker.execute for {task_class} (id={task_id}) not reached: {exc}"
            ) from exc
        except ConduitError as exc:
            self._count("error")
            raise RetryLater(
                f"conduit worker.execute for {task_class} (id={task_id}): {exc}"
            ) from exc
        self._count("success")
        interpret_result(task_id, task_class, result)
        # A library before follow-ups were handed back queued them itself
        # and answers without the key: nothing to enqueue then.
        return Completed(followups=parse_followups(task_class, task_id, result))
