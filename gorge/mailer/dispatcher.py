"""Walk the backends in priority order until one answers.

``Dispatcher.start(message, mailer_keys)`` returns a :class:`Dispatch`
whose ``result`` fires with an :class:`Answer` (never errbacks) and whose
``cancel(reason)`` stops it: the dispatch deadline, a client disconnect and
the shutdown drain all come through there. A cancelled attempt is
classified by the backend, so cancellation still yields a
classified answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import LogLevel

from gorge.log.logger import Logger
from gorge.mailer.backends.base import Backend
from gorge.mailer.message import Message
from gorge.mailer.metrics import MailerMetrics
from gorge.mailer.outcome import Kind, Outcome

log = Logger()

MESSAGE_LIMIT = 2048
#: mailerKeys names only mailers this daemon does not have.
UNKNOWN_MAILER = "ERR_UNKNOWN_MAILER"


@dataclass(frozen=True)
class Answer:
    """The final answer of a send: HTTP status, error code (``None``
    on success), text, and on success the accepting key and message id."""

    status: int
    code: str | None
    message: str = ""
    mailer_key: str = ""
    message_id: str = ""

    @property
    def result(self) -> str:
        """The ``result`` label of ``gorge_mailer_sends_total``."""
        return {
            None: "accepted",
            "ERR_PERMANENT_FAILURE": "permanent",
            "ERR_OUTCOME_UNKNOWN": "unknown",
        }.get(self.code, "send_failed")


def _cap(text: str) -> str:
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


def order_backends(backends: Sequence[Backend]) -> list[Backend]:
    """Descending effective priority; ties keep declaration order."""
    return sorted(backends, key=lambda b: -b.priority)


def send_failed(message: str) -> Answer:
    return Answer(502, "ERR_SEND_FAILED", _cap(message))


def _final_answer(backend: Backend, outcome: Outcome, attempt: int) -> Answer | None:
    """The answer an outcome settles the send with, whatever is left to
    try; None when another attempt or backend may still succeed."""
    kind = outcome.kind
    if kind is Kind.ACCEPTED:
        log.info(
            "MAILER_SENT mailer={mailer} type={type} attempt={attempt}",
            mailer=backend.key,
            type=backend.type,
            attempt=attempt,
        )
        return Answer(200, None, mailer_key=backend.key, message_id=outcome.message_id)
    if kind is Kind.REJECTED_MESSAGE:
        return Answer(
            422,
            "ERR_PERMANENT_FAILURE",
            _cap(f"{backend.key} ({backend.type}): {outcome.cause}"),
            mailer_key=backend.key,
        )
    if kind is Kind.UNKNOWN:
        return Answer(
            502,
            "ERR_OUTCOME_UNKNOWN",
            _cap(f"{backend.key} ({backend.type}): outcome unknown: {outcome.cause}"),
            mailer_key=backend.key,
        )
    return None


def _all_failed(last: tuple[Backend, Outcome], finals: list[Kind]) -> Answer:
    """Every candidate failed: permanent only when each one's last outcome
    rejected the message without naming a scope."""
    backend, outcome = last
    text = f"all mailers failed, last error: {backend.key} ({backend.type}): {outcome.cause}"
    if finals and all(k is Kind.REJECTED_UNSCOPED for k in finals):
        return Answer(422, "ERR_PERMANENT_FAILURE", _cap(text))
    return send_failed(text)


class Dispatch:
    """One running send; see the module docstring."""

    def __init__(self, dispatcher: Dispatcher, message: Message, candidates: list[Backend]) -> None:
        self._dispatcher = dispatcher
        self._message = message
        self._candidates = candidates
        self._current: Deferred | None = None
        self.cancelled: str | None = None
        clock = dispatcher.clock
        self.deadline = clock.seconds() + dispatcher.send_timeout
        self._timer = clock.callLater(dispatcher.send_timeout, self.cancel, "deadline reached")
        self.result: Deferred = Deferred.fromCoroutine(self._run())

    def cancel(self, reason: str) -> None:
        """Stop the dispatch; the first reason wins. Idempotent."""
        if self.cancelled is not None or self.result.called:
            return
        self.cancelled = reason
        if self._current is not None and not self._current.called:
            self._current.cancel()

    async def _run(self) -> Answer:
        try:
            answer = await self._walk()
        except Exception:
            # A bug here must still produce an answer the client can act on
            # safely; we cannot tell whether a backend accepted the message.
            log.failure("MAILER_DISPATCH_FAILED", level=LogLevel.error)
            answer = Answer(502, "ERR_OUTCOME_UNKNOWN", "dispatch failed unexpectedly")
        finally:
            if self._timer.active():
                self._timer.cancel()
        metrics = self._dispatcher.metrics
        metrics.sends.labels(answer.mailer_key or "none", answer.result).inc()
        return answer

    async def _walk(self) -> Answer:
        """Each candidate in turn, each with its retries, until one answers
        for good, the dispatch is stopped, or all have failed."""
        d = self._dispatcher
        last: tuple[Backend, Outcome] | None = None
        finals: list[Kind] = []  # the last outcome of each finished backend
        for index, backend in enumerate(self._candidates):
            if index > 0:
                d.metrics.failovers.inc()
            attempt = 0
            while True:
                if self.cancelled is None and d.clock.seconds() >= self.deadline:
                    self.cancelled = "deadline reached"  # the timer may not have run yet
                if self.cancelled is not None:
                    return self._stopped(last)
                attempt += 1
                outcome = await self._attempt(backend, attempt)
                last = (backend, outcome)
                final = _final_answer(backend, outcome, attempt)
                if final is not None:
                    return final
                if self.cancelled is not None:
                    return self._stopped(last)
                wait = self._retry_wait(outcome, attempt)
                if wait is None:
                    finals.append(outcome.kind)
                    break
                if wait > 0 and not await self._pause(wait):
                    return self._stopped(last)
        assert last is not None
        return _all_failed(last, finals)

    def _retry_wait(self, outcome: Outcome, attempt: int) -> float | None:
        """Seconds before the same backend is tried again; None fails over."""
        d = self._dispatcher
        if outcome.kind is not Kind.TRANSIENT or attempt > d.max_retries:
            return None
        wait = d.retry_wait
        if outcome.retry_after is not None:
            wait = max(wait, outcome.retry_after)
            if d.clock.seconds() + wait > self.deadline:
                return None  # fail over instead of waiting past the deadline
        return wait

    async def _pause(self, wait: float) -> bool:
        """Wait between attempts; False when the dispatch was cancelled."""
        self._current = deferLater(self._dispatcher.clock, wait)
        try:
            await self._current
        except CancelledError:
            return False
        finally:
            self._current = None
        return True

    def _stopped(self, last: tuple[Backend, Outcome] | None) -> Answer:
        text = f"send stopped: {self.cancelled}"
        if last is not None:
            backend, outcome = last
            text += f", last error: {backend.key} ({backend.type}): {outcome.cause}"
        log.warn("MAILER_SEND_STOPPED reason={reason}", reason=self.cancelled)
        return send_failed(text)

    async def _attempt(self, backend: Backend, attempt: int) -> Outcome:
        d = self._dispatcher
        started = d.clock.seconds()
        self._current = Deferred.fromCoroutine(backend.send(self._message, deadline=self.deadline))
        try:
            outcome = await self._current
        except CancelledError:
            outcome = Outcome.unknown(f"{backend.type}: attempt cancelled ({self.cancelled})")
        except Exception as e:
            log.failure(
                "MAILER_BACKEND_CRASHED mailer={mailer} type={type}",
                level=LogLevel.error,
                mailer=backend.key,
                type=backend.type,
            )
            outcome = Outcome.unknown(f"{backend.type}: internal error ({type(e).__name__})")
        finally:
            self._current = None
        if not isinstance(outcome, Outcome):
            outcome = Outcome.unknown(f"{backend.type}: backend returned no outcome")
        d.metrics.attempts.labels(backend.key, outcome.label).inc()
        d.metrics.duration.labels(backend.key).observe(max(0.0, d.clock.seconds() - started))
        if not outcome.is_accepted:
            log.warn(
                "MAILER_SEND_FAILED mailer={mailer} type={type} attempt={attempt} "
                "outcome={outcome} cause={cause}",
                mailer=backend.key,
                type=backend.type,
                attempt=attempt,
                outcome=outcome.label,
                cause=outcome.cause,
            )
        return outcome


class Dispatcher:
    def __init__(
        self,
        backends: Sequence[Backend],
        *,
        clock: IReactorTime,
        metrics: MailerMetrics,
        max_retries: int = 2,
        retry_wait: float = 2.0,
        send_timeout: float = 25.0,
    ) -> None:
        self.backends = order_backends(backends)
        self.clock = clock
        self.metrics = metrics
        self.max_retries = max_retries
        self.retry_wait = retry_wait
        self.send_timeout = send_timeout

    def candidates(self, mailer_keys: Sequence[str] | None) -> list[Backend]:
        """The backends to try, in priority order, narrowed by exact key."""
        if not mailer_keys:
            return list(self.backends)
        wanted = set(mailer_keys)
        return [b for b in self.backends if b.key in wanted]

    def refusal(self, mailer_keys: Sequence[str] | None = None) -> Answer | None:
        """The immediate answer when there is nothing to try, else None."""
        if not self.backends:
            return send_failed("no mailers configured")
        if not self.candidates(mailer_keys):
            # The caller's request names nothing this daemon has: asking
            # again cannot help, so not ERR_SEND_FAILED, which invites a retry.
            shown = ", ".join(k[:64] for k in list(mailer_keys or ())[:20])
            return Answer(
                422,
                UNKNOWN_MAILER,
                f"mailerKeys names no configured mailer: [{shown}]; use keys that "
                "GET /api/mailer/mailers lists, or leave mailerKeys out to use any",
            )
        return None

    def start(
        self, message: Message, mailer_keys: Sequence[str] | None = None
    ) -> Dispatch | Answer:
        """A running :class:`Dispatch`, or an immediate :class:`Answer` when
        there is nothing to try."""
        refused = self.refusal(mailer_keys)
        if refused is not None:
            return refused
        return Dispatch(self, message, self.candidates(mailer_keys))
