"""Batched claims and result writes: the coalescer on a test clock, the batch
claim raced by several stores on the real MariaDB (and on SQLite), and a batch
write that fails halfway through."""

from __future__ import annotations

import json
import random

import pymysql
import pytest
from twisted.internet import reactor, task
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import deferLater

from gorge.demo.herald_schema import HERALD_SCHEMA
from gorge.webhook.batching import Coalescer
from gorge.webhook.claims import Candidate, Outcome
from gorge.webhook.store import WebhookStore
from tests.webhook.conftest import T0

# -- the coalescer, on a test clock ------------------------------------------


class Flushes:
    """A flush function whose batches the test answers by hand."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.answers: list[Deferred] = []

    async def __call__(self, items: list[str]) -> list[str]:
        self.batches.append(list(items))
        answer: Deferred = Deferred()
        self.answers.append(answer)
        return await answer

    def answer(self, n: int) -> None:
        self.answers[n].callback([item.upper() for item in self.batches[n]])


def results(deferreds: list[Deferred]) -> list:
    out: list = []
    for d in deferreds:
        d.addBoth(out.append)
    return out


def test_items_within_the_window_go_together_and_not_before_it():
    clock, flushes = task.Clock(), Flushes()
    writer: Coalescer[str, str] = Coalescer(flushes, clock, window=0.003, cap=10)
    first = writer.submit("a")
    clock.advance(0.002)
    rest = [writer.submit("b"), writer.submit("c")]
    assert flushes.batches == []
    clock.advance(0.001)  # the window counts from the first item
    assert flushes.batches == [["a", "b", "c"]]
    later = writer.submit("d")  # arrives while the batch runs: waits for it
    clock.advance(1)
    assert flushes.batches == [["a", "b", "c"]]
    flushes.answer(0)
    assert results([first, *rest]) == ["A", "B", "C"]
    assert flushes.batches == [["a", "b", "c"], ["d"]]  # right after, no new window
    flushes.answer(1)
    assert results([later]) == ["D"]
    assert writer.pending == 0


def test_a_full_batch_goes_at_once_and_the_rest_follows():
    clock, flushes = task.Clock(), Flushes()
    writer: Coalescer[str, str] = Coalescer(flushes, clock, window=0.003, cap=2)
    submitted = [writer.submit(x) for x in "abcde"]
    assert flushes.batches == [["a", "b"]]  # no time passed
    flushes.answer(0)
    assert flushes.batches == [["a", "b"], ["c", "d"]]
    flushes.answer(1)
    assert flushes.batches[-1] == ["e"]
    flushes.answer(2)
    assert results(submitted) == ["A", "B", "C", "D", "E"]
    assert clock.getDelayedCalls() == []


def test_a_failed_batch_fails_each_of_its_items_and_the_next_batch_still_runs():
    clock, flushes = task.Clock(), Flushes()
    writer: Coalescer[str, str] = Coalescer(flushes, clock, window=0.0, cap=10)
    failing = [writer.submit("a"), writer.submit("b")]
    clock.advance(0)
    following = writer.submit("c")
    flushes.answers[0].errback(RuntimeError("deadlock"))
    outcomes = results(failing)
    assert [o.value.args for o in outcomes] == [("deadlock",), ("deadlock",)]
    assert flushes.batches == [["a", "b"], ["c"]]
    flushes.answer(1)
    assert results([following]) == ["C"]


def test_an_urgent_item_goes_beside_a_running_batch_while_a_lane_is_free():
    clock, flushes = task.Clock(), Flushes()
    writer: Coalescer[str, str] = Coalescer(flushes, clock, window=0.003, cap=10, lanes=2)
    first = writer.submit("a", urgent=True)
    assert flushes.batches == [["a"]]
    second = writer.submit("b", urgent=True)  # one lane free: goes beside "a"
    assert flushes.batches == [["a"], ["b"]]
    third = writer.submit("c", urgent=True)  # both lanes busy: waits for one
    plain = writer.submit("d")
    clock.advance(1)
    assert flushes.batches == [["a"], ["b"]]
    flushes.answer(1)
    assert flushes.batches == [["a"], ["b"], ["c", "d"]]  # the lane "b" freed
    flushes.answer(0)
    flushes.answer(2)
    assert results([first, second, third, plain]) == ["A", "B", "C", "D"]
    assert writer.pending == 0
    assert clock.getDelayedCalls() == []


def test_items_that_are_not_urgent_never_take_a_second_lane():
    clock, flushes = task.Clock(), Flushes()
    writer: Coalescer[str, str] = Coalescer(flushes, clock, window=0.003, cap=2, lanes=4)
    submitted = [writer.submit(x) for x in "abcde"]
    assert flushes.batches == [["a", "b"]]  # full: at once; the rest waits for it
    clock.advance(1)
    assert flushes.batches == [["a", "b"]]
    flushes.answer(0)
    assert flushes.batches == [["a", "b"], ["c", "d"]]
    flushes.answer(1)
    flushes.answer(2)
    assert results(submitted) == ["A", "B", "C", "D", "E"]


def test_lanes_must_be_at_least_one():
    with pytest.raises(ValueError, match="lanes"):
        Coalescer(Flushes(), task.Clock(), window=0.0, cap=1, lanes=0)


# -- the batch claim raced on MariaDB ------------------------------------------


def candidates_as_read(herald, ids: list[int]) -> dict[int, Candidate]:
    marks = ", ".join(["%s"] * len(ids))
    rows = herald.query(
        "SELECT id, phid, webhookPHID, objectPHID, status, properties, lastRequestResult,"
        f" lastRequestEpoch, dateCreated, dateModified FROM herald_webhookrequest"
        f" WHERE id IN ({marks})",
        tuple(ids),
    )
    return {int(row[0]): Candidate.from_row(row) for row in rows}


@pytest.fixture
def racing_stores(mariadb, herald_db):
    stores = [WebhookStore.mysql(mariadb.settings(herald_db), reactor) for _ in range(3)]
    yield stores
    for store in stores:
        store.close()


async def race(herald, stores: list[WebhookStore], rng: random.Random) -> None:
    """One round: each store offers some of eight fresh rows (in any order, some
    of them at a version already out of date); all claim at the same moment."""
    hook = herald.insert_hook(uri="http://127.0.0.1:1/x")
    ids = [herald.insert_request(hook=hook, created=T0) for _ in range(8)]
    moved = rng.sample(ids, 4)  # claimed once before: a version of their own
    herald.execute(
        f"UPDATE herald_webhookrequest SET dateModified = dateCreated + 1"
        f" WHERE id IN ({', '.join(['%s'] * len(moved))})",
        tuple(moved),
    )
    current = candidates_as_read(herald, ids)
    before = {i: c.version for i, c in current.items()}

    def offer(request_id: int) -> Candidate:
        candidate = current[request_id]
        if rng.random() < 0.2:
            return Candidate(**{**candidate.__dict__, "version": candidate.version - 1})
        return candidate

    batches = [[offer(i) for i in rng.sample(ids, rng.randint(0, 8))] for _ in stores]
    answers = await gatherResults(
        [
            Deferred.fromCoroutine(store.claims.claim_many(batch))
            for store, batch in zip(stores, batches, strict=True)
        ]
    )

    winners: dict[int, int] = {}
    for batch, won in zip(batches, answers, strict=True):
        assert len(won) == len(batch)
        for candidate, claimed in zip(batch, won, strict=True):
            if claimed:
                assert candidate.version == before[candidate.id], "won with an old version"
                winners[candidate.id] = winners.get(candidate.id, 0) + 1
    assert all(n == 1 for n in winners.values()), winners
    after = candidates_as_read(herald, ids)
    offered_current = {c.id for batch in batches for c in batch if c.version == before[c.id]}
    # Every row offered at its current version went to exactly one store, and only
    # the rows won were moved.
    assert set(winners) == offered_current
    assert {i for i in ids if after[i].version != before[i]} == set(winners)


@pytest.mark.parametrize("replicas", [2, 3])
async def test_stores_batch_claiming_the_same_rows_never_both_win_one(
    herald, racing_stores, replicas
):
    rng = random.Random(replicas)  # the same rounds on every run
    for _ in range(30):
        await race(herald, racing_stores[:replicas], rng)


async def test_a_batch_claim_on_sqlite_wins_the_current_rows_only(tmp_path):
    clock = task.Clock()
    clock.advance(T0)
    store = WebhookStore.sqlite(
        str(tmp_path / "herald.sqlite"), reactor, schema=HERALD_SCHEMA, db_clock=clock
    )
    try:

        def seed(txn) -> None:
            for n in range(3):
                txn.execute(
                    "INSERT INTO herald_webhookrequest (phid, webhookPHID, objectPHID, status,"
                    " properties, lastRequestResult, lastRequestEpoch, dateCreated, dateModified)"
                    " VALUES (?, 'PHID-HWBH-a', 'PHID-TASK-a', 'queued', '{}', 'none', 0, ?, ?)",
                    (f"PHID-HWBR-{n}".encode(), T0, T0),
                )

        await store.db.run("seed", seed)
        first = await store.claims.candidates(limit=10, lease=30, backoff=60)
        assert len(first) == 3
        stale = first[0]
        assert await store.claims.claim_many([first[0]]) == [True]
        assert await store.claims.claim_many([first[1], stale, first[2]]) == [True, False, True]
        assert await store.claims.claim_many(first) == [False, False, False]
        versions = await store.db.run(
            "versions",
            lambda txn: txn.execute("SELECT dateModified FROM herald_webhookrequest").fetchall(),
        )
        assert [v for (v,) in versions] == [T0 + 1] * 3
        outcomes = [Outcome(c, "sent", "okay", f'{{"n":{c.id}}}') for c in first]
        assert await store.claims.finish_many(outcomes) == [1, 1, 1]
        rows = await store.db.run(
            "rows",
            lambda txn: txn.execute(
                "SELECT status, lastRequestResult, lastRequestEpoch, properties, dateModified"
                " FROM herald_webhookrequest ORDER BY id"
            ).fetchall(),
        )
        assert rows == [("sent", "okay", T0, f'{{"n":{c.id}}}', T0 + 2) for c in first]
    finally:
        store.close()


# -- a batch write that fails halfway -------------------------------------------


async def wait_until(predicate, what: str) -> None:
    # InnoDB refreshes what information_schema.innodb_trx shows at most every 0.1 s.
    for _ in range(50):
        if predicate():
            return
        await deferLater(reactor, 0.15)
    raise AssertionError(f"{what}: not reached in time")


async def test_a_batch_write_rolled_back_by_a_deadlock_is_written_once_in_full(
    mariadb, herald_db, herald, make_harness
):
    harness = make_harness()
    store = harness.store
    hook = herald.insert_hook(uri="http://127.0.0.1:1/x")
    ids = [herald.insert_request(hook=hook, created=T0) for _ in range(3)]
    padding = [herald.insert_request(hook=hook, status="sent") for _ in range(10)]
    claimed = await store.claims.candidates(limit=10, lease=30, backoff=60)
    assert await store.claims.claim_many(claimed) == [True, True, True]
    rows_claimed = {i: herald.request(i) for i in ids}

    # Another writer holds the last row of the batch, and has changed more rows than
    # the batch will have when they deadlock: InnoDB rolls the batch back.
    other = pymysql.connect(
        host=mariadb.host,
        port=mariadb.port,
        user=mariadb.user,
        password=mariadb.password,
        database=herald_db,
        autocommit=False,
    )
    try:
        with other.cursor() as cur:
            # One row at a time: by primary key, so only these rows are locked.
            for request_id in [*padding, ids[-1]]:
                cur.execute(
                    "UPDATE herald_webhookrequest SET properties = 'other' WHERE id = %s",
                    (request_id,),
                )
        writer: Coalescer[Outcome, int] = Coalescer(
            store.claims.finish_many, reactor, window=0, cap=3
        )
        outcomes = [
            Outcome(c, "queued", "fail", json.dumps({"n": c.id}, separators=(",", ":")))
            for c in claimed
        ]
        written = gatherResults([writer.submit(o) for o in outcomes])
        # Only the last row is held by anyone: a batch that waits has locked the others.
        await wait_until(
            lambda: (
                herald.query(
                    "SELECT COUNT(*) FROM information_schema.innodb_trx"
                    " WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE %s",
                    ("SELECT id, status, dateModified FROM herald_webhookrequest%",),
                )[0][0]
                == 1
            ),
            "the batch waiting for the last row",
        )
        with other.cursor() as cur:  # closes the cycle: the batch is the deadlock's victim
            cur.execute(
                "UPDATE herald_webhookrequest SET properties = 'other' WHERE id = %s", (ids[0],)
            )
        other.rollback()
    finally:
        other.close()

    assert await written == [1, 1, 1]  # each row's outcome reaches its submitter
    stats = store.db.transactions["finish_batch"]
    assert (stats.ok, stats.retries, stats.failed) == (1, 1, 0)
    for candidate, outcome in zip(claimed, outcomes, strict=True):
        row = herald.request(candidate.id)
        before = rows_claimed[candidate.id]
        assert (row["status"], row["lastRequestResult"]) == ("queued", "fail")
        assert row["properties"] == outcome.properties
        # Written once: one write moves the version by exactly one in the pinned second.
        assert row["dateModified"] == before["dateModified"] + 1


# -- claiming the next row during the current POST ----------------------------------


async def test_a_row_claimed_ahead_is_posted_only_while_its_lease_covers_an_attempt(
    herald, receiver, make_harness, captured_log
):
    harness = make_harness(max_concurrent=1, claim_lease=30, delivery_timeout=15)
    first = herald.insert_request(hook=herald.insert_hook(uri=f"{receiver.base}/first"))
    second = herald.insert_request(hook=herald.insert_hook(uri=f"{receiver.base}/second"))
    receiver.delay = 2.0  # the first POST stays open while the test acts
    await Deferred.fromCoroutine(harness.dispatcher.tick())
    await wait_until(lambda: receiver.count() == 1, "the first POST")
    await wait_until(
        lambda: herald.request(second)["dateModified"] != herald.request(second)["dateCreated"],
        "the second row claimed during the first POST",
    )
    # The first POST ran 15 s on the service's clock: the second row's lease (30 s)
    # no longer covers a whole attempt (15 s) and the 1 s margin.
    harness.clock.advance(15)
    assert await harness.dispatcher.wait_idle(20, reactor)

    assert [r.path for r in receiver.requests] == ["/first"]
    assert herald.request(first)["status"] == "sent"
    row = herald.request(second)
    assert (row["status"], row["lastRequestResult"], row["dateModified"]) == (
        "queued",
        "none",
        T0 + 1,
    )
    (expired,) = captured_log.named("WEBHOOK_CLAIM_EXPIRED")
    assert expired["request"] == row["phid"] and expired["waited"] == 15


def test_an_urgent_item_goes_at_once_with_what_is_pending():
    clock, flushes = task.Clock(), Flushes()
    writer: Coalescer[str, str] = Coalescer(flushes, clock, window=0.003, cap=10)
    writer.submit("a")
    writer.submit("b", urgent=True)  # someone waits on it: no window
    assert flushes.batches == [["a", "b"]]
    writer.submit("c", urgent=True)  # a batch runs: right after it
    assert flushes.batches == [["a", "b"]]
    flushes.answer(0)
    assert flushes.batches == [["a", "b"], ["c"]]
    assert clock.getDelayedCalls() == []
