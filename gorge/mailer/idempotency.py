"""Sending once per ``Idempotency-Key`` (docs/mailer.md, "Sending once").

Phorge's adapter names each mail with a key that stays the same across
Phorge's retries. For a keyed send :class:`KeyedSends`:

* records the key before anything is handed to a backend (the fence,
  :mod:`gorge.mailer.sendrecords`), then sends, then records the answer,
  then answers;
* runs the send to its end even when the client hangs up, so a mail a
  backend accepted is recorded as accepted, not left "unknown";
* answers a key already recorded with the recorded answer, without
  sending; a key whose send is still running in this process shares that
  send's answer; one still running elsewhere (another replica) is waited
  for, within the send timeout;
* never sends again a key whose send began but has no recorded outcome
  (its process ended mid-send): once that send is older than any send can
  run, it is settled as "outcome unknown".

The answers to "still under way elsewhere" and "store unavailable" are
``ERR_SEND_FAILED``: with a key, asking again later is always safe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import LogLevel
from twisted.python.failure import Failure

from gorge.app.inflight import InFlight
from gorge.db import TransactionTimeout
from gorge.log.logger import Logger
from gorge.mailer.dispatcher import Answer, Dispatch, Dispatcher, send_failed
from gorge.mailer.message import Message
from gorge.mailer.metrics import MailerMetrics
from gorge.mailer.sendrecords import Claimed, Pending, Recorded, SendRecords, State, key_hash

log = Logger()

KEY_HEADER = b"idempotency-key"
REPLAYED_HEADER = b"idempotent-replayed"
KEY_LIMIT = 255
# A send ends by the send timeout; recording its answer may then take up to
# the store's transaction deadline (gorge.db.DEADLINE). A send older than
# both has either recorded its outcome or will never do so.
ABANDON_GRACE = 35
POLL_INTERVAL = 1.0
PRUNE_INTERVAL = 600.0

T = TypeVar("T")


class BadKey(ValueError):
    """The ``Idempotency-Key`` header cannot be used; the text says why."""


def parse_key(values: Sequence[bytes] | None) -> str | None:
    """The request's key, None without one (an empty header is none)."""
    distinct = {v for v in values or () if v != b""}
    if not distinct:
        return None
    if len(distinct) > 1:
        raise BadKey("Idempotency-Key must be given once")
    (raw,) = distinct
    if len(raw) > KEY_LIMIT or any(b < 0x21 or b > 0x7E for b in raw):
        raise BadKey(
            f"Idempotency-Key must be 1 to {KEY_LIMIT} visible ASCII characters, without spaces"
        )
    return raw.decode("ascii")


@dataclass(frozen=True)
class KeyedAnswer:
    """The answer of a keyed send; ``replayed`` when it is an earlier or a
    concurrent request's answer rather than this request's own send."""

    answer: Answer
    replayed: bool = False


def observe(d: Deferred[T]) -> Deferred[T]:
    """A Deferred that fires with ``d``'s result; cancelling it leaves ``d``
    running (the HTTP layer cancels a handler whose client hung up)."""
    observer: Deferred[T] = Deferred()

    def fire(result: T) -> T:
        if not observer.called:
            observer.callback(result)
        return result

    d.addBoth(fire)
    return observer


def _abandoned(age: int) -> Answer:
    return Answer(
        502,
        "ERR_OUTCOME_UNKNOWN",
        f"a send with this Idempotency-Key began {age} s ago and its outcome was never"
        " recorded (its process ended mid-send); a backend may have accepted it, so it"
        " is not sent again",
    )


def _in_progress(age: int) -> Answer:
    return send_failed(
        f"a send with this Idempotency-Key began {age} s ago and has no outcome yet;"
        " ask again later (it will not be sent twice)"
    )


def _log_replay(key: str, answer: Answer) -> None:
    log.info(
        "MAILER_SEND_REPLAYED key={key} code={code} mailer={mailer}",
        key=key,
        code=answer.code or "OK",
        mailer=answer.mailer_key or "none",
    )


