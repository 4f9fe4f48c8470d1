"""The claim protocol on a real MariaDB (gorge/webhook/claims.py): one owner per row."""

from __future__ import annotations

import pytest
from twisted.internet import reactor
from twisted.internet.defer import Deferred, gatherResults

from gorge.webhook import claims
from gorge.webhook.store import WebhookStore
from tests.webhook.conftest import T0

pytestmark = pytest.mark.integration


def test_protocol_statements_are_the_specified_ones():
    # These statements decide who may act (DESIGN.md): changing them is a protocol change.
    assert claims.SQL_CLAIM == (
        "UPDATE herald_webhookrequest"
        " SET dateModified = GREATEST(dateModified + 1, UNIX_TIMESTAMP())"
        " WHERE id = %s AND status = 'queued' AND dateModified = %s"
    )
    assert " WHERE status = 'queued'" in claims.SQL_CANDIDATES
    assert "AND (dateModified = dateCreated OR dateModified <= %s)" in claims.SQL_CANDIDATES
    assert "AND (lastRequestResult <> 'fail' OR lastRequestEpoch <= %s)" in claims.SQL_CANDIDATES
    assert claims.SQL_CANDIDATES.endswith(" ORDER BY id ASC LIMIT %s")
    assert "dateModified = GREATEST(dateModified + 1, UNIX_TIMESTAMP())" in claims.SQL_FINISH
    assert "AND dateModified = %s" in claims.SQL_RETIRE


async def test_same_second_claim_changes_the_version(mariadb, herald, make_harness):
    harness = make_harness()
    hook = herald.insert_hook(uri="http://127.0.0.1:1/x")
    request_id = herald.insert_request(hook=hook, created=T0)
    harness.clock.advance(T0 - harness.clock.seconds())  # the insert's own second
    (candidate,) = await harness.store.claims.candidates(limit=10, lease=30, backoff=60)
    assert candidate.version == T0

    assert await harness.store.claims.claim(candidate) is True
    assert herald.request(request_id)["dateModified"] == T0 + 1
    # A second claimant holding the same old version must lose, in the same second.
    assert await harness.store.claims.claim(candidate) is False
    # And the claimed row is no longer a fresh-row candidate.
    rows = await harness.store.claims.candidates(limit=10, lease=30, backoff=60)
    assert rows == []


async def test_two_stores_racing_for_the_same_candidates(mariadb, herald_db, herald, make_harness):
    hook = herald.insert_hook(uri="http://127.0.0.1:1/x")
    ids = [herald.insert_request(hook=hook, created=T0) for _ in range(20)]
    first = make_harness()
    second = WebhookStore.mysql(mariadb.settings(herald_db), reactor, db_clock=first.clock)
    try:
        a = await first.store.claims.candidates(limit=50, lease=30, backoff=60)
        b = await second.claims.candidates(limit=50, lease=30, backoff=60)
        assert [c.id for c in a] == [c.id for c in b] == ids
        results = await gatherResults(
            [
                Deferred.fromCoroutine(s.claim(c))
                for c in a
                for s in (first.store.claims, second.claims)
            ]
        )
    finally:
        second.close()
    won = [results[i] + results[i + 1] for i in range(0, len(results), 2)]
    assert won == [1] * len(ids)


