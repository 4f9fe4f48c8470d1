"""The delivery loop: candidates -> per-hook lines -> slots -> claim -> POST -> write-back.

Scheduling (gorge/webhook/lines.py): a slot only starts a candidate whose
hook is idle, so a slow or broken hook never holds more than one slot, and a
hook's rows go out one at a time and in order. While a slot posts a row it
already checks and claims the oldest row of another idle hook, and goes on
with that one. With no idle hook (traffic to a few hooks) it keeps to its
own hook instead: the hook's next row is checked while the current one is
posted, and once that POST has succeeded, the row's result is written (at
once, not after the write window) and the next row claimed in the same
round trip; that row is posted as soon as both are done. A hook's cycle is
then its POST and one database round trip. A row dealt with before its
POST (retired, skipped, lost) lets the slot go on with the next row of the
same hook. Each tick replaces the lines with fresh candidates; rows not
started by then are simply read again.

The steps of one row are gorge/webhook/delivery.py's up to the POST and
gorge/webhook/writeback.py's after it.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import LogLevel

from gorge.app.inflight import InFlight
from gorge.log.logger import Logger
from gorge.webhook import payload
from gorge.webhook.breaker import Breaker
from gorge.webhook.claims import Candidate
from gorge.webhook.delivery import Checked, Claimed, Delivery, process_failed
from gorge.webhook.hooklock import HookLocks
from gorge.webhook.lines import HookLines
from gorge.webhook.metrics import WebhookMetrics
from gorge.webhook.outage import Outage
from gorge.webhook.settings import WebhookSettings
from gorge.webhook.silent import SilentMode
from gorge.webhook.store import WebhookStore
from gorge.webhook.summary import Summary
from gorge.webhook.transport import Attempt, Transport
from gorge.webhook.uripolicy import UriPolicy
from gorge.webhook.writeback import WriteBack

log = Logger()

BATCH_PER_SLOT = 32  # candidates read per slot of the cap: fewer polls under load (measured +5%)
ABORT_GRACE = 5.0
# A row is claimed ahead (while the slot's current POST runs) only when the lease
# outlasts a whole attempt by AHEAD_SLACK (docs/webhook.md, "Claiming and writing back").
AHEAD_SLACK = 2.0

POLL_FAILED = "WEBHOOK_POLL_FAILED error={error} reason={reason} since={since}"
HOOK_LOOKUP_FAILED = "WEBHOOK_HOOK_LOOKUP_FAILED error={error} reason={reason} since={since}"


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
        silent: SilentMode | None = None,
        locks: HookLocks | None = None,
    ) -> None:
        """``batch_clock`` times the write window (the reactor: real time, even
        when ``clock``, which paces everything else, is a test's). ``silent``:
        Phorge's silent mode, read again at the start of a poll when due.
        ``locks``: Phorge's per-hook lock, held while a hook has a row in process."""
        self._store = store
        self._silent = silent
        self._transport = transport
        self._breaker = breaker
        self._settings = settings
        self._clock = clock
        self._metrics = metrics
        self._wake = wake
        self._cap = settings.max_concurrent
        self._look_ahead = settings.effective_lease - settings.delivery_timeout >= AHEAD_SLACK
        self._batch = settings.max_concurrent * BATCH_PER_SLOT
        self._locks = locks
        self._lines = HookLines(on_idle=self._hook_idle if locks is not None else None)
        self._active = 0
        self._inflight = InFlight()
        self._stopping = False
        self._more_waiting = False
        self._summary = Summary(clock)
        self._outage = Outage(clock)
        batch_clock = batch_clock if batch_clock is not None else clock
        self._results = WriteBack(
            claims=store.claims,
            breaker=breaker,
            settings=settings,
            clock=clock,
            metrics=metrics,
            summary=self._summary,
            batch_clock=batch_clock,
        )
        self._delivery = Delivery(
            claims=store.claims,
            lines=self._lines,
            results=self._results,
            transport=transport,
            policy=policy,
            breaker=breaker,
            settings=settings,
            clock=clock,
            metrics=metrics,
            summary=self._summary,
            batch_clock=batch_clock,
            silent=silent,
            locks=locks,
        )

    def _hook_idle(self, hook_phid: str) -> None:
        """No row of the hook in process any more: its lock goes."""
        assert self._locks is not None
        released = self._locks.release(hook_phid)
        if released is not None:
            self._inflight.track(released)

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
        self._summary.maybe_log()
        if self._locks is not None:
            # Idle hooks' locks kept since the last poll go (gorge/webhook/hooklock.py).
            for released in self._locks.release_parked():
                self._inflight.track(released)
        if self._silent is not None:
            await self._silent.refresh_if_due()
            if not self._silent.known:
                return  # neither post nor retire before silent mode is known
        if not self._store.db.writable:
            # A read-only master (gorge/db logs the change once and checks every
            # few seconds): no claim could be written; rows already read wait too.
            self._lines.clear()
            return
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
        self._outage.recovered()
        if self._stopping:
            return
        # Not len(rows): rows claimed or written while the poll read them are
        # left out of it, and a short batch would then stop the early wake-up
        # until the next interval, with slots idle meanwhile.
        self._more_waiting = rows.more
        self._lines.replace(rows, hooks)
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
        self._lines.clear()
        self._metrics.poll_failures.inc()
        self._outage.failed(exc, event)

    # -- slots ------------------------------------------------------------

    def _fill(self) -> None:
        while self._active < self._cap and not self._stopping:
            candidate = self._lines.take_next()
            if candidate is None:
                return
            self._active += 1
            self._metrics.in_flight.set(self._active)
            d = Deferred.fromCoroutine(self._slot(candidate))
            d.addErrback(lambda f: log.failure("WEBHOOK_SLOT_FAILED", f, level=LogLevel.error))
            self._inflight.track(d)

    async def _slot(self, candidate: Candidate) -> None:
        current: Candidate | None = candidate
        ahead: Deferred[Claimed | None] | None = None
        while current is not None:
            claimed_ahead = ahead is not None
            if ahead is None:
                ahead = Deferred.fromCoroutine(self._delivery.prepare(current))
            claimed = await ahead
            ahead = None
            if claimed is None:
                current = self._lines.continue_after(current, stopping=self._stopping)
                continue
            # The next row's checks and claim run while this one is posted.
            upcoming = following = None
            if self._look_ahead and not self._stopping:
                upcoming = self._lines.take_next()
            if upcoming is not None:
                ahead = Deferred.fromCoroutine(self._delivery.prepare(upcoming))
            elif not self._stopping:
                # No idle hook: this hook's next row, taken now so the hook
                # stays busy (and this slot's) until it is posted.
                following = self._lines.take_following(current)
            if following is not None:
                current, ahead = await self._post_and_follow(
                    claimed, current, following, claimed_ahead=claimed_ahead
                )
                continue
            if await self._post(claimed, claimed_ahead=claimed_ahead) is None:
                self._lines.release(current)
            if upcoming is None and not self._stopping:
                upcoming = self._lines.take_next()
            current = upcoming
        self._active -= 1
        self._metrics.in_flight.set(self._active)
        self._maybe_wake()

    def _maybe_wake(self) -> None:
        """The last batch was full and three quarters of it are started: more rows
        are due, read them now (while the deliveries go on) instead of at the next
        tick."""
        if not self._more_waiting or self._stopping or self._wake is None:
            return
        if self._lines.waiting() > self._batch // 4:
            return
        self._more_waiting = False
        self._wake()

    async def _post_and_follow(
        self, claimed: Claimed, current: Candidate, following: Candidate, *, claimed_ahead: bool
    ) -> tuple[Candidate | None, Deferred[Claimed | None] | None]:
        """Post ``claimed`` (the row ``current``), with ``following``, the same
        hook's next row, checked meanwhile and claimed with the result's write.
        Returns the row to go on with, and its claim when it was won so.

        One POST at a time per hook, in order, each after the result of the
        one before is written: a crash leaves one row to send again, never a
        later row sent while an earlier one's result is unknown."""
        checking = Deferred.fromCoroutine(self._delivery.check(following))
        written = await self._post(claimed, claimed_ahead=claimed_ahead, follow=checking)
        checked = await checking
        if written is None:
            self._lines.release(current)
        elif await written and checked is not None:
            return following, succeed(self._delivery.claimed(checked))
        if checked is None:
            # Dealt with before its POST (retired or skipped).
            return self._lines.continue_after(following, stopping=self._stopping), None
        # Not claimed with the write (the POST failed, the hook changed, the
        # claim was lost): every step again, after the write (the breaker
        # counts a failure only once it is written).
        return following, None

    async def _post(
        self,
        claimed: Claimed,
        *,
        claimed_ahead: bool,
        follow: Deferred[Checked | None] | None = None,
    ) -> Deferred[bool] | None:
        """The POST of a claimed row. Once its result is being written (the row and
        its hook stay busy until then): the write, which fires when it has ended,
        True if it also claimed the row ``follow`` checks. Else None.

        ``follow``: the same hook's next row waits for this write, which goes to
        the database at once instead of after the write window; after a
        success that row is claimed with it, if its checks still hold."""
        candidate, hook = claimed.candidate, claimed.hook
        try:
            if claimed_ahead and not self._delivery.claim_still_covers(claimed):
                return None
            attempt, duration = await self._delivery.deliver(claimed)
        except Exception:
            process_failed(candidate)
            return None
        if attempt.aborted:
            self._metrics.deliveries.labels(outcome="abandoned").inc()
            log.warn(
                "WEBHOOK_DELIVERY_ABANDONED request={request} hook={hook}",
                request=candidate.phid,
                hook=hook.phid,
            )
            return None
        follow_row = None
        if follow is not None and attempt.ok:
            checked = await follow
            if checked is not None and self._delivery.still_current(checked):
                follow_row = checked.candidate
        written = Deferred.fromCoroutine(
            self._write_back(
                candidate,
                hook.phid,
                claimed.props,
                attempt,
                duration,
                urgent=follow is not None,
                follow=follow_row,
            )
        )
        self._inflight.track(written)
        # A Deferred of the slot's own to wait on: the in-flight tracking
        # keeps the write's.
        ended: Deferred[bool] = Deferred()
        written.addBoth(lambda won: ended.callback(won is True))
        return ended

    async def _write_back(
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
        """Step 8, beside the slot: record the attempt, then free the row and its
        hook. True when ``follow`` was claimed with the write."""
        try:
            return await self._results.record(
                candidate, hook_phid, props, attempt, duration, urgent=urgent, follow=follow
            )
        except Exception:
            process_failed(candidate)
            return False
        finally:
            self._lines.release(candidate)
            self._fill()
            self._maybe_wake()

    # -- shutdown -----------------------------------

    async def drain(self, budget: float) -> None:
        """No new work; in-flight deliveries finish and write; past the budget, abort."""
        self._stopping = True
        self._delivery.stop()
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
