"""Step 8 of a delivery: its result written over the row, and what it means.

Result writes go through a coalescer (gorge/webhook/batching.py): the
results that arrive within a few milliseconds are one transaction
(docs/webhook.md, "Claiming and writing back"). A failed attempt also tells
the breaker, may hold the row for a Retry-After, and a 410 is noted once per
hook.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from twisted.internet.defer import TimeoutError as DeferredTimeoutError
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater

from gorge.db import mysql as platform_mysql
from gorge.log.logger import Logger
from gorge.webhook import payload, retryafter
from gorge.webhook.batching import Coalescer
from gorge.webhook.breaker import Breaker
from gorge.webhook.claims import Candidate, Claims, Outcome
from gorge.webhook.metrics import WebhookMetrics
from gorge.webhook.rows import FAILED, QUEUED, RESULT_FAIL, RESULT_OKAY, SENT
from gorge.webhook.settings import WebhookSettings
from gorge.webhook.summary import Summary
from gorge.webhook.transport import Attempt

log = Logger()

W = TypeVar("W")

WRITE_ATTEMPTS = 3
WRITE_RETRY_DELAY = 0.5
# An unreachable master (a failover under way): the write is tried again
# this often for as long as the row's claim surely lasts (a read-only one is
# waited for until it takes writes), and given up this long before the
# claim could end.
OUTAGE_RETRY_DELAY = 1.0
OUTAGE_MARGIN = 2.0
# Results written together: those that arrive within the window, at most the
# cap per transaction (docs/webhook.md, "Claiming and writing back").
WRITE_WINDOW = 0.003
WRITE_BATCH = 64
# Result writes a few hot hooks may have on their way at once: each such hook
# waits for its write before its next POST (bench/webhook.py --hooks 4: a
# quarter of the cycle was spent waiting behind another hook's write).
WRITE_LANES = 4


class WriteBack:
    """Writes results (deliveries and configuration failures) over the rows they are for."""

    def __init__(
        self,
        *,
        claims: Claims,
        breaker: Breaker,
        settings: WebhookSettings,
        clock: IReactorTime,
        metrics: WebhookMetrics,
        summary: Summary,
        batch_clock: IReactorTime,
    ) -> None:
        """``batch_clock`` times the write window (real time, even under a test's ``clock``)."""
        self._claims = claims
        self._breaker = breaker
        self._settings = settings
        self._clock = clock
        self._metrics = metrics
        self._summary = summary
        self._batch_clock = batch_clock
        self._gone_hooks: set[str] = set()  # hooks whose 410 was logged (until a 2xx)
        self._writes: Coalescer[Outcome, tuple[int, bool]] = Coalescer(
            claims.finish_and_follow,
            batch_clock,
            window=WRITE_WINDOW,
            cap=WRITE_BATCH,
            lanes=WRITE_LANES,
        )

    async def record(
        self,
        candidate: Candidate,
        hook_phid: str,
        props: payload.Properties,
        attempt: Attempt,
        duration: float,
        *,
        urgent: bool = False,
        follow: Candidate | None = None,
    ) -> bool:
        """The attempt's outcome over the claimed row, then its log line.
        ``urgent``: written at once, not after the write window (the hook's
        next row waits for it). ``follow``: that next row, claimed in the same
        round trip when this attempt succeeded and its result was written;
        True when it is now ours."""
        arrived = self._clock.seconds()  # a Retry-After counts from the answer
        if attempt.ok:
            status, result, outcome = SENT, RESULT_OKAY, "sent"
        else:
            status = QUEUED if props.retry_forever else FAILED
            result = RESULT_FAIL
            outcome = "retry" if props.retry_forever else "failed"
        properties = payload.with_outcome(props.document, attempt.error_type, attempt.code)
        if not attempt.ok:
            self._breaker.failed(hook_phid)
        self._note_gone(candidate, hook_phid, attempt)
        written = Outcome(
            candidate, status, result, properties, follow=follow if attempt.ok else None
        )
        started = self._batch_clock.seconds()
        answer = await self._write(candidate, lambda: self._writes.submit(written, urgent=urgent))
        if answer is None:
            return False
        self._metrics.write_seconds.labels(next_waits="yes" if urgent else "no").observe(
            self._batch_clock.seconds() - started
        )
        changed, follow_won = answer
        if written.follow is not None and changed:
            # The next row's claim rode on this write: counted as any claim.
            self._metrics.claims.labels(result="won" if follow_won else "lost").inc()
            if follow_won:
                self._summary.claims_won += 1
            else:
                self._summary.claims_lost += 1
        self._metrics.deliveries.labels(outcome=outcome).inc()
        not_before = None
        if changed and status == QUEUED:
            not_before = await self._hold_for_retry_after(candidate, hook_phid, attempt, arrived)
        if attempt.ok:
            self._summary.delivered += 1
            log.info(
                "WEBHOOK_DELIVERED request={request} hook={hook} status={status}"
                " duration={duration}",
                request=candidate.phid,
                hook=hook_phid,
                status=attempt.code,
                duration=round(duration, 3),
            )
        elif _rejected(attempt):
            self._summary.failed += 1
            log.warn(
                "WEBHOOK_DELIVERY_REJECTED request={request} hook={hook} status={status}"
                " duration={duration} row_status={row_status} not_before={not_before}",
                request=candidate.phid,
                hook=hook_phid,
                status=attempt.code,
                duration=round(duration, 3),
                row_status=status,
                not_before=not_before,
            )
        else:
            self._summary.failed += 1
            log.warn(
                "WEBHOOK_DELIVERY_FAILED request={request} hook={hook}"
                " error_type={error_type} code={code} error={error} duration={duration}"
                " row_status={row_status}",
                request=candidate.phid,
                hook=hook_phid,
                error_type=attempt.error_type,
                code=attempt.code,
                error=attempt.detail,
                duration=round(duration, 3),
                row_status=status,
            )
        if changed == 0:
            log.info(
                "WEBHOOK_RESULT_ROW_GONE request={request} hook={hook}",
                request=candidate.phid,
                hook=hook_phid,
            )
        return follow_won

    async def retire(self, candidate: Candidate, document: dict | None, code: str) -> None:
        """A configuration failure, written without a claim (only over the version read)."""
        properties = payload.with_outcome(document, payload.ERROR_TYPE_HOOK, code)
        changed = await self._write(candidate, lambda: self._claims.retire(candidate, properties))
        if changed:
            self._summary.config_failures += 1
            self._metrics.deliveries.labels(outcome="config_failure").inc()
        elif changed == 0:
            log.debug(
                "WEBHOOK_RETIRE_SKIPPED request={request} code={code}",
                request=candidate.phid,
                code=code,
            )

    async def _hold_for_retry_after(
        self, candidate: Candidate, hook_phid: str, attempt: Attempt, arrived: float
    ) -> int | None:
        """A 429/503 with Retry-After: the next attempt waits that long after the
        answer's arrival (bounded), when that is later than the fixed retry.
        Returns the database second held until."""
        if (
            attempt.code not in retryafter.STATUSES
            or attempt.retry_after is None
            or not self._settings.retry_after_max
        ):
            return None
        delay = retryafter.wait_seconds(
            attempt.retry_after, arrived, self._settings.retry_after_max
        )
        if delay is None:
            self._metrics.retry_after.labels(result="unreadable").inc()
            return None
        try:
            # Durations on this host's clock, moments on the database's.
            elapsed = self._clock.seconds() - arrived
            not_before = await self._claims.hold(candidate, delay, elapsed=elapsed)
        except Exception as e:
            # Not held: the row is retried after the fixed retry, like any failure.
            log.error(
                "WEBHOOK_HOLD_FAILED request={request} hook={hook} error={error}",
                request=candidate.phid,
                hook=hook_phid,
                error=platform_mysql.error_reason(e),
            )
            return None
        self._metrics.retry_after.labels(result="held" if not_before else "not_later").inc()
        return not_before

    def _note_gone(self, candidate: Candidate, hook_phid: str, attempt: Attempt) -> None:
        """410 Gone: counted every time, logged once per hook until it answers 2xx again."""
        if attempt.ok:
            self._gone_hooks.discard(hook_phid)
            return
        if attempt.error_type != payload.ERROR_TYPE_HTTP or attempt.code != retryafter.GONE:
            return
        self._metrics.gone.inc()
        if hook_phid in self._gone_hooks:
            return
        self._gone_hooks.add(hook_phid)
        log.warn(
            "WEBHOOK_RECEIVER_GONE hook={hook} request={request} retry={retry}",
            hook=hook_phid,
            request=candidate.phid,
            retry="the request follows its retry mode; disable the hook in Phorge "
            "if the receiver is gone for good",
        )

    async def _write(self, candidate: Candidate, write: Callable[[], Awaitable[W]]) -> W | None:
        """A result write, retried: losing it means a duplicate after the lease.

        A master that is read-only or gone is waited for while the claim
        surely holds: the claim came at most one delivery timeout before the
        first write, so the lease lasts at least ``effective_lease -
        delivery_timeout`` after it. Other errors get a few quick tries."""
        started = self._clock.seconds()
        outage_until = (
            started + self._settings.effective_lease - self._settings.delivery_timeout
        ) - OUTAGE_MARGIN
        attempt = 0
        while True:
            attempt += 1
            try:
                return await write()
            except Exception as e:
                read_only = platform_mysql.is_read_only(e)
                outage = read_only or platform_mysql.is_transient(e)
                left = outage_until - self._clock.seconds()
                if read_only and left > 0:
                    # Resumes the moment the database's health check (or a
                    # /readyz ping) sees it writable again.
                    try:
                        await self._claims.db.when_writable().addTimeout(left, self._clock)
                    except DeferredTimeoutError:
                        pass
                    continue
                if outage and left > OUTAGE_RETRY_DELAY:
                    await deferLater(self._clock, OUTAGE_RETRY_DELAY)
                    continue
                if outage or attempt >= WRITE_ATTEMPTS:
                    log.error(
                        "WEBHOOK_RESULT_WRITE_FAILED request={request} error={error}",
                        request=candidate.phid,
                        error=platform_mysql.error_reason(e),
                    )
                    return None
                await deferLater(self._clock, WRITE_RETRY_DELAY * attempt)


def _rejected(attempt: Attempt) -> bool:
    """The receiver answered with a status that is not success (vs. a transport failure)."""
    return (
        attempt.error_type == payload.ERROR_TYPE_HTTP
        and isinstance(attempt.code, int)
        and attempt.code >= 100
    )