async def test_two_dispatchers_holding_the_same_candidates_post_each_once(
    herald, receiver, make_harness, captured_log
):
    # One row per hook and one slot each: every claim is a claim of its own
    # (a hook's next row may be claimed with its predecessor's result, and
    # slots' claims in one turn go as one batch: the test below races those).
    for n in range(5):
        hook = herald.insert_hook(uri=f"{receiver.base}/h{n}")
        herald.insert_request(hook=hook, object_phid=f"PHID-TASK-{n:020d}")
    # The claim alone decides here: with the per-hook lock the second
    # dispatcher would not reach the claim of a hook the first one holds.
    one = make_harness(max_concurrent=1, hook_lock=False)
    two = make_harness(clock=one.clock, max_concurrent=1, hook_lock=False)
    # Both dispatchers must reach the claim of a row before either may run it.
    arrivals: dict[int, list[Deferred]] = {}

    def gated(claims):
        claim = claims.claim

        async def both_hold_it(candidate):
            waiting: Deferred = Deferred()
            arrivals.setdefault(candidate.id, []).append(waiting)
            if len(arrivals[candidate.id]) == 2:
                for d in arrivals[candidate.id]:
                    d.callback(None)
            await waiting.addTimeout(10, reactor)
            return await claim(candidate)

        claims.claim = both_hold_it

    gated(one.store.claims)
    gated(two.store.claims)
    await gatherResults(
        [
            Deferred.fromCoroutine(one.dispatcher.tick()),
            Deferred.fromCoroutine(two.dispatcher.tick()),
        ]
    )
    for harness in (one, two):
        assert await harness.dispatcher.wait_idle(20, reactor)

    assert sorted(arrivals) == sorted(
        int(r[0]) for r in herald.query("SELECT id FROM herald_webhookrequest")
    ) and all(len(v) == 2 for v in arrivals.values())
    assert receiver.count() == 5
    assert len({r.body for r in receiver.requests}) == 5
    assert herald.status_counts() == {"sent": 5}
    won = sum(h.metric("gorge_webhook_claims_total", result="won") for h in (one, two))
    lost = sum(h.metric("gorge_webhook_claims_total", result="lost") for h in (one, two))
    assert (won, lost) == (5, 5)
    # Losing a claim is normal with several instances — debug only.
    lost_lines = captured_log.named("WEBHOOK_CLAIM_LOST")
    assert len(lost_lines) == 5 and {e["log_level"].name for e in lost_lines} == {"debug"}


async def test_two_dispatchers_on_one_database_post_each_row_once(herald, receiver, make_harness):
    hooks = [herald.insert_hook(uri=f"{receiver.base}/h{i}") for i in range(3)]
    for n in range(30):
        herald.insert_request(hook=hooks[n % 3], object_phid=f"PHID-TASK-{n:020d}")
    one = make_harness()
    two = make_harness(clock=one.clock)
    await gatherResults(
        [
            Deferred.fromCoroutine(one.dispatcher.tick()),
            Deferred.fromCoroutine(two.dispatcher.tick()),
        ]
    )
    for harness in (one, two):
        assert await harness.dispatcher.wait_idle(20, reactor)
    for _ in range(3):  # whatever either left over
        await one.run_tick()
        await two.run_tick()

    objects = sorted(r.body.split(b'"phid": "', 1)[1].split(b'"', 1)[0] for r in receiver.requests)
    assert objects == sorted(f"PHID-TASK-{n:020d}".encode() for n in range(30))
    assert herald.status_counts() == {"sent": 30}
    won = sum(h.metric("gorge_webhook_claims_total", result="won") for h in (one, two))
    assert won == 30


async def test_a_stale_configuration_failure_never_overwrites_a_delivered_row(herald, make_harness):
    # The retire write is conditional on the version read, so a
    # process holding an old candidate cannot overwrite another's attempt — here
    # a failed retry=forever attempt, which leaves the row queued.
    harness = make_harness()
    hook = herald.insert_hook(uri="http://127.0.0.1:1/x")
    request_id = herald.insert_request(hook=hook, created=T0)
    harness.clock.advance(T0 - harness.clock.seconds())
    (stale,) = await harness.store.claims.candidates(limit=10, lease=30, backoff=60)
    (fresh,) = await harness.store.claims.candidates(limit=10, lease=30, backoff=60)
    assert await harness.store.claims.claim(fresh)
    assert (
        await harness.store.claims.finish(
            fresh, "queued", "fail", '{"retry":"forever","errorType":"http","errorCode":500}'
        )
        == 1
    )
    delivered = herald.request(request_id)
    assert (
        await harness.store.claims.retire(stale, '{"errorType":"hook","errorCode":"disabled"}') == 0
    )
    assert herald.request(request_id) == delivered


async def test_a_batch_says_whether_more_rows_are_due_behind_it(mariadb, herald, make_harness):
    harness = make_harness()
    hook = herald.insert_hook(uri="http://127.0.0.1:1/x")
    for _ in range(5):
        herald.insert_request(hook=hook, created=T0)
    some = await harness.store.claims.candidates(limit=3, lease=30, backoff=60)
    assert (len(some), some.more) == (3, True)
    every = await harness.store.claims.candidates(limit=10, lease=30, backoff=60)
    assert (len(every), every.more) == (5, False)


