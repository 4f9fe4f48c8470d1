"""One request's steps from its row to its POST, in the order that is part of the contract.

Each step returns None (or False) when the candidate has been dealt with
(retired, skipped, lost):

  _read_properties -> _usable_hook -> _breaker_allows -> _destination
  -> _claim (together: prepare) -> deliver, then the write-back
  (gorge/webhook/writeback.py) beside the slot.

Claims go through a coalescer (gorge/webhook/batching.py): the claims asked
for together are one transaction (docs/webhook.md, "Claiming and writing
back").
"""

from __future__ import annotations

from dataclasses import dataclass

from twisted.internet.interfaces import IReactorTime
from twisted.logger import LogLevel

from gorge.db import mysql as platform_mysql
from gorge.log.logger import Logger
from gorge.webhook import payload
from gorge.webhook.batching import Coalescer
from gorge.webhook.breaker import Breaker
from gorge.webhook.claims import Candidate, Claims
from gorge.webhook.hooklock import HookLocks
from gorge.webhook.lines import HookLines
from gorge.webhook.metrics import WebhookMetrics
from gorge.webhook.observation import Hook
from gorge.webhook.settings import WebhookSettings
from gorge.webhook.silent import SilentMode
from gorge.webhook.summary import Summary
from gorge.webhook.transport import CODE_UNRESOLVED, Attempt, Transport
from gorge.webhook.uripolicy import Target, Unresolvable, UriPolicy, UriRefused
from gorge.webhook.writeback import WriteBack

log = Logger()

# A row claimed ahead is posted only if its lease still outlasts the attempt by
# LEASE_MARGIN (docs/webhook.md, "Claiming and writing back").
LEASE_MARGIN = 1.0


@dataclass(frozen=True)
class Destination:
    """Where a claimed candidate goes: the checked target, or why its host did not resolve."""

    target: Target | None
    unresolved: str = ""


@dataclass(frozen=True)
class Checked:
    """A row that passed every step before the claim."""

    candidate: Candidate
    hook: Hook
    props: payload.Properties
    destination: Destination


@dataclass(frozen=True)
class Claimed:
    """A row this process won, ready to be posted."""

    candidate: Candidate
    hook: Hook
    props: payload.Properties
    destination: Destination
    at: float  # when the claim was won (the dispatcher's clock)


