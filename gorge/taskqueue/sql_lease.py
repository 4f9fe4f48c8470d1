"""The SQL store's lease: never-leased rows first, then expired ones, each
claimed by compare-and-set so concurrent claimers never share a task."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import LogLevel

from gorge.log.logger import Logger
from gorge.taskqueue.model import (
    Task,
    check_u32,
)
from gorge.taskqueue.sql_calls import T_COLS, SqlCalls, marks
from gorge.taskqueue.store import (
    log_handed_back,
    outliving_caller,
)

log = Logger()

# Phase 1: never leased and not delayed (r4 predicate).
PHASE1_CANDIDATES = (
    "SELECT id FROM worker_activetask WHERE leaseOwner IS NULL AND leaseExpires IS NULL{classes}"
    " ORDER BY priority, id LIMIT %s"
)
PHASE1_CLAIM = (
    "UPDATE worker_activetask SET leaseOwner = %s, leaseExpires = %s"
    " WHERE id = %s AND leaseOwner IS NULL AND leaseExpires IS NULL"
)
# Phase 2: expired, strictly before now, whoever held it.
PHASE2_CANDIDATES = (
    "SELECT id FROM worker_activetask WHERE leaseExpires < %s{classes}"
    " ORDER BY priority, id LIMIT %s"
)
PHASE2_CLAIM = (
    "UPDATE worker_activetask SET leaseOwner = %s, leaseExpires = %s"
    " WHERE id = %s AND leaseExpires < %s"
)
# The same claims for a whole candidate list in one statement.  Every
# candidate that still matches changes, so a row count equal to the list's
# length means all of them are ours; anything less is a race with another
# claimer, settled by the per-row claims above.
PHASE1_CLAIM_ALL = (
    "UPDATE worker_activetask SET leaseOwner = %s, leaseExpires = %s"
    " WHERE id IN ({ids}) AND leaseOwner IS NULL AND leaseExpires IS NULL"
)
PHASE2_CLAIM_ALL = (
    "UPDATE worker_activetask SET leaseOwner = %s, leaseExpires = %s"
    " WHERE id IN ({ids}) AND leaseExpires < %s"
)
# A claim whose caller went away before the answer: break exactly the leases
# this claim took (owner and expiry), as ``free`` does.
GIVE_BACK = (
    "UPDATE worker_activetask SET leaseOwner = NULL, leaseExpires = %s"
    " WHERE id IN ({ids}) AND leaseOwner = %s AND leaseExpires = %s"
)
FETCH_WON = (
    f"SELECT {T_COLS}, COALESCE(d.data, '') FROM worker_activetask t"
    " LEFT JOIN worker_taskdata d ON d.id = t.dataID"
    " WHERE t.id IN ({ids}) AND t.leaseOwner = %s ORDER BY t.priority, t.id"
)


# A concurrent claimer can take candidates between our SELECT and UPDATE;
# re-select a few times before answering with fewer tasks than asked for.
_CLAIM_ROUNDS = 4


@dataclass(frozen=True)
class _Claimant:
    """Who leases, until when, and which task classes it takes (none: all)."""

    owner: str
    expires: int
    classes: tuple[str, ...]


@dataclass(frozen=True)
class _LeasePhase:
    """One source of leasable rows: the query that finds candidates and the
    two claims that take them, with the parameters both bind after the ids."""

    candidates: str
    claim_one: str
    claim_all: str
    bound: tuple[int, ...]


def _lease_phases(classes: tuple[str, ...], now: int) -> tuple[_LeasePhase, ...]:
    """Never-leased rows first, then rows whose lease has expired."""
    class_sql = f" AND taskClass IN ({marks(len(classes))})" if classes else ""
    return (
        _LeasePhase(
            PHASE1_CANDIDATES.format(classes=class_sql), PHASE1_CLAIM, PHASE1_CLAIM_ALL, ()
        ),
        _LeasePhase(
            PHASE2_CANDIDATES.format(classes=class_sql), PHASE2_CLAIM, PHASE2_CLAIM_ALL, (now,)
        ),
    )


_Take = Callable[[Any, _LeasePhase, _Claimant, list[int]], list[int]]


class _Contended(Exception):
    """A one-statement claim lost some candidates to a concurrent claimer."""


class SqlLeasing(SqlCalls):
    """Lease of :class:`gorge.taskqueue.store.TaskStore` over the worker tables."""

    async def lease(
        self, owner: str, limit: int, lease_duration: int, task_classes: Sequence[str] | None = None
    ) -> list[Task]:
        now = await self._now()
        exp = check_u32("leaseExpires", now + lease_duration)
        classes = tuple(dict.fromkeys(task_classes or ()))
        claim = Deferred.fromCoroutine(
            self.db.run("lease", self._lease_txn, owner, limit, exp, now, classes)
        )
        return await outliving_caller(claim, lambda won: self._give_back(owner, exp, won))

    def _give_back(self, owner: str, exp: int, tasks: list[Task]) -> None:
        if not tasks:
            return
        ids = [task.id for task in tasks]
        log_handed_back(owner, ids)

        def give_back(txn, now: int) -> None:
            self._engine.begin_write(txn)
            self._exec(txn, GIVE_BACK.format(ids=marks(len(ids))), (now, *ids, owner, exp))

        async def giving_back() -> None:
            await self.db.run("give_back", give_back, await self._now())

        d = self._giving_back.track(Deferred.fromCoroutine(giving_back()))
        d.addErrback(
            lambda f: log.failure(
                "TASKQUEUE_LEASE_HAND_BACK_FAILED task_ids={task_ids}",
                f,
                level=LogLevel.error,
                task_ids=ids,
            )
        )

    def _lease_txn(
        self, txn, owner: str, limit: int, exp: int, now: int, classes: tuple[str, ...]
    ) -> list[Task]:
        claimant = _Claimant(owner, exp, classes)
        phases = _lease_phases(classes, now)
        self._engine.begin_write(txn, read_committed=True)
        try:
            won = self._claim_phases(txn, phases, claimant, limit, self._take_all)
        except _Contended:
            # Which rows the statement took is unknowable: undo it and claim
            # row by row, which tells each row's winner.
            txn.execute("ROLLBACK")
            self._engine.begin_write(txn, read_committed=True)
            won = self._claim_phases(txn, phases, claimant, limit, self._take_each)
        if not won:
            return []
        self._exec(txn, FETCH_WON.format(ids=marks(len(won))), (*won, owner))
        return [self._task_row(row, with_data=True) for row in txn.fetchall()]

    def _claim_phases(
        self,
        txn,
        phases: tuple[_LeasePhase, ...],
        claimant: _Claimant,
        limit: int,
        take: _Take,
    ) -> list[int]:
        """Fill the lease from each phase in turn until ``limit`` rows are won."""
        won: list[int] = []
        for phase in phases:
            if len(won) >= limit:
                break
            won += self._claim_rounds(txn, phase, claimant, limit - len(won), take)
        return won

    def _claim_rounds(
        self, txn, phase: _LeasePhase, claimant: _Claimant, want: int, take: _Take
    ) -> list[int]:
        """Read candidates and take them, again while others took some of
        them first, for at most a few rounds."""
        won: list[int] = []
        for _ in range(_CLAIM_ROUNDS):
            need = want - len(won)
            self._exec(txn, phase.candidates, (*phase.bound, *claimant.classes, need))
            ids = [int(r[0]) for r in txn.fetchall()]
            won += take(txn, phase, claimant, ids)
            if len(won) >= want or len(ids) < need:
                break
        return won

    def _take_all(self, txn, phase: _LeasePhase, claimant: _Claimant, ids: list[int]) -> list[int]:
        """One statement for every candidate; a row that another claimer got
        first makes the count fall short and fails the whole attempt."""
        if not ids:
            return []
        self._exec(
            txn,
            phase.claim_all.format(ids=marks(len(ids))),
            (claimant.owner, claimant.expires, *ids, *phase.bound),
        )
        if txn.rowcount != len(ids):
            raise _Contended()
        return ids

    def _take_each(self, txn, phase: _LeasePhase, claimant: _Claimant, ids: list[int]) -> list[int]:
        """One compare-and-set per candidate: each row's count says who won it."""
        won: list[int] = []
        for task_id in ids:
            self._exec(
                txn, phase.claim_one, (claimant.owner, claimant.expires, task_id, *phase.bound)
            )
            if txn.rowcount == 1:
                won.append(task_id)
        return won
