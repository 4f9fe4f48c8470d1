"""The store's view of the queue against the table it watches, for any history of changes.

The real :class:`WebhookStore` runs on an in-memory SQLite database through a
pool that answers at once, so a hypothesis state machine can drive it step by
step while other "replicas", Phorge and its garbage collector change the table
behind its back. After every poll:

* every candidate it returns is queued and due in the table (never more);
* every row due in the table is a candidate, except rows nobody told it about
  (put back to queued from outside, or committed later than the hole window),
  which must be found within one background recount;
* after a full recount its counts equal the table's.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule
from twisted.internet import task
from twisted.internet.defer import Deferred, fail, succeed

from gorge.db import Database, SQLiteEngine
from gorge.demo.herald_schema import HERALD_SCHEMA
from gorge.webhook import observation, queueview
from gorge.webhook.queuedrows import Seen
from gorge.webhook.queueview import QueueView
from gorge.webhook.store import DATABASE_NAME, WebhookStore
from tests.webhook.conftest import T0

LEASE, BACKOFF = 30, 60
HOOKS = ("PHID-HWBH-a", "PHID-HWBH-b", "PHID-HWBH-c")


class ImmediatePool:
    """adbapi's runInteraction, run on the spot: the store's coroutines finish synchronously."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def runInteraction(self, fn, *args):
        cursor = self.conn.cursor()
        try:
            return succeed(fn(cursor, *args))
        except Exception:  # noqa: BLE001 - handed to the caller, as adbapi does
            return fail()
        finally:
            cursor.close()

    def close(self) -> None:
        pass


def done(coroutine):
    """The result of a store call that could only wait on answered Deferreds."""
    d = Deferred.fromCoroutine(coroutine)
    results: list = []
    d.addBoth(results.append)
    assert results, "the store waited on something"
    if hasattr(results[0], "raiseException"):
        results[0].raiseException()
    return results[0]


@dataclass
class Reserved:
    id: int
    at: int