class Delivery:
    """The checks and the claim of a candidate, and the POST of a claimed row."""

    def __init__(
        self,
        *,
        claims: Claims,
        lines: HookLines,
        results: WriteBack,
        transport: Transport,
        policy: UriPolicy,
        breaker: Breaker,
        settings: WebhookSettings,
        clock: IReactorTime,
        metrics: WebhookMetrics,
        summary: Summary,
        batch_clock: IReactorTime,
        silent: SilentMode | None = None,
        locks: HookLocks | None = None,
    ) -> None:
        self._lines = lines
        self._silent = silent
        self._locks = locks
        self._results = results
        self._transport = transport
        self._policy = policy
        self._breaker = breaker
        self._settings = settings
        self._clock = clock
        self._metrics = metrics
        self._summary = summary
        self._stopping = False
        # Claims wait for no window: those asked for in one turn of the reactor
        # (a tick's slots), or while a claim runs, go together.
        self._claims: Coalescer[Candidate, bool] = Coalescer(
            claims.claim_many, batch_clock, window=0.0, cap=settings.max_concurrent
        )

    def stop(self) -> None:
        """Shutdown: nothing more is claimed or retired; running POSTs go on."""
        self._stopping = True

    async def prepare(self, candidate: Candidate) -> Claimed | None:
        """The steps up to the claim; None when the row has been dealt with."""
        checked = await self.check(candidate)
        if checked is None:
            return None
        try:
            if not await self._locked(candidate, checked.hook):
                return None
            if not await self._claim(candidate, checked.hook):
                return None
        except Exception:
            process_failed(candidate)
            return None
        return self.claimed(checked)

    async def check(self, candidate: Candidate) -> Checked | None:
        """The steps before the claim; None when the row has been dealt with."""
        try:
            props = await self._read_properties(candidate)
            if props is None or await self._silenced(candidate, props):
                return None
            hook = await self._usable_hook(candidate, props)
            if hook is None or not await self._breaker_allows(candidate, hook):
                return None
            destination = await self._destination(candidate, hook, props)
            if destination is None or self._stopping:
                return None  # refused, or shutdown before the claim: abandon without a write
        except Exception:
            process_failed(candidate)
            return None
        return Checked(candidate, hook, props, destination)

    def claimed(self, checked: Checked) -> Claimed:
        """A checked row whose claim was just won."""
        return Claimed(
            checked.candidate,
            checked.hook,
            checked.props,
            checked.destination,
            self._clock.seconds(),
        )

    def still_current(self, checked: Checked) -> bool:
        """Checked against the hook row a tick has read since? Then it holds, and
        the row may be claimed without checking it again."""
        return not self._stopping and self._lines.hook(checked.hook.phid) == checked.hook

    def claim_still_covers(self, claimed: Claimed) -> bool:
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

    async def deliver(self, claimed: Claimed) -> tuple[Attempt, float]:
        """Step 7: build, sign and POST; the attempt and how long the POST took."""
        candidate, hook, props = claimed.candidate, claimed.hook, claimed.props
        destination = claimed.destination
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

    # -- the steps before the claim ------------------------------------------

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

    async def _silenced(self, candidate: Candidate, props: payload.Properties) -> bool:
        """Phorge's silent mode: the request is failed as ``hook`` / ``silent``
        without a POST, before any other check, as HeraldWebhookWorker does."""
        if self._silent is None or not self._silent.silent:
            return False
        log.info(
            "WEBHOOK_REQUEST_SILENCED request={request} hook={hook}",
            request=candidate.phid,
            hook=candidate.hook_phid,
        )
        await self._retire(candidate, props.document, payload.CODE_SILENT)
        return True

    async def _usable_hook(self, candidate: Candidate, props: payload.Properties) -> Hook | None:
        """Step 2: the hook, looked up by the tick; a missing or disabled one retires the row."""
        hook = self._lines.hook(candidate.hook_phid)
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
            skipped = 1 + self._lines.drop(hook.phid)
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
    ) -> Destination | None:
        """Step 5: the outbound policy. Refused retires the row; a host that does
        not resolve is still claimed and recorded as a failed attempt."""
        try:
            return Destination(target=await self._policy.check(hook.uri))
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
            return Destination(target=None, unresolved=f"{e.host}: {e.reason}")

    async def _locked(self, candidate: Candidate, hook: Hook) -> bool:
        """Phorge's per-hook lock, held from before the claim until the hook is idle
        here again: someone else holding it (a replica, a Phorge worker) is posting
        to the hook, so its rows wait for a later tick."""
        if self._locks is None or await self._locks.acquire(hook.phid):
            return True
        skipped = 1 + self._lines.drop(hook.phid)
        self._metrics.claims.labels(result="locked").inc(skipped)
        log.debug(
            "WEBHOOK_HOOK_LOCKED request={request} hook={hook} rows={rows}",
            request=candidate.phid,
            hook=hook.phid,
            rows=skipped,
        )
        return False

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
            # Someone else has the row, so its hook too: this hook's later rows
            # wait for a later tick rather than go out beside it or before it.
            self._drop_line(hook.phid)
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

    def _drop_line(self, hook_phid: str) -> None:
        """A statement failed: the hook's other rows would only fail the same way
        (one error line per row); the next tick reads them again."""
        self._lines.drop(hook_phid)

    async def _retire(self, candidate: Candidate, document: dict | None, code: str) -> None:
        if self._stopping:
            return
        await self._results.retire(candidate, document, code)


def process_failed(candidate: Candidate) -> None:
    """An unexpected error in a row's steps: logged with its traceback; the row
    is read again at a later tick."""
    log.failure(
        "WEBHOOK_PROCESS_FAILED request={request}", level=LogLevel.error, request=candidate.phid
    )
