"""The statements that decide who may act on a row: candidates, claims, result writes.

A row is posted only by the process whose compare-and-set claim moved its
``dateModified``; a result is written only over a row still queued
(docs/webhook.md, "Claiming and writing back"). Each statement stands alone
(autocommit) unless a batch needs a few of them to commit together. Every
time value stored into ``dateModified`` / ``lastRequestEpoch`` is the
database's clock, so several instances agree on every window.

Each method tells the queue view what it did, so the next poll does not
offer a row this process already owns or finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gorge.db import Database
from gorge.webhook.observation import Observation
from gorge.webhook.queuedrows import Seen
from gorge.webhook.retryafter import held_second
from gorge.webhook.rows import FAILED, QUEUED, RESULT_FAIL, RESULT_NONE, chunks, marks, text

# A batch write of this many rows or fewer runs the one-row statement per row
# (begin, n writes, commit: no more round trips than lock, write, begin, commit).
PER_ROW_WRITES = 2

# The candidate query, asked only about rows known to be queued and
# due: the two time conditions stay separate and are judged by the database.
SQL_CANDIDATES = (
    "SELECT id, phid, webhookPHID, objectPHID, status, properties,"
    " lastRequestResult, lastRequestEpoch, dateCreated, dateModified"
    " FROM herald_webhookrequest"
    " WHERE status = 'queued' AND id IN ({ids})"
    " AND (dateModified = dateCreated OR dateModified <= %s)"
    " AND (lastRequestResult <> 'fail' OR lastRequestEpoch <= %s)"
    " ORDER BY id ASC"
    " LIMIT %s"
)

# "+ 1" makes a same-second claim still change the version.
SQL_CLAIM = (
    "UPDATE herald_webhookrequest"
    " SET dateModified = GREATEST(dateModified + 1, UNIX_TIMESTAMP())"
    " WHERE id = %s AND status = 'queued' AND dateModified = %s"
)

# A batch claim (docs/webhook.md, "Claiming and writing back") moves every
# candidate's row still at the version it was read at, in one statement. When
# that moved some rows but not all, it is undone and the rows are locked first,
# so the versions read are the ones won.
SQL_LOCK_ROWS = "SELECT id, status, dateModified FROM herald_webhookrequest WHERE id IN ({marks})"

SQL_CLAIM_ROWS = (
    "UPDATE herald_webhookrequest"
    " SET dateModified = GREATEST(dateModified + 1, UNIX_TIMESTAMP())"
    " WHERE id IN ({marks}) AND status = 'queued' AND dateModified = CASE id{versions} END"
)

# A delivery result follows a won claim.
SQL_FINISH = (
    "UPDATE herald_webhookrequest"
    " SET status = %s, lastRequestResult = %s, lastRequestEpoch = UNIX_TIMESTAMP(),"
    " properties = %s, dateModified = GREATEST(dateModified + 1, UNIX_TIMESTAMP())"
    " WHERE id = %s AND status = 'queued'"
)

# The same for several rows at once (a batch write, docs/webhook.md, "Claiming and
# writing back"): each row gets exactly the values SQL_FINISH would give it.
SQL_FINISH_ROWS = (
    "UPDATE herald_webhookrequest"
    " SET status = CASE id{statuses} END, lastRequestResult = CASE id{results} END,"
    " lastRequestEpoch = UNIX_TIMESTAMP(), properties = CASE id{documents} END,"
    " dateModified = GREATEST(dateModified + 1, UNIX_TIMESTAMP())"
    " WHERE id IN ({marks}) AND status = 'queued'"
)

# Configuration failures are written without a claim, so only over the version we read.
SQL_RETIRE = (
    "UPDATE herald_webhookrequest"
    " SET status = 'failed', lastRequestResult = 'none', lastRequestEpoch = 0,"
    " properties = %s, dateModified = GREATEST(dateModified + 1, UNIX_TIMESTAMP())"
    " WHERE id = %s AND status = 'queued' AND dateModified = %s"
)

# A Retry-After hold keeps other replicas off the row by claiming it again
# (docs/webhook.md, "Retry-After and 410 Gone"): dateModified moves to now, as
# every write of ours does, and nothing else changes.
SQL_RENEW_HOLD = SQL_CLAIM

# The database's clock to the microsecond: where a Retry-After wait starts.
SQL_NOW_EXACT = "SELECT UNIX_TIMESTAMP(NOW(6))"


@dataclass(frozen=True)
class Candidate:
    id: int
    phid: str
    hook_phid: str
    object_phid: str
    properties: str
    last_result: str
    last_epoch: int
    date_created: int
    version: int  # dateModified as read: the claim's compare-and-set value

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Candidate:
        return cls(
            id=int(row[0]),
            phid=text(row[1]),
            hook_phid=text(row[2]),
            object_phid=text(row[3]),
            properties=text(row[5]),
            last_result=text(row[6]),
            last_epoch=int(row[7]),
            date_created=int(row[8]),
            version=int(row[9]),
        )


class CandidateBatch(list[Candidate]):
    """The candidates of one poll, oldest first.

    ``more``: the queue view held at least as many due rows as were asked
    for, so more are waiting behind these. The batch itself may be shorter
    than the limit even then: rows claimed or finished while it was read
    are left out.
    """

    more: bool = False


def _seen_candidate(row: Sequence[Any]) -> Seen:
    """The state columns of a row of the candidate query."""
    return Seen(
        id=int(row[0]),
        hook=text(row[2]),
        status=text(row[4]),
        result=text(row[6]),
        epoch=int(row[7]),
        created=int(row[8]),
        modified=int(row[9]),
    )


class BatchConflict(Exception):
    """A batch statement changed other rows than the ones it had locked (rolled back)."""


@dataclass(frozen=True)
class Outcome:
    """A delivery result to write over a row this process claimed.

    ``follow``: the same hook's next row, claimed in the same round trip once
    this result is written (docs/webhook.md, "Claiming and writing back")."""

    candidate: Candidate
    status: str
    result: str
    properties: str
    follow: Candidate | None = None


class Claims:
    """Candidates, claims, result writes and Retry-After holds over the herald table."""

    def __init__(self, db: Database, observation: Observation) -> None:
        self._db = db
        self._engine = db.engine
        self._observation = observation
        self._view = observation.view

    @property
    def db(self) -> Database:
        return self._db

    def _read_candidates(
        self, txn, ids: list[int], lease_cutoff: int, fail_cutoff: int, limit: int
    ):
        rows: list = []
        for chunk in chunks(ids):
            statement = SQL_CANDIDATES.format(ids=marks(len(chunk)))
            self._db.execute(txn, statement, (*chunk, lease_cutoff, fail_cutoff, limit))
            rows.extend(txn.fetchall())
        rows.sort(key=lambda row: int(row[0]))
        answered = {int(row[0]) for row in rows}
        others = self._observation.read_by_id(txn, [i for i in ids if i not in answered])
        return rows, others

    async def candidates(
        self, *, limit: int, lease: int, backoff: int, exclude_hooks: Sequence[str] = ()
    ) -> CandidateBatch:
        """Queued rows due now, oldest first; both cutoffs from one reading of the DB clock."""
        await self._observation.load()
        view = self._view
        view.configure(lease, backoff)
        now = await self._observation.observe()
        ids = view.take(now, limit, exclude_hooks)
        batch = CandidateBatch()
        batch.more = len(ids) >= limit
        if not ids:
            return batch
        stamp = view.stamp()
        rows, others = await self._db.run(
            "candidates", self._read_candidates, ids, now - lease, now - backoff, limit
        )
        answered = set()
        for seen in [_seen_candidate(row) for row in rows] + others:
            view.saw(seen, stamp)
            answered.add(seen.id)
        for request_id in ids:
            if request_id not in answered:
                view.gone(request_id)
        # The read may have found a row claimed elsewhere since the view last
        # looked: the same hook's later rows wait behind it (docs/webhook.md,
        # "Order and replicas").
        ahead = view.first_in_flight_elsewhere()
        batch.extend(
            Candidate.from_row(row)
            for row in rows
            if int(row[0]) < ahead.get(text(row[2]), int(row[0]) + 1)
        )
        return batch

    # -- claims --------------------------------------------------------------

    async def _rowcount(self, statement: str, params: Sequence[Any], *, description: str) -> int:
        def update(txn) -> int:
            self._db.execute(txn, statement, params)
            return txn.rowcount

        return await self._db.run(description, update)

    async def claim(self, candidate: Candidate) -> bool:
        """True iff this process now owns the row (exactly one row changed)."""
        try:
            won = (
                await self._rowcount(
                    SQL_CLAIM, (candidate.id, candidate.version), description="claim"
                )
                == 1
            )
        except Exception:
            self._view.changed_elsewhere(candidate.id, self._view.stamp())
            raise
        stamp = self._view.stamp()
        if won:
            self._view.claimed(candidate.id, candidate.version, stamp)
        else:
            self._view.changed_elsewhere(candidate.id, stamp)
        return won

    async def claim_many(self, candidates: Sequence[Candidate]) -> list[bool]:
        """Claim several candidates at once; for each, True iff this process now owns it.

        One transaction and one compare-and-set statement for all of them. If it
        moved every row, or none, that decides; if it moved some, it is rolled
        back, the rows are locked and read, those still at the version their
        candidate was read at are won and moved again in one statement.
        Whoever locks a row second reads the version the first one wrote, so
        every row has at most one winner.
        """
        if not candidates:
            return []
        if len(candidates) == 1:
            return [await self.claim(candidates[0])]
        try:
            won = await self._db.run("claim_batch", self._claim_rows, list(candidates))
        except Exception:
            stamp = self._view.stamp()
            for candidate in candidates:
                self._view.changed_elsewhere(candidate.id, stamp)
            raise
        stamp = self._view.stamp()
        for candidate in candidates:
            if candidate.id in won:
                self._view.claimed(candidate.id, candidate.version, stamp)
            else:
                self._view.changed_elsewhere(candidate.id, stamp)
        return [candidate.id in won for candidate in candidates]

    def _claim_rows(self, txn, candidates: list[Candidate]) -> set[int]:
        """All rows moved or none: the count says which. Some of them: roll back and
        decide under lock which ones are still at the version read."""
        self._engine.begin_atomic(txn)
        moved = self._move_versions(txn, candidates)
        if moved in (0, len(candidates)):
            self._engine.commit_atomic(txn)
            return {candidate.id for candidate in candidates} if moved else set()
        self._engine.rollback_atomic(txn)
        self._engine.begin_atomic(txn)
        current = self._lock_rows(txn, [candidate.id for candidate in candidates])
        winners = [c for c in candidates if current.get(c.id) == (QUEUED, c.version)]
        if self._move_versions(txn, winners) != len(winners):
            raise BatchConflict(f"not every one of {len(winners)} locked rows was claimed")
        self._engine.commit_atomic(txn)
        return {candidate.id for candidate in winners}

    def _lock_rows(self, txn, ids: list[int]) -> dict[int, tuple[str, int]]:
        """Status and version of each row, locked until the transaction ends."""
        statement = SQL_LOCK_ROWS.format(marks=marks(len(ids))) + self._engine.for_update
        self._db.execute(txn, statement, ids)
        return {int(row[0]): (text(row[1]), int(row[2])) for row in txn.fetchall()}

    def _move_versions(self, txn, candidates: list[Candidate]) -> int:
        """The claim's write for each row still at the version it was read at; the
        rows moved."""
        if not candidates:
            return 0
        statement = SQL_CLAIM_ROWS.format(
            marks=marks(len(candidates)), versions=" WHEN %s THEN %s" * len(candidates)
        )
        versions = [value for c in candidates for value in (c.id, c.version)]
        self._db.execute(txn, statement, [c.id for c in candidates] + versions)
        return int(txn.rowcount)

    # -- result writes -------------------------------------------------------

    async def finish(self, candidate: Candidate, status: str, result: str, properties: str) -> int:
        """Write a delivery outcome; returns the rows changed (0: row gone)."""
        (changed,) = await self.finish_many([Outcome(candidate, status, result, properties)])
        return changed

    async def finish_many(self, outcomes: Sequence[Outcome]) -> list[int]:
        """Write several delivery outcomes in one transaction; the rows changed for
        each (0: row gone). A failure writes none of them."""
        return [changed for changed, _ in await self.finish_and_follow(outcomes)]

    async def finish_and_follow(self, outcomes: Sequence[Outcome]) -> list[tuple[int, bool]]:
        """:meth:`finish_many`, and for each outcome with a ``follow`` row whose
        result was written, that row's claim in the same round trip: per outcome,
        the rows changed and whether its follow row is now ours."""
        follows = [o.follow for o in outcomes if o.follow is not None]
        try:
            if follows:
                written = await self._db.run("finish_follow", self._write_and_claim, list(outcomes))
            else:
                changed = await self._write_outcomes(list(outcomes))
                written = [(count, False) for count in changed]
        except Exception:
            stamp = self._view.stamp()
            for outcome in outcomes:
                self._view.changed_elsewhere(outcome.candidate.id, stamp)
            for follow in follows:
                self._view.changed_elsewhere(follow.id, stamp)
            raise
        stamp = self._view.stamp()
        for outcome, (count, won) in zip(outcomes, written, strict=True):
            self._note_finished(outcome, count, stamp)
            if outcome.follow is None:
                continue
            if won:
                self._view.claimed(outcome.follow.id, outcome.follow.version, stamp)
            else:
                self._view.changed_elsewhere(outcome.follow.id, stamp)
        return written

    def _write_and_claim(self, txn, outcomes: list[Outcome]) -> list[tuple[int, bool]]:
        """Each result, then (when it was written) its follow row's compare-and-set
        claim, in id order, as one transaction."""
        if len(outcomes) == 1 and self._engine.autocommit:
            return [self._write_then_claim(txn, outcomes[0])]
        self._engine.begin_atomic(txn)
        answers: dict[int, tuple[int, bool]] = {}
        for outcome in sorted(outcomes, key=lambda o: o.candidate.id):
            self._db.execute(txn, *self._finish_statement(outcome))
            changed = int(txn.rowcount)
            won = False
            if changed and outcome.follow is not None:
                follow = outcome.follow
                self._db.execute(txn, SQL_CLAIM, (follow.id, follow.version))
                won = txn.rowcount == 1
            answers[outcome.candidate.id] = (changed, won)
        self._engine.commit_atomic(txn)
        return [answers[outcome.candidate.id] for outcome in outcomes]

    def _write_then_claim(self, txn, outcome: Outcome) -> tuple[int, bool]:
        """One hot hook's result and its next row's claim as two statements that
        commit each on its own: two round trips where a transaction takes four
        (the write, then the hook's next POST, waits on them). The claim goes
        only after the write committed, as in the transaction; a claim that
        fails after that counts as lost, so the written result is never taken
        for unwritten (and a claim that did land unseen only waits for its
        lease, as any claim whose answer was lost)."""
        assert outcome.follow is not None
        self._db.execute(txn, *self._finish_statement(outcome))
        changed = int(txn.rowcount)
        if not changed:
            return changed, False
        follow = outcome.follow
        try:
            self._db.execute(txn, SQL_CLAIM, (follow.id, follow.version))
        except Exception:
            # Not logged here (a pool thread): the row is offered again by the
            # next poll, which logs a database that stays away.
            return changed, False
        return changed, txn.rowcount == 1

    async def _write_outcomes(self, outcomes: list[Outcome]) -> list[int]:
        if not outcomes:
            return []
        if len(outcomes) == 1:
            statement, values = self._finish_statement(outcomes[0])
            return [await self._rowcount(statement, values, description="finish")]
        # Rows in id order: the order a batch claim locks them in.
        ordered = sorted(outcomes, key=lambda outcome: outcome.candidate.id)
        changed = await self._db.run("finish_batch", self._write_in_order, ordered)
        by_id = {
            outcome.candidate.id: count for outcome, count in zip(ordered, changed, strict=True)
        }
        return [by_id[outcome.candidate.id] for outcome in outcomes]

    def _write_in_order(self, txn, outcomes: list[Outcome]) -> list[int]:
        """Lock the rows, then write every row still queued in one statement; up to
        PER_ROW_WRITES rows, one statement per row costs no more round trips."""
        self._engine.begin_atomic(txn)
        if len(outcomes) <= PER_ROW_WRITES:
            changed = []
            for outcome in outcomes:
                self._db.execute(txn, *self._finish_statement(outcome))
                changed.append(txn.rowcount)
            self._engine.commit_atomic(txn)
            return changed
        current = self._lock_rows(txn, [outcome.candidate.id for outcome in outcomes])
        queued = [o for o in outcomes if current.get(o.candidate.id, ("", 0))[0] == QUEUED]
        self._write_rows(txn, queued)
        self._engine.commit_atomic(txn)
        written = {outcome.candidate.id for outcome in queued}
        return [int(outcome.candidate.id in written) for outcome in outcomes]

    def _write_rows(self, txn, outcomes: list[Outcome]) -> None:
        if not outcomes:
            return
        cases = " WHEN %s THEN %s" * len(outcomes)
        statement = SQL_FINISH_ROWS.format(
            statuses=cases, results=cases, documents=cases, marks=marks(len(outcomes))
        )
        values: list[Any] = []
        for column in ("status", "result", "properties"):
            values += [v for o in outcomes for v in (o.candidate.id, getattr(o, column))]
        values += [outcome.candidate.id for outcome in outcomes]
        self._db.execute(txn, statement, values)
        if txn.rowcount != len(outcomes):
            raise BatchConflict(f"{txn.rowcount} of {len(outcomes)} locked rows written")

    @staticmethod
    def _finish_statement(outcome: Outcome) -> tuple[str, tuple[Any, ...]]:
        values = (outcome.status, outcome.result, outcome.properties, outcome.candidate.id)
        return SQL_FINISH, values

    def _note_finished(self, outcome: Outcome, changed: int, stamp: int) -> None:
        candidate = outcome.candidate
        if changed:
            self._view.finished(
                candidate.id, candidate.version, outcome.status, outcome.result, stamp
            )
        else:
            self._view.changed_elsewhere(candidate.id, stamp)

    async def retire(self, candidate: Candidate, properties: str) -> int:
        """Configuration failure: failed / none / 0, only over the version read."""
        try:
            changed = await self._rowcount(
                SQL_RETIRE, (properties, candidate.id, candidate.version), description="retire"
            )
        except Exception:
            self._view.changed_elsewhere(candidate.id, self._view.stamp())
            raise
        if changed:
            self._view.finished(
                candidate.id, candidate.version, FAILED, RESULT_NONE, self._view.stamp()
            )
        else:
            self._view.changed_elsewhere(candidate.id, self._view.stamp())
        return changed

    # -- Retry-After holds ------------------------------------------------------

    async def hold(self, candidate: Candidate, delay: float, *, elapsed: float = 0.0) -> int | None:
        """After a failed attempt left the row queued: do not offer it again
        before ``delay`` seconds after the answer arrived, ``elapsed`` seconds
        (this host's clock) before this call. The wait is placed on the
        database's clock read to the microsecond, never on the whole second
        of the write. Returns the second held until, or None when the row is
        due no earlier anyway (or is no longer ours)."""
        stamp = self._view.stamp()
        rows, now = await self._db.run("hold", self._read_held, candidate.id)
        seen = rows[0] if rows else None
        if seen is None or seen.status != QUEUED or seen.result != RESULT_FAIL:
            return None
        arrival = now - Decimal(repr(max(elapsed, 0.0)))
        not_before = held_second(arrival, delay)
        return not_before if self._view.hold(seen, not_before, stamp) else None

    def _read_held(self, txn, request_id: int) -> tuple[list[Seen], Decimal]:
        rows = self._observation.read_by_id(txn, [request_id])
        if self._engine.name == "sqlite":
            # The demo's store: the database's clock is this process's.
            return rows, Decimal(repr(self._db.clock.seconds()))
        self._db.execute(txn, SQL_NOW_EXACT)
        (now,) = txn.fetchone()
        return rows, Decimal(now)

    async def renew_holds(self) -> list[int]:
        """Renew the leases of held rows that need it; returns the ids whose row
        someone else changed meanwhile (the hold is dropped)."""
        due = self._view.renewals(self._view.now)
        if not due:
            return self._view.lost_holds()

        def renew(txn) -> tuple[list[int], list[Seen]]:
            changed = []
            for request_id, version in due:
                self._db.execute(txn, SQL_RENEW_HOLD, (request_id, version))
                if txn.rowcount == 1:
                    changed.append(request_id)
            return changed, self._observation.read_by_id(txn, changed)

        changed, rows = await self._db.run("renew_holds", renew)
        stamp = self._view.stamp()  # an own write is stamped when it has completed
        versions = {seen.id: seen.modified for seen in rows}
        for request_id, _ in due:
            if request_id in versions:
                self._view.renewed(request_id, versions[request_id], stamp)
            else:
                self._view.hold_lost(request_id, stamp)
        return self._view.lost_holds()

    def held_until(self, request_id: int) -> int | None:
        return self._view.held_until(request_id)
