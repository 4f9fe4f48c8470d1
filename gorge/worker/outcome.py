"""What a handler can say about a task, and how that becomes a queue report.

These mirror PHP's PhabricatorWorkerPermanentFailureException,
PhabricatorWorkerYieldException and a plain exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MIN_YIELD_SECONDS = 5


class PermanentFailure(Exception):
    """The task will never succeed: archive it with result 1."""


class Yield(Exception):
    """Try again later; not a failure and no failure count."""

    def __init__(self, seconds: int, message: str = "") -> None:
        super().__init__(message or f"yield for {seconds}s")
        self.seconds = seconds


class NotReached(Exception):
    """The task never got to run: what runs it was not reached (Phorge's
    web server took no call). Not a failure: the lease goes back with no
    failure counted, as a yield does (docs/worker.md, When Phorge's web
    server is down)."""


class RetryLater(Exception):
    """A temporary failure whose retry wait the handler chooses."""

    def __init__(self, message: str, retry_wait: int | None = None) -> None:
        super().__init__(message)
        self.retry_wait = retry_wait


@dataclass(frozen=True)
class Completed:
    """What a handler may return on success: the follow-up tasks the queue
    must enqueue when (and only when) it archives this one, atomically
    (the wire shape of ``/api/queue/complete``'s ``followups``)."""

    followups: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class Outcome:
    """A classified handler result; ``kind`` names the report to send."""

    kind: str  # "complete" | "permanent" | "temporary" | "yield"
    message: str = ""
    retry_wait: int | None = None
    yield_seconds: int = MIN_YIELD_SECONDS
    followups: tuple[Mapping[str, Any], ...] = ()
    # False for a yield that hands back a task which never ran (NotReached).
    reached: bool = True

    @property
    def metric_label(self) -> str:
        return {
            "complete": "completed",
            "permanent": "failed_permanent",
            "temporary": "failed_temporary",
            "yield": "yielded",
        }[self.kind]


def _cause_chain(exc: BaseException):
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def classify(exc: BaseException | None) -> Outcome:
    """Map a handler's exception (None = it returned) to an outcome.

    Wrapped exceptions are classified by the nearest outcome type in the
    cause chain, like the reference's error unwrapping.
    """
    if exc is None:
        return Outcome("complete")
    for link in _cause_chain(exc):
        if isinstance(link, NotReached):
            return Outcome("yield", message=str(exc), reached=False)
        if isinstance(link, PermanentFailure):
            return Outcome("permanent", message=str(exc))
        if isinstance(link, Yield):
            return Outcome(
                "yield", message=str(exc), yield_seconds=max(int(link.seconds), MIN_YIELD_SECONDS)
            )
        if isinstance(link, RetryLater):
            return Outcome("temporary", message=str(exc), retry_wait=link.retry_wait)
    return Outcome("temporary", message=str(exc) or type(exc).__name__)
