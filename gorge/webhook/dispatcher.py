"""The delivery loop: candidates -> per-hook lines -> slots -> claim -> POST -> write-back.

Scheduling: a slot only starts a candidate whose hook is idle, so a slow
or broken hook never holds more than one slot. A hook stays busy until its
row's result is written, so its rows go out one at a time and in order.
While a slot posts a row it already checks and claims the oldest row of
another idle hook, and goes on with that one; a row dealt with before its
POST (retired, skipped, lost) lets the slot go on with the next row of the
same hook. Each tick replaces the lines with fresh candidates; rows not
started by then are simply read again.

Claims and result writes go through coalescers (gorge/webhook/batching.py):
the claims asked for together are one transaction, and the results that
arrive within a few milliseconds are another (docs/webhook.md, "Claiming
and writing back").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import LogLevel

from gorge.app.inflight import InFlight
from gorge.db import mysql as platform_mysql
from gorge.log.logger import Logger
from gorge.webhook import payload, retryafter
from gorge.webhook.batching import Coalescer
from gorge.webhook.breaker import Breaker
from gorge.webhook.claims import Candidate, Outcome
from gorge.webhook.metrics import WebhookMetrics
from gorge.webhook.observation import Hook
from gorge.webhook.rows import FAILED, QUEUED, RESULT_FAIL, RESULT_OKAY, SENT
from gorge.webhook.settings import WebhookSettings
from gorge.webhook.store import WebhookStore
from gorge.webhook.transport import CODE_UNRESOLVED, Attempt, Transport
from gorge.webhook.uripolicy import Target, Unresolvable, UriPolicy, UriRefused

log = Logger()

BATCH_PER_SLOT = 32  # candidates read per slot of the cap: fewer polls under load (measured +5%)
SUMMARY_EVERY = 60.0
OUTAGE_LOG_EVERY = 60.0
WRITE_ATTEMPTS = 3
WRITE_RETRY_DELAY = 0.5
ABORT_GRACE = 5.0
# Results written together: those that arrive within the window, at most the
# cap per transaction (docs/webhook.md, "Claiming and writing back").
WRITE_WINDOW = 0.003
WRITE_BATCH = 64
# A row is claimed ahead (while the slot's current POST runs) only when the lease
# outlasts a whole attempt by AHEAD_SLACK; it is then posted only if its lease still
# outlasts the attempt by LEASE_MARGIN (docs/webhook.md, "Claiming and writing back").
AHEAD_SLACK = 2.0
LEASE_MARGIN = 1.0

POLL_FAILED = "WEBHOOK_POLL_FAILED error={error} reason={reason} since={since}"
HOOK_LOOKUP_FAILED = "WEBHOOK_HOOK_LOOKUP_FAILED error={error} reason={reason} since={since}"


class _Summary:
    """Counters behind the once-a-minute summary line."""

    FIELDS = (
        "claims_won",
        "claims_lost",
        "breaker_skips",
        "delivered",
        "failed",
        "config_failures",
    )
    claims_won: int
    claims_lost: int
    breaker_skips: int
    delivered: int
    failed: int
    config_failures: int

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        for name in self.FIELDS:
            setattr(self, name, 0)

    def snapshot(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.FIELDS}


@dataclass(frozen=True)
class _Destination:
    """Where a claimed candidate goes: the checked target, or why its host did not resolve."""

    target: Target | None
    unresolved: str = ""


@dataclass(frozen=True)
class _Claimed:
    """A row this process won, ready to be posted."""

    candidate: Candidate
    hook: Hook
    props: payload.Properties
    destination: _Destination
    at: float  # when the claim was won (the dispatcher's clock)


class Dispatcher:
    def __init__(
        self,
        *,
        store: WebhookStore,
        transport: Transport,
        policy: UriPolicy,
        breaker: Breaker,
        settings: WebhookSettings,
        clock: IReactorTime,
        metrics: WebhookMetrics,
        wake: Callable[[], None] | None = None,
        batch_clock: IReactorTime | None = None,
    ) -> None:
        """``batch_clock`` times the write window (the reactor: real time, even
        when ``clock``, which paces everything else, is a test's)."""
        self._store = store
        self._transport = transport
        self._policy = policy
        self._breaker = breaker
        self._settings = settings
        self._clock = clock
        self._metrics = metrics
        self._wake = wake
        self._cap = settings.max_concurrent
        self._look_ahead = settings.effective_lease - settings.delivery_timeout >= AHEAD_SLACK
        self._batch = settings.max_concurrent * BATCH_PER_SLOT
        self._lines: dict[str, deque[Candidate]] = {}
        self._hooks: dict[str, Hook] = {}
        self._busy: set[str] = set()
        self._in_process: set[int] = set()
        self._active = 0
        self._inflight = InFlight()
        self._stopping = False
        self._more_waiting = False
        self._summary = _Summary()
        self._summary_at = clock.seconds()
        self._outage_since: float | None = None
        self._outage_logged_at = 0.0
        self._gone_hooks: set[str] = set()  # hooks whose 410 was logged (until a 2xx)
        batch_clock = batch_clock if batch_clock is not None else clock
        # Claims wait for no window: those asked for in one turn of the reactor
        # (a tick's slots), or while a claim runs, go together.
        self._claims: Coalescer[Candidate, bool] = Coalescer(
            store.claims.claim_many, batch_clock, window=0.0, cap=self._cap
        )
        self._writes: Coalescer[Outcome, int] = Coalescer(
            store.claims.finish_many, batch_clock, window=WRITE_WINDOW, cap=WRITE_BATCH
        )

    def set_wake(self, wake: Callable[[], None]) -> None:
        self._wake = wake

    @property
    def active(self) -> int:
        return self._active

    def wait_idle(self, timeout: float, clock: IReactorTime) -> Deferred:
        """Fires True once every started candidate has finished and its result is
        written (False on timeout)."""
        return Deferred.fromCoroutine(self._settled(timeout, clock))

    async def _settled(self, within: float, clock: IReactorTime) -> bool:
        # A slot hands its result writes on as it goes: wait for those too.
        deadline = clock.seconds() + within
        while len(self._inflight):
            if not await self._inflight.drain(max(deadline - clock.seconds(), 0.0), clock):
                return False
        return True

    # -- the tick ---------------------------------------------------------

    async def tick(self) -> None:
        """One poll; never waits for the deliveries it starts."""
        if self._stopping:
            return
        self._maybe_summary()
        # Read even with every slot busy: the lines and their hook rows are
        # replaced on every tick, so a hook disabled, re-pointed or
        # re-keyed while its backlog is worked takes effect at the next tick.
        try:
            await self._breaker.recheck_due()
            limit = self._batch + self._active
            rows = await self._store.claims.candidates(
                limit=limit,
                lease=self._settings.effective_lease,
                backoff=self._settings.retry_backoff,
                exclude_hooks=self._breaker.excluded(),
            )
            await self._renew_holds()
        except Exception as e:
            self._poll_failed(e)
            return
        try:
            # One lookup per tick for every hook of the batch.
            hooks = await self._store.observation.load_hooks(sorted({c.hook_phid for c in rows}))
        except Exception as e:
            self._poll_failed(e, HOOK_LOOKUP_FAILED)
            return
        # Only a whole poll ends an outage: a readable queue with an unreadable
        # hook table must not log "recovered" and "failed" on every tick.
        self._poll_recovered()
        if self._stopping:
            return
        # Lines and hooks are replaced together, with no await in between, so
        # every candidate a slot takes from a line finds its hook's row here.
        self._hooks = hooks
        # Not len(rows): rows claimed or written while the poll read them are
        # left out of it, and a short batch would then stop the early wake-up
        # until the next interval, with slots idle meanwhile.
        self._more_waiting = rows.more
        lines: dict[str, deque[Candidate]] = {}
        for candidate in rows:
            if candidate.id not in self._in_process:
                lines.setdefault(candidate.hook_phid, deque()).append(candidate)
        self._lines = lines
        self._fill()

    async def _renew_holds(self) -> None:
        """Keep the leases of rows held for a Retry-After (docs/webhook.md)."""
        for request_id in await self._store.claims.renew_holds():
            self._metrics.retry_after.labels(result="lost").inc()
            log.info(
                "WEBHOOK_HOLD_LOST request_id={request_id} reason={reason}",
                request_id=request_id,
                reason="the row was changed by another writer while held",
            )

    def _poll_failed(self, exc: Exception, event: str = POLL_FAILED) -> None:
        """A database outage: logged when it starts, then at most once a minute."""
        # Candidates not started by this tick are dropped as on any tick:
        # with the database gone they would each fail and log on their own.
        self._lines = {}
        self._metrics.poll_failures.inc()
        now = self._clock.seconds()
        if self._outage_since is None:
            self._outage_since = now
        elif now - self._outage_logged_at < OUTAGE_LOG_EVERY:
            return
        self._outage_logged_at = now
        log.error(
            event,
            error=type(exc).__name__,
            reason=platform_mysql.error_reason(exc),
            since=self._outage_since,
        )

    def _poll_recovered(self) -> None:
        if self._outage_since is not None:
            log.info(
                "WEBHOOK_POLL_RECOVERED down_seconds={seconds}",
                seconds=round(self._clock.seconds() - self._outage_since, 3),
            )
            self._outage_since = None

    def _maybe_summary(self) -> None:
        now = self._clock.seconds()
        if now - self._summary_at < SUMMARY_EVERY:
            return
        self._summary_at = now
        counts = self._summary.snapshot()
        if any(counts.values()):
            log.info(
                "WEBHOOK_SUMMARY claims_won={claims_won} claims_lost={claims_lost}"
                " breaker_skips={breaker_skips} delivered={delivered} failed={failed}"
                " config_failures={config_failures}",
                **counts,
            )
        self._summary.reset()

    # -- scheduling -------------------------------------------------------

    # Lines only ever hold rows that were not in process when the tick read
    # them, and a row leaves its line when a slot takes it.

    def _next_idle(self) -> Candidate | None:
        """The oldest waiting candidate of any hook with no delivery running."""
        best: deque[Candidate] | None = None
        for hook, line in self._lines.items():
            if line and hook not in self._busy and (best is None or line[0].id < best[0].id):
                best = line
        return best.popleft() if best is not None else None

    def _next_of_hook(self, hook: str) -> Candidate | None:
        line = self._lines.get(hook)
        return line.popleft() if line else None

    def _fill(self) -> None:
        while self._active < self._cap and not self._stopping:
            candidate = self._next_idle()
            if candidate is None:
                return
            self._active += 1
            self._metrics.in_flight.set(self._active)
            self._busy.add(candidate.hook_phid)
            self._in_process.add(candidate.id)
            d = Deferred.fromCoroutine(self._slot(candidate))
            d.addErrback(lambda f: log.failure("WEBHOOK_SLOT_FAILED", f, level=LogLevel.error))
            self._inflight.track(d)

    async def _slot(self, candidate: Candidate) -> None:
        current: Candidate | None = candidate
        ahead: Deferred[_Claimed | None] | None = None
        while current is not None:
            claimed_ahead = ahead is not None
            if ahead is None:
                ahead = Deferred.fromCoroutine(self._prepare(current))
            claimed = await ahead
            ahead = None
            if claimed is None:
                current = self._continue_after(current)
                continue
            # The next row's checks and claim run while this one is posted.
            upcoming = None
            if self._look_ahead and not self._stopping:
                upcoming = self._take(self._next_idle())
            if upcoming is not None:
                ahead = Deferred.fromCoroutine(self._prepare(upcoming))
            if not await self._post(claimed, claimed_ahead=claimed_ahead):
                self._release(current)
            if upcoming is None and not self._stopping:
                upcoming = self._take(self._next_idle())
            current = upcoming
        self._active -= 1
        self._metrics.in_flight.set(self._active)
        self._maybe_wake()

    def _take(self, candidate: Candidate | None) -> Candidate | None:
        """Mark a row, and its hook, as being worked by a slot."""
        if candidate is not None:
            self._busy.add(candidate.hook_phid)
            self._in_process.add(candidate.id)
        return candidate

    def _release(self, candidate: Candidate) -> None:
        self._in_process.discard(candidate.id)
        self._busy.discard(candidate.hook_phid)

    def _continue_after(self, candidate: Candidate) -> Candidate | None:
        """A row dealt with before its POST: the slot goes on with the next row of the
        same hook, else with the oldest row of any idle hook."""
        self._in_process.discard(candidate.id)
        following = None if self._stopping else self._next_of_hook(candidate.hook_phid)
        if following is None:
            self._busy.discard(candidate.hook_phid)
            if not self._stopping:
                following = self._next_idle()
        return self._take(following)

    def _maybe_wake(self) -> None:
        """The last batch was full and three quarters of it are started: more rows
        are due, read them now (while the deliveries go on) instead of at the next
        tick."""
        if not self._more_waiting or self._stopping or self._wake is None:
            return
        if sum(len(line) for line in self._lines.values()) > self._batch // 4:
            return
        self._more_waiting = False
        self._wake()

    # -- one candidate ------------------------------------------------
    #
    # The steps, in the order that is part of the contract; each returns
    # None when the candidate has been dealt with (retired, skipped, lost):
    #
    #   _read_properties -> _usable_hook -> _breaker_allows -> _destination
    #   -> _claim (together: _prepare) -> _deliver (_post) -> _write_back (_record),
    #   the last one beside the slot

    async def _prepare(self, candidate: Candidate) -> _Claimed | None:
        """The steps up to the claim; None when the row has been dealt with."""
        try:
            props = await self._read_properties(candidate)
            if props is None:
                return None
            hook = await self._usable_hook(candidate, props)
            if hook is None or not await self._breaker_allows(candidate, hook):
                return None
            destination = await self._destination(candidate, hook, props)
            if destination is None or self._stopping:
                return None  # refused, or shutdown before the claim: abandon without a write
            if not await self._claim(candidate, hook):
                return None
        except Exception:
            _process_failed(candidate)
            return None
        return _Claimed(candidate, hook, props, destination, self._clock.seconds())

    async def _post(self, claimed: _Claimed, *, claimed_ahead: bool) -> bool:
        """The POST of a claimed row; True when its result is being written (the row
        and its hook stay busy until then)."""
        candidate, hook = claimed.candidate, claimed.hook
        try:
            if claimed_ahead and not self._claim_still_covers(claimed):
                return False
            attempt, duration = await self._deliver(
                candidate, hook, claimed.props, claimed.destination
            )
        except Exception:
            _process_failed(candidate)
            return False
        if attempt.aborted:
            self._metrics.deliveries.labels(outcome="abandoned").inc()
            log.warn(
                "WEBHOOK_DELIVERY_ABANDONED request={request} hook={hook}",
                request=candidate.phid,
                hook=hook.phid,
            )
            return False
        self._inflight.track(
            Deferred.fromCoroutine(
                self._write_back(candidate, hook.phid, claimed.props, attempt, duration)
            )
        )
        return True

    def _claim_still_covers(self, claimed: _Claimed) -> bool:
        """A row claimed ahead waited for the POST before it; it is only sent if its
        lease still covers a whole attempt. Otherwise nothing is sent or written: the
        row goes out once the lease has run out, by whichever replica claims it."""
        waited = self._clock.seconds() - claimed.at
        lease = self._settings.effective_lease
        if waited + self._settings.delivery_timeout + LEASE_MARGIN <= lease:
            return True
        log.info(
            "WEBHOOK_CLAIM_EXPIRED request={request} hook={hook} waited={waited}",
            request=claimed.candidate.phid,
            hook=claimed.hook.phid,
            waited=round(waited, 3),
        )
        return False

    async def _write_back(
        self,
        candidate: Candidate,
        hook_phid: str,
        props: payload.Properties,
        attempt: Attempt,
        duration: float,
    ) -> None:
        """Step 8, beside the slot: record the attempt, then free the row and its hook."""
        try:
            await self._record(candidate, hook_phid, props, attempt, duration)
        except Exception:
            _process_failed(candidate)
        finally:
            self._release(candidate)
            self._fill()
            self._maybe_wake()

    async def _read_properties(self, candidate: Candidate) -> payload.Properties | None:
        """Step 1: the stored document; an unreadable one retires the row."""
        try:
            return payload.parse_properties(candidate.properties)
        except payload.InvalidProperties as e:
            log.warn(
                "WEBHOOK_PROPERTIES_INVALID request={request} hook={hook} reason={reason}",
                request=candidate.phid,
                hook=candidate.hook_phid,
                reason=e.reason,
            )
            await self._retire(candidate, e.document, payload.CODE_INVALID_PROPERTIES)
            return None

    async def _usable_hook(self, candidate: Candidate, props: payload.Properties) -> Hook | None:
        """Step 2: the hook, looked up by the tick; a missing or disabled one retires the row."""
        hook = self._hooks.get(candidate.hook_phid)
        if hook is None:
            log.warn(
                "WEBHOOK_HOOK_MISSING request={request} hook={hook}",
                request=candidate.phid,
                hook=candidate.hook_phid,
            )
            await self._retire(candidate, props.document, payload.CODE_NOT_FOUND)
            return None
        if hook.disabled:
            log.info(
                "WEBHOOK_HOOK_DISABLED request={request} hook={hook}",
                request=candidate.phid,
                hook=hook.phid,
            )
            await self._retire(candidate, props.document, payload.CODE_DISABLED)
            return None
        return hook

    async def _breaker_allows(self, candidate: Candidate, hook: Hook) -> bool:
        """Step 4 (the slot already serialises the hook, step 3): open or uncountable = skip."""
        try:
            is_open = await self._breaker.is_open(hook.phid)
        except Exception as e:
            self._drop_line(hook.phid)
            log.error(
                "WEBHOOK_BACKOFF_CHECK_FAILED request={request} hook={hook} error={error}",
                request=candidate.phid,
                hook=hook.phid,
                error=platform_mysql.error_reason(e),
            )
            return False
        if is_open:
            # The rest of this hook's line would only find it open again.
            skipped = 1 + len(self._lines.pop(hook.phid, ()))
            self._metrics.breaker_skips.inc(skipped)
            self._summary.breaker_skips += skipped
            log.debug(
                "WEBHOOK_HOOK_BACKOFF_SKIPPED request={request} hook={hook} rows={rows}",
                request=candidate.phid,
                hook=hook.phid,
                rows=skipped,
            )
            return False
        return True

    async def _destination(
        self, candidate: Candidate, hook: Hook, props: payload.Properties
    ) -> _Destination | None:
        """Step 5: the outbound policy. Refused retires the row; a host that does
        not resolve is still claimed and recorded as a failed attempt."""
        try:
            return _Destination(target=await self._policy.check(hook.uri))
        except UriRefused as e:
            log.warn(
                "WEBHOOK_URI_REFUSED request={request} hook={hook} check={check} host={host}",
                request=candidate.phid,
                hook=hook.phid,
                check=e.check,
                host=e.host,
            )
            await self._retire(candidate, props.document, payload.CODE_URI)
            return None
        except Unresolvable as e:
            return _Destination(target=None, unresolved=f"{e.host}: {e.reason}")

    async def _claim(self, candidate: Candidate, hook: Hook) -> bool:
        """Step 6: the compare-and-set; nothing is sent without it."""
        try:
            won = await self._claims.submit(candidate)
        except Exception as e:
            self._drop_line(hook.phid)
            self._metrics.claims.labels(result="error").inc()
            log.error(
                "WEBHOOK_CLAIM_FAILED request={request} hook={hook} error={error}",
                request=candidate.phid,
                hook=hook.phid,
                error=platform_mysql.error_reason(e),
            )
            return False
        if not won:
            self._metrics.claims.labels(result="lost").inc()
            self._summary.claims_lost += 1
            log.debug(
                "WEBHOOK_CLAIM_LOST request={request} hook={hook}",
                request=candidate.phid,
                hook=hook.phid,
            )
            return False
        self._metrics.claims.labels(result="won").inc()
        self._summary.claims_won += 1
        return True

    async def _deliver(
        self, candidate: Candidate, hook: Hook, props: payload.Properties, destination: _Destination
    ) -> tuple[Attempt, float]:
        """Step 7: build, sign and POST; the attempt and how long the POST took."""
        if destination.target is None:
            detail = f"unresolved {destination.unresolved}"
            return Attempt(code=CODE_UNRESOLVED, detail=detail), 0.0  # no POST was made
        if not hook.hmac_key:
            log.error(
                "WEBHOOK_REQUEST_BUILD_FAILED request={request} hook={hook} reason={reason}",
                request=candidate.phid,
                hook=hook.phid,
                reason="empty hmac key",
            )
            unbuildable = Attempt(
                error_type=payload.ERROR_TYPE_HOOK, code=payload.CODE_REQUEST_BUILD
            )
            return unbuildable, 0.0
        body = payload.build_body(candidate.object_phid, candidate.date_created, props)
        headers = {
            "Content-Type": "application/json",
            payload.SIGNATURE_HEADER: payload.sign(hook.hmac_key, body),
        }
        started = self._clock.seconds()
        if self._settings.standard_headers:
            # The request's PHID: the same on every attempt of the request, so a
            # receiver can tell a retry from a new event (docs/webhook.md).
            headers.update(
                payload.standard_headers(hook.hmac_key, candidate.phid, int(started), body)
            )
        attempt = await self._transport.attempt(destination.target, body, headers)
        duration = max(self._clock.seconds() - started, 0.0)
        self._metrics.delivery_seconds.observe(duration)
        return attempt, duration

    def _drop_line(self, hook_phid: str) -> None:
        """A statement failed: the hook's other rows would only fail the same way
        (one error line per row); the next tick reads them again."""
        self._lines.pop(hook_phid, None)

    async def _record(
        self,
        candidate: Candidate,
        hook_phid: str,
        props: payload.Properties,
        attempt: Attempt,
        duration: float,
    ) -> None:
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
        written = Outcome(candidate, status, result, properties)
        changed = await self._write(candidate, lambda: self._writes.submit(written))
        if changed is None:
            return
        self._metrics.deliveries.labels(outcome=outcome).inc()
        not_before = None
        if changed and status == QUEUED:
            not_before = await self._hold_for_retry_after(candidate, hook_phid, attempt)
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

    async def _hold_for_retry_after(
        self, candidate: Candidate, hook_phid: str, attempt: Attempt
    ) -> int | None:
        """A 429/503 with Retry-After: the next attempt waits that long (bounded),
        when that is later than the fixed retry. Returns the database second held until."""
        if (
            attempt.code not in retryafter.STATUSES
            or attempt.retry_after is None
            or not self._settings.retry_after_max
        ):
            return None
        asked = retryafter.retry_after_seconds(attempt.retry_after, self._clock.seconds())
        if asked is None:
            self._metrics.retry_after.labels(result="unreadable").inc()
            return None
        try:
            delay = min(asked, float(self._settings.retry_after_max))
            not_before = await self._store.claims.hold(candidate, delay)
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

    async def _retire(self, candidate: Candidate, document: dict | None, code: str) -> None:
        if self._stopping:
            return
        properties = payload.with_outcome(document, payload.ERROR_TYPE_HOOK, code)
        changed = await self._write(
            candidate, lambda: self._store.claims.retire(candidate, properties)
        )
        if changed:
            self._summary.config_failures += 1
            self._metrics.deliveries.labels(outcome="config_failure").inc()
        elif changed == 0:
            log.debug(
                "WEBHOOK_RETIRE_SKIPPED request={request} code={code}",
                request=candidate.phid,
                code=code,
            )

    async def _write(self, candidate: Candidate, write) -> int | None:
        """A result write, retried briefly: losing it means a duplicate after the lease."""
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                return await write()
            except Exception as e:
                if attempt == WRITE_ATTEMPTS:
                    log.error(
                        "WEBHOOK_RESULT_WRITE_FAILED request={request} error={error}",
                        request=candidate.phid,
                        error=platform_mysql.error_reason(e),
                    )
                    return None
                await deferLater(self._clock, WRITE_RETRY_DELAY * attempt)
        return None

    # -- shutdown -----------------------------------

    async def drain(self, budget: float) -> None:
        """No new work; in-flight deliveries finish and write; past the budget, abort."""
        self._stopping = True
        self._lines.clear()
        if await self._settled(budget, self._clock):
            return
        log.warn(
            "WEBHOOK_SHUTDOWN_ABANDONED deliveries={count} budget={budget}",
            count=len(self._inflight),
            budget=budget,
        )
        self._transport.abort_all()
        await self._settled(ABORT_GRACE, self._clock)


def _process_failed(candidate: Candidate) -> None:
    """An unexpected error in a row's steps: logged with its traceback; the row
    is read again at a later tick."""
    log.failure(
        "WEBHOOK_PROCESS_FAILED request={request}", level=LogLevel.error, request=candidate.phid
    )


def _rejected(attempt: Attempt) -> bool:
    """The receiver answered with a status that is not success (vs. a transport failure)."""
    return (
        attempt.error_type == payload.ERROR_TYPE_HTTP
        and isinstance(attempt.code, int)
        and attempt.code >= 100
    )