async def test_rows_claimed_elsewhere_shorten_a_batch_but_not_what_is_waiting(
    mariadb, herald_db, herald, make_harness
):
    # The dispatcher reads "more waiting" from the batch: a batch shortened by
    # rows another writer took meanwhile must still say the queue goes on.
    hook = herald.insert_hook(uri="http://127.0.0.1:1/x")
    for _ in range(6):
        herald.insert_request(hook=hook, created=T0)
    first = make_harness()
    second = WebhookStore.mysql(mariadb.settings(herald_db), reactor, db_clock=first.clock)
    try:
        known = await first.store.claims.candidates(limit=10, lease=30, backoff=60)
        taken = await second.claims.candidates(limit=2, lease=30, backoff=60)
        assert await second.claims.claim_many(taken) == [True, True]
        batch = await first.store.claims.candidates(limit=4, lease=30, backoff=60)
    finally:
        second.close()
    assert len(known) == 6
    assert [c.id for c in batch] == [c.id for c in known[2 : 2 + len(batch)]]
    assert len(batch) < 4 and batch.more is True


async def test_two_dispatchers_on_one_hooks_backlog_post_each_row_once(
    herald, receiver, make_harness
):
    # Every slot but one has no idle hook: each claims its hook's next row
    # with the write of the one before, racing the other dispatcher's claims.
    hook = herald.insert_hook(uri=f"{receiver.base}/one")
    for n in range(20):
        herald.insert_request(hook=hook, object_phid=f"PHID-TASK-{n:020d}")
    one = make_harness()
    two = make_harness(clock=one.clock)
    await gatherResults(
        [
            Deferred.fromCoroutine(one.dispatcher.tick()),
            Deferred.fromCoroutine(two.dispatcher.tick()),
        ]
    )
    for harness in (one, two):
        assert await harness.dispatcher.wait_idle(20, reactor)
    assert herald.status_counts() == {"sent": 20}
    assert receiver.count() == 20
    assert len({r.body for r in receiver.requests}) == 20
    won = sum(h.metric("gorge_webhook_claims_total", result="won") for h in (one, two))
    assert won == 20


async def _hot_hook_pair(herald, harness):
    """Two queued rows of one hook; the first claimed, as a slot holds it."""
    hook = herald.insert_hook(uri="http://127.0.0.1:1/x")
    ids = [herald.insert_request(hook=hook, created=T0) for _ in range(2)]
    first, second = await harness.store.claims.candidates(limit=10, lease=30, backoff=60)
    assert await harness.store.claims.claim(first) is True
    claimed = herald.request(ids[0])["dateModified"]
    first = claims.Candidate(**{**first.__dict__, "version": claimed})
    return ids, first, second


def _sent(candidate, follow):
    return claims.Outcome(candidate, "sent", "okay", "{}", follow=follow)


async def test_a_hot_hooks_result_and_its_next_claim_each_commit(herald, make_harness):
    # One outcome with a follow row on the autocommit connection: two statements,
    # no transaction; the result is written and the next row claimed.
    harness = make_harness()
    ids, first, second = await _hot_hook_pair(herald, harness)
    assert harness.store.db.engine.autocommit
    assert await harness.store.claims.finish_and_follow([_sent(first, second)]) == [(1, True)]
    assert herald.request(ids[0])["status"] == "sent"
    assert herald.request(ids[1])["dateModified"] > second.version  # ours now
    assert herald.request(ids[1])["status"] == "queued"


async def test_a_next_row_changed_elsewhere_is_not_claimed_but_the_result_is_written(
    herald, make_harness
):
    harness = make_harness()
    ids, first, second = await _hot_hook_pair(herald, harness)
    herald.execute(
        "UPDATE herald_webhookrequest SET dateModified = dateModified + 5 WHERE id = %s",
        (ids[1],),
    )
    moved = herald.request(ids[1])["dateModified"]
    assert await harness.store.claims.finish_and_follow([_sent(first, second)]) == [(1, False)]
    assert herald.request(ids[0])["status"] == "sent"
    assert herald.request(ids[1])["dateModified"] == moved  # left to its other claimant


async def test_a_result_not_written_claims_no_next_row(herald, make_harness):
    harness = make_harness()
    ids, first, second = await _hot_hook_pair(herald, harness)
    # Settled by another writer meanwhile (an operator failed it, say).
    herald.execute("UPDATE herald_webhookrequest SET status = 'failed' WHERE id = %s", (ids[0],))
    assert await harness.store.claims.finish_and_follow([_sent(first, second)]) == [(0, False)]
    assert herald.request(ids[0])["status"] == "failed"
    assert herald.request(ids[1])["dateModified"] == second.version  # untouched