class QueueMachine(RuleBasedStateMachine):
    """One store watching a table that others change."""

    @initialize()
    def start(self) -> None:
        self.clock = task.Clock()
        self.clock.advance(T0)
        self.conn = sqlite3.connect(":memory:", isolation_level=None)
        self.engine = SQLiteEngine(schema=HERALD_SCHEMA, clock=self.clock)
        self.engine.open_connection(self.conn)
        self.next_id = 1
        self.reserved: list[Reserved] = []
        self.surprises: set[int] = set()  # queued behind the store's back
        self.deleted: set[int] = set()  # by the garbage collector, since the last settle
        # Finished by another replica since the last settle: while an earlier row
        # of its hook is under a claim, no poll reads it, so the view may still
        # hold it until that row is written or the recount passes.
        self.finished_elsewhere: set[int] = set()
        self.candidates: list = []
        self.store = self.new_store()

    def new_store(self) -> WebhookStore:
        return WebhookStore(
            Database(self.engine, ImmediatePool(self.conn), self.clock, name=DATABASE_NAME)
        )

    @property
    def now(self) -> int:
        return int(self.clock.seconds())

    def rows(self, where: str = "1", params: tuple = ()) -> list[tuple]:
        return self.conn.execute(
            "SELECT id, status, lastRequestResult, lastRequestEpoch, dateCreated, dateModified"
            f" FROM herald_webhookrequest WHERE {where} ORDER BY id",
            params,
        ).fetchall()

    def due_in_table(self) -> set[int]:
        return {
            r[0]
            for r in self.rows(
                "status = 'queued' AND (dateModified = dateCreated OR dateModified <= ?)"
                " AND (lastRequestResult <> 'fail' OR lastRequestEpoch <= ?)",
                (self.now - LEASE, self.now - BACKOFF),
            )
        }

    def behind_in_flight(self, due: set[int]) -> set[int]:
        """Due rows that may wait: a row of the same hook before them is under a
        claim for its first attempt (a replica posting it, or one that died),
        so the hook's order keeps them back until that row is written or due."""
        first: dict[str, int] = {}
        for request_id, hook in self.conn.execute(
            "SELECT id, webhookPHID FROM herald_webhookrequest WHERE status = 'queued'"
            " AND lastRequestResult <> 'fail' AND dateModified <> dateCreated"
            " AND dateModified > ?",
            (self.now - LEASE,),
        ):
            hook = bytes(hook).decode() if isinstance(hook, (bytes, memoryview)) else hook
            first[hook] = min(first.get(hook, request_id), request_id)
        behind = set()
        for request_id, hook in self.conn.execute(
            "SELECT id, webhookPHID FROM herald_webhookrequest WHERE status = 'queued'"
        ):
            hook = bytes(hook).decode() if isinstance(hook, (bytes, memoryview)) else hook
            if request_id in due and hook in first and request_id > first[hook]:
                behind.add(request_id)
        return behind

    def insert(self, request_id: int, hook: str, status: str) -> None:
        result = {"queued": "none", "sent": "okay", "failed": "fail"}[status]
        self.conn.execute(
            "INSERT INTO herald_webhookrequest (id, phid, webhookPHID, objectPHID, status,"
            " properties, lastRequestResult, lastRequestEpoch, dateCreated, dateModified)"
            " VALUES (?, ?, ?, 'PHID-TASK-x', ?, '{}', ?, ?, ?, ?)",
            (
                request_id,
                f"PHID-HWBR-{request_id}".encode(),
                hook.encode(),
                status,
                result,
                self.now if status != "queued" else 0,
                self.now,
                self.now,
            ),
        )

    # -- Phorge and the other replicas --------------------------------------

    @rule(
        hook=st.sampled_from(HOOKS),
        status=st.sampled_from(["queued", "queued", "queued", "sent", "failed"]),
    )
    def phorge_inserts(self, hook, status) -> None:
        self.insert(self.next_id, hook, status)
        self.next_id += 1

    @rule(count=st.integers(1, 3))
    def ids_handed_out_not_committed(self, count) -> None:
        for _ in range(count):
            self.reserved.append(Reserved(self.next_id, self.now))
            self.next_id += 1

    @precondition(lambda self: self.reserved)
    @rule(data=st.data(), hook=st.sampled_from(HOOKS))
    def late_commit(self, data, hook) -> None:
        late = self.reserved.pop(data.draw(st.integers(0, len(self.reserved) - 1)))
        self.insert(late.id, hook, "queued")
        view = self.store.view
        if self.now - late.at >= queueview.HOLE_SECONDS or (
            view.loaded and late.id <= view.loaded_upto
        ):
            # Later than the hole window, or below the ids a (re)start watches.
            self.surprises.add(late.id)

    @precondition(lambda self: self.rows("status <> 'queued'"))
    @rule(data=st.data())
    def put_back_to_queued(self, data) -> None:
        request_id = data.draw(st.sampled_from([r[0] for r in self.rows("status <> 'queued'")]))
        self.conn.execute(
            "UPDATE herald_webhookrequest SET status = 'queued', dateModified = ? WHERE id = ?",
            (self.now, request_id),
        )
        self.surprises.add(request_id)

    @precondition(lambda self: self.rows("status <> 'queued'"))
    @rule(data=st.data())
    def another_replica_replays(self, data) -> None:
        request_id = data.draw(st.sampled_from([r[0] for r in self.rows("status <> 'queued'")]))
        self.conn.execute(
            "UPDATE herald_webhookrequest SET status = 'queued',"
            " lastRequestResult = 'none', lastRequestEpoch = 0,"
            " dateModified = dateCreated WHERE id = ?",
            (request_id,),
        )
        self.surprises.add(request_id)  # this store learns of it at its recount

    @precondition(lambda self: self.due_in_table())
    @rule(data=st.data(), outcome=st.sampled_from(["claim", "sent", "failed", "retry"]))
    def another_replica(self, data, outcome) -> None:
        # Another replica only ever claims a row the candidate query returned: a due one.
        request_id = data.draw(st.sampled_from(sorted(self.due_in_table())))
        bump = "dateModified = MAX(dateModified + 1, ?)"
        if outcome == "claim":
            self.conn.execute(
                f"UPDATE herald_webhookrequest SET {bump} WHERE id = ?", (self.now, request_id)
            )
            return
        status, result = {
            "sent": ("sent", "okay"),
            "failed": ("failed", "fail"),
            "retry": ("queued", "fail"),
        }[outcome]
        self.conn.execute(
            f"UPDATE herald_webhookrequest SET {bump}, status = ?, lastRequestResult = ?,"
            " lastRequestEpoch = ? WHERE id = ?",
            (self.now, status, result, self.now, request_id),
        )
        if status != "queued":
            self.finished_elsewhere.add(request_id)

    @precondition(lambda self: self.rows())
    @rule(count=st.integers(1, 5))
    def garbage_collector(self, count) -> None:
        oldest = [r[0] for r in self.rows()][:count]
        self.conn.execute(
            "DELETE FROM herald_webhookrequest WHERE id IN (SELECT id FROM"
            " herald_webhookrequest ORDER BY id LIMIT ?)",
            (count,),
        )
        self.deleted.update(oldest)

    @rule(seconds=st.sampled_from([0, 1, 5, 29, 31, 61, 90]))
    def time_passes(self, seconds) -> None:
        self.clock.advance(seconds)

    # -- this store --------------------------------------------------------

    @rule()
    def poll(self) -> None:
        self.candidates = done(
            self.store.claims.candidates(limit=10_000, lease=LEASE, backoff=BACKOFF)
        )
        done(self.store.claims.renew_holds())  # as every tick does after its candidates
        returned = [c.id for c in self.candidates]
        assert returned == sorted(returned)
        due = self.due_in_table()
        assert set(returned) <= due, "a candidate that is not due"
        assert not [i for i in returned if self.store.claims.held_until(i)], "offered while held"
        # A row held for a Retry-After is not offered before its time, even when
        # its lease lapsed because no poll renewed it for longer than the lease.
        held = {i for i in due if self.store.claims.held_until(i)}
        missing = due - set(returned) - self.surprises - held - self.behind_in_flight(due)
        assert not missing, f"due rows not returned: {sorted(missing)}"
        known = set(self.store.view.known())
        queued = {r[0] for r in self.rows("status = 'queued'")}
        # A deleted row is forgotten once due, or when its block is recounted.
        gone = self.deleted | self.finished_elsewhere
        assert known - gone <= queued, sorted(known - gone - queued)
        assert queued - self.surprises <= known, sorted(queued - self.surprises - known)

    @precondition(lambda self: self.rows("status <> 'queued'"))
    @rule(data=st.data())
    def replay_here(self, data) -> None:
        """Through this store: offered at the next poll, no recount needed."""
        request_id = data.draw(st.sampled_from([r[0] for r in self.rows("status <> 'queued'")]))
        replay = done(self.store.history.replay(request_id))
        assert replay is not None and replay.after.status == "queued"
        assert self.store.view.knows(request_id)

    @precondition(lambda self: self.candidates)
    @rule(
        data=st.data(),
        outcome=st.sampled_from(
            ["sent", "failed", "retry", "retire", "claim-and-die", "retry-after"]
        ),
    )
    def deliver(self, data, outcome) -> None:
        candidate = data.draw(st.sampled_from(self.candidates))
        self.candidates = [c for c in self.candidates if c.id != candidate.id]
        if outcome == "retire":
            done(self.store.claims.retire(candidate, "{}"))
            return
        if not done(self.store.claims.claim(candidate)):
            return
        if outcome == "claim-and-die":
            self.store = self.new_store()
            return
        status, result = {
            "sent": ("sent", "okay"),
            "failed": ("failed", "fail"),
            "retry": ("queued", "fail"),
            "retry-after": ("queued", "fail"),
        }[outcome]
        if (
            done(self.store.claims.finish(candidate, status, result, "{}"))
            and outcome == "retry-after"
        ):
            delay = data.draw(st.sampled_from([5, 100, 300]))
            until = done(self.store.claims.hold(candidate, delay))
            assert until is None or until > self.now

    @rule()
    def restart(self) -> None:
        self.store = self.new_store()
        self.candidates = []

    @rule()
    def settle(self) -> None:
        """Poll once a second through one full background recount: nothing may stay unseen."""
        view = self.store.view
        for _ in range(view.cursor // int(observation.SWEEP_RATE) + 3):
            self.clock.advance(1)
            self.poll()
        self.surprises = set()
        self.deleted = set()
        self.finished_elsewhere = set()
        self.poll()
        counts = {
            status: n
            for status, n in self.conn.execute(
                "SELECT status, COUNT(*) FROM herald_webhookrequest GROUP BY status"
            )
        }
        assert tuple(view.counts()) == (
            counts.get("queued", 0),
            counts.get("sent", 0),
            counts.get("failed", 0),
        )
        for hook in HOOKS:
            (queued,) = self.conn.execute(
                "SELECT COUNT(*) FROM herald_webhookrequest WHERE status = 'queued'"
                " AND webhookPHID = ?",
                (hook.encode(),),
            ).fetchone()
            assert view.queued_for_hook(hook) == queued
        # Each hook's oldest queued row is its lowest id (ids grow with creation).
        oldest = {
            phid.decode(): max(view.now - created, 0)
            for phid, created in self.conn.execute(
                "SELECT webhookPHID, dateCreated FROM herald_webhookrequest AS r"
                " WHERE status = 'queued' AND id = (SELECT MIN(id) FROM herald_webhookrequest"
                " WHERE status = 'queued' AND webhookPHID = r.webhookPHID)"
            )
        }
        assert view.oldest_queued() == oldest


QueueMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


@pytest.fixture
def small_start_up(monkeypatch):
    # The start-up pass and its hand-over to the new-id scan on tables of a few dozen rows.
    monkeypatch.setattr(observation, "START_OVERLAP", 3)


def test_the_view_follows_the_table(small_start_up):
    QueueMachine.TestCase("runTest").runTest()


# -- the view alone --------------------------------------------------------------


def seen(
    request_id: int,
    *,
    status: str = "queued",
    hook: str = "h",
    created: int = 100,
    modified: int | None = None,
    result: str = "none",
    epoch: int = 0,
) -> Seen:
    return Seen(
        request_id, hook, status, result, epoch, created, created if modified is None else modified
    )


def loaded_view() -> QueueView:
    view = QueueView()
    view.configure(lease=LEASE, backoff=BACKOFF)
    view.finish_load(0, None)
    return view


def test_take_is_oldest_first_across_hooks_and_skips_excluded_hooks():
    view = loaded_view()
    view.scanned(
        [seen(1, hook="b"), seen(2, hook="a"), seen(3, hook="b"), seen(5, hook="c")],
        5,
        view.stamp(),
        0.0,
    )
    assert view.take(100, 10) == [1, 2, 3, 5]
    assert view.take(100, 2) == [1, 2]
    assert view.take(100, 10, exclude=["b"]) == [2, 5]
    assert view.holes() == [4]


def test_a_row_becomes_due_at_the_later_of_lease_and_backoff():
    view = loaded_view()
    view.scanned(
        [seen(1, modified=110), seen(2, modified=110, result="fail", epoch=110)],
        2,
        view.stamp(),
        0.0,
    )
    assert view.take(139, 10) == []
    assert view.take(140, 10) == [1]
    assert view.take(169, 10) == [1]
    assert view.take(170, 10) == [1, 2]


def test_a_read_issued_before_our_own_write_is_ignored():
    view = loaded_view()
    view.scanned([seen(1)], 1, view.stamp(), 0.0)
    before_claim = view.stamp()
    view.claimed(1, 100, view.stamp())
    view.saw(seen(1), before_claim)  # answered after the claim: the unclaimed state
    assert view.take(100, 10) == []  # still leased by us
    view.finished(1, 100, "sent", "okay", view.stamp())
    view.saw(seen(1), before_claim)
    assert not view.knows(1) and view.counts() == (0, 1, 0)


@pytest.mark.parametrize("gap", [queueview.MAX_GAP, queueview.MAX_GAP + 1])
def test_only_narrow_gaps_are_tracked_as_holes(gap):
    view = loaded_view()
    view.scanned([seen(1), seen(2 + gap)], 2 + gap, view.stamp(), 0.0)
    assert len(view.holes()) == (gap if gap <= queueview.MAX_GAP else 0)


def test_holes_expire():
    view = loaded_view()
    view.scanned([seen(3)], 3, view.stamp(), 10.0)
    view.holes_checked([], view.stamp(), 10.0 + queueview.HOLE_SECONDS - 1)
    assert view.holes() == [1, 2]
    view.holes_checked([seen(1)], view.stamp(), 10.0 + queueview.HOLE_SECONDS)
    assert view.holes() == [] and view.knows(1)


def test_each_hook_s_backlog_age_is_its_oldest_queued_row_s_and_on_metrics():
    from prometheus_client import CollectorRegistry, generate_latest

    from gorge.webhook.metrics import BacklogAge

    view = loaded_view()
    view.scanned(
        [seen(1, hook="b", created=40), seen(2, hook="a", created=90), seen(3, hook="b")],
        3,
        view.stamp(),
        0.0,
    )
    assert view.oldest_queued() == {"b": 0, "a": 0}  # no database second seen yet
    view.take(100, 0)
    assert view.oldest_queued() == {"b": 60, "a": 10}
    registry = CollectorRegistry()
    registry.register(BacklogAge(view.oldest_queued))
    lines = [
        line
        for line in generate_latest(registry).decode().splitlines()
        if line.startswith("gorge_webhook_oldest_queued_seconds{")
    ]
    assert lines == [
        'gorge_webhook_oldest_queued_seconds{hook="a"} 10.0',
        'gorge_webhook_oldest_queued_seconds{hook="b"} 60.0',
    ]
    view.saw(seen(1, hook="b", status="sent", created=40), view.stamp())
    assert view.oldest_queued() == {"b": 0, "a": 10}