class KeyedSends:
    """See the module doc. ``open_records`` builds the store on the first
    keyed send, so a mailer that never gets a key makes no file and needs no
    database. ``running`` is the API's set of dispatches, which the end of
    the shutdown drain cancels."""

    def __init__(
        self,
        open_records: Callable[[], SendRecords],
        dispatcher: Dispatcher,
        *,
        clock: IReactorTime,
        metrics: MailerMetrics,
        inflight: InFlight,
        running: set[Dispatch],
        retention: int,
        max_entries: int,
        poll_interval: float = POLL_INTERVAL,
    ) -> None:
        self._open_records = open_records
        self._records: SendRecords | None = None
        self._dispatcher = dispatcher
        self._clock = clock
        self._metrics = metrics
        self._inflight = inflight
        self._running = running
        self.retention = retention
        self.max_entries = max_entries
        self.poll_interval = poll_interval
        self.abandon_after = int(dispatcher.send_timeout) + ABANDON_GRACE
        #: Key digest -> the Deferred of the send under way in this process.
        self._sharing: dict[str, Deferred[KeyedAnswer]] = {}
        self._pauses: set[Deferred[None]] = set()
        self._stopping = False

    @property
    def opened(self) -> SendRecords | None:
        """The store, once the first keyed send has opened it."""
        return self._records

    @property
    def records(self) -> SendRecords:
        if self._records is None:
            self._records = self._open_records()
        return self._records

    def send(
        self, key: str, message: Message, mailer_keys: Sequence[str] | None
    ) -> Deferred[KeyedAnswer]:
        """The keyed send's answer (never an errback)."""
        digest = key_hash(key)
        shared = self._sharing.get(digest)
        if shared is not None:
            self._count("shared")
            return observe(shared).addCallback(self._shared, key)
        shared = Deferred()
        self._sharing[digest] = shared
        self._inflight.track(shared)

        def finished(result: KeyedAnswer | Failure) -> None:
            # Later requests with the key read the store, which now has it.
            del self._sharing[digest]
            shared.callback(result)

        Deferred.fromCoroutine(self._guarded(key, digest, message, mailer_keys)).addBoth(finished)
        return observe(shared)

    def _shared(self, done: KeyedAnswer, key: str) -> KeyedAnswer:
        _log_replay(key, done.answer)
        return replace(done, replayed=True)

    async def _guarded(
        self, key: str, digest: str, message: Message, mailer_keys: Sequence[str] | None
    ) -> KeyedAnswer:
        try:
            return await self._settle(key, digest, message, mailer_keys)
        except Exception:
            # A bug: whether a backend was reached is not known.
            log.failure("MAILER_IDEMPOTENT_SEND_CRASHED key={key}", level=LogLevel.error, key=key)
            return KeyedAnswer(Answer(502, "ERR_OUTCOME_UNKNOWN", "send failed unexpectedly"))

    async def _settle(
        self, key: str, digest: str, message: Message, mailer_keys: Sequence[str] | None
    ) -> KeyedAnswer:
        # A key released by a send elsewhere that handed nothing over (its
        # row removed while we waited) is claimed again; a few times at most.
        state: State | Answer | None = None
        for _ in range(3):
            try:
                state = await self.records.claim(digest)
                if isinstance(state, Pending):
                    state = await self._wait(digest, state)
            except Exception as e:
                return KeyedAnswer(self._store_failed(key, e))
            if isinstance(state, Claimed):
                self._count("sent")
                return KeyedAnswer(await self._send(key, digest, message, mailer_keys))
            if isinstance(state, Recorded):
                self._count("replayed")
                _log_replay(key, state.answer)
                return KeyedAnswer(state.answer, replayed=True)
            if isinstance(state, Answer):
                return KeyedAnswer(state)
        return KeyedAnswer(_in_progress(0))

    async def _send(
        self, key: str, digest: str, message: Message, mailer_keys: Sequence[str] | None
    ) -> Answer:
        started = self._dispatcher.start(message, mailer_keys)
        if isinstance(started, Answer):
            answer = started
        else:
            self._running.add(started)
            try:
                answer = await started.result
            finally:
                self._running.discard(started)
        try:
            await self.records.finish(digest, answer)
        except Exception as e:
            # The row stays "sending": a repeat of the key is settled as
            # "outcome unknown" later, never sent again.
            log.warn(
                "MAILER_IDEMPOTENCY_RECORD_FAILED key={key} code={code} error={error}",
                key=key,
                code=answer.code or "OK",
                error=self._reason(e),
            )
        return answer

    async def _wait(self, digest: str, pending: Pending) -> State | Answer | None:
        """Wait for a send under way elsewhere; its recorded state, a
        verdict, or None when it ended without sending (the key is free)."""
        until = self._clock.seconds() + self._dispatcher.send_timeout
        state: State | None = pending
        while isinstance(state, Pending):
            if state.age >= self.abandon_after:
                self._count("abandoned")
                verdict = _abandoned(state.age)
                settled = await self.records.settle(digest, verdict)
                return verdict if isinstance(settled, Pending) else settled
            if self._stopping or self._clock.seconds() + self.poll_interval > until:
                self._count("in_progress")
                return _in_progress(state.age)
            if not await self._pause():
                self._count("in_progress")
                return _in_progress(state.age)
            state = await self.records.read(digest)
        return state

    async def _pause(self) -> bool:
        d: Deferred[None] = deferLater(self._clock, self.poll_interval)
        self._pauses.add(d)
        try:
            await d
        except CancelledError:
            return False
        finally:
            self._pauses.discard(d)
        return True

    def _store_failed(self, key: str, e: Exception) -> Answer:
        self._count("store_unavailable")
        reason = self._reason(e)
        log.warn("MAILER_IDEMPOTENCY_STORE_FAILED key={key} error={error}", key=key, error=reason)
        return send_failed(f"the idempotency store is unavailable ({reason}); nothing was sent")

    def _reason(self, e: Exception) -> str:
        if isinstance(e, TransactionTimeout):
            return "timed out"
        if self._records is None:
            return type(e).__name__
        return self._records.db.engine.reason(e)

    def _count(self, result: str) -> None:
        self._metrics.idempotent_sends.labels(result).inc()

    def stop_waiting(self) -> None:
        """End of the shutdown drain: sends waited for elsewhere are answered
        "ask again later" at once."""
        self._stopping = True
        for pause in list(self._pauses):
            pause.cancel()

    async def prune(self) -> None:
        """One pruning pass (a poll tick); nothing to do before the store is open."""
        if self._records is None:
            return
        removed = await self._records.prune(
            retention=self.retention,
            max_entries=self.max_entries,
            abandon_after=self.abandon_after,
        )
        self._metrics.idempotency_pruned.inc(removed)

    def close(self) -> None:
        if self._records is not None:
            self._records.close()
            self._records = None
