"""Polling on a table holding a long delivery history (Phorge's stock keys, no index on status).

Every behaviour of the queue protocol (exactly once across replicas, per-hook
order, retries, abandoned claims, late commits, requeued rows, the breaker,
stats) is checked here with 50,000 finished rows under the live ones, and
every statement the store issues is run through EXPLAIN.
"""

from __future__ import annotations

import json
import re

import pytest
from twisted.internet import reactor
from twisted.internet.defer import Deferred, gatherResults

from gorge.webhook import claims, observation, queueview, recount
from gorge.webhook import history as delivery_history
from gorge.webhook.store import WebhookStore
from gorge_testing.herald_history import fill_history
from tests.webhook.conftest import T0

pytestmark = pytest.mark.integration

HISTORY = 50_000
OLD = T0 - 3 * 86400  # the history is three days old: outside every window


@pytest.fixture
def history(herald):
    """50,000 finished rows of two old hooks; returns the highest history id."""
    fill_history(
        herald.conn,
        HISTORY,
        ["PHID-HWBH-oldoldoldoldoldold01", "PHID-HWBH-oldoldoldoldoldold02"],
        created=OLD,
    )
    (highest,) = herald.query("SELECT MAX(id) FROM herald_webhookrequest")[0]
    assert herald.status_counts() == {"sent": HISTORY * 9 // 10, "failed": HISTORY // 10}
    return highest


def rows_read(herald) -> int:
    """Rows handed out by the storage engine so far, all sessions (Handler_read_*)."""
    return sum(int(value) for _, value in herald.query("SHOW GLOBAL STATUS LIKE 'Handler_read%%'"))


async def tick_reading(herald, harness) -> int:
    """Run one poll (and what it starts); how many InnoDB rows it read."""
    before = rows_read(herald)
    await harness.run_tick()
    return rows_read(herald) - before


async def test_an_idle_poll_reads_no_history_and_a_new_row_goes_out_at_once(
    herald, history, receiver, make_harness
):
    harness = make_harness()
    hook = herald.insert_hook(uri=f"{receiver.base}/a")
    await harness.run_tick()  # the start-up pass reads the table once
    assert await tick_reading(herald, harness) < 50
    harness.clock.advance(1)  # the background recount's share of one second
    assert await tick_reading(herald, harness) <= 4 * recount.BLOCK + 50

    request_id = herald.insert_request(hook=hook, created=int(harness.clock.seconds()))
    read = await tick_reading(herald, harness)
    assert herald.request(request_id)["status"] == "sent"
    assert receiver.count("/a") == 1
    assert read < 100


async def test_start_up_finds_every_queued_row_under_the_history(herald, receiver, make_harness):
    hook = herald.insert_hook(uri=f"{receiver.base}/a")
    old_queued = herald.insert_request(hook=hook, created=OLD)  # first, lowest id
    fill_history(herald.conn, HISTORY, [hook], created=OLD)
    newest = herald.insert_request(hook=hook, created=T0)
    harness = make_harness()
    stats = await harness.store.observation.stats()
    assert (stats.queued, stats.sent, stats.failed) == (2, HISTORY * 9 // 10, HISTORY // 10)
    await harness.run_tick()
    assert [r.body for r in receiver.requests] and receiver.count("/a") == 2
    # Oldest first: the old row went out before the new one.
    first, second = (json.loads(r.body)["action"]["epoch"] for r in receiver.requests)
    assert (first, second) == (OLD, T0)
    assert herald.request(old_queued)["status"] == herald.request(newest)["status"] == "sent"


async def test_per_hook_order_and_fairness_with_a_long_history(
    herald, history, receiver, make_harness
):
    harness = make_harness(max_concurrent=2)
    await harness.run_tick()
    busy = herald.insert_hook(uri=f"{receiver.base}/busy")
    other = herald.insert_hook(uri=f"{receiver.base}/other")
    now = int(harness.clock.seconds())
    ids = [
        herald.insert_request(hook=busy, created=now, object_phid=f"PHID-TASK-{n:020d}")
        for n in range(30)
    ]
    late = herald.insert_request(hook=other, created=now)
    receiver.delay = 0.02
    # The busy hook's answers wait for the other hook's request: if the other
    # row were queued behind the backlog, the busy hook would time out.
    receiver.hold_until_arrived["/busy"] = "/other"
    await harness.run_tick()
    busy_objects = [
        json.loads(r.body)["object"]["phid"] for r in receiver.requests if r.path == "/busy"
    ]
    assert busy_objects == [f"PHID-TASK-{n:020d}" for n in range(30)]
    # One delivery at a time per hook, and the other hook's row went out beside
    # the busy hook's backlog, not behind it.
    assert (receiver.peak_per_path, receiver.peak_total) == (1, 2)
    assert all(herald.request(i)["status"] == "sent" for i in ids + [late])


async def test_two_replicas_deliver_each_new_row_exactly_once(
    herald, history, receiver, make_harness
):
    hooks = [herald.insert_hook(uri=f"{receiver.base}/h{i}") for i in range(3)]
    one = make_harness()
    two = make_harness(clock=one.clock)
    await one.run_tick()
    await two.run_tick()
    for n in range(30):
        herald.insert_request(
            hook=hooks[n % 3], object_phid=f"PHID-TASK-{n:020d}", created=int(one.clock.seconds())
        )
    await gatherResults(
        [
            Deferred.fromCoroutine(one.dispatcher.tick()),
            Deferred.fromCoroutine(two.dispatcher.tick()),
        ]
    )
    for harness in (one, two):
        assert await harness.dispatcher.wait_idle(20, reactor)
    for _ in range(2):
        await one.run_tick()
        await two.run_tick()
    objects = sorted(json.loads(r.body)["object"]["phid"] for r in receiver.requests)
    assert objects == [f"PHID-TASK-{n:020d}" for n in range(30)]
    won = sum(h.metric("gorge_webhook_claims_total", result="won") for h in (one, two))
    assert won == 30
    for harness in (one, two):
        stats = await harness.store.observation.stats()
        assert (stats.queued, stats.sent) == (0, HISTORY * 9 // 10 + 30)


async def test_a_failed_row_is_retried_after_the_backoff_by_any_replica(
    herald, history, receiver, make_harness
):
    one = make_harness()
    two = make_harness(clock=one.clock)
    await two.run_tick()  # the second replica is running before the row exists
    hook = herald.insert_hook(uri=f"{receiver.base}/status/500")
    request_id = herald.insert_request(
        hook=hook, created=int(one.clock.seconds()), properties={"retry": "forever"}
    )
    await one.run_tick()
    assert receiver.count() == 1
    row = herald.request(request_id)
    assert (row["status"], row["lastRequestResult"]) == ("queued", "fail")
    # The first replica is gone (and its session with the hook's lock); the
    # second knew the row and waits out the backoff.
    one.service.part("locks").close()
    one.clock.advance(59)
    await two.run_tick()
    assert receiver.count() == 1
    one.clock.advance(2)
    await two.run_tick()
    assert receiver.count() == 2
    assert herald.request(request_id)["lastRequestEpoch"] == int(one.clock.seconds())


@pytest.mark.parametrize("second_started", ["before", "after"])
async def test_a_row_claimed_by_a_replica_that_died_goes_out_after_the_lease(
    herald, history, receiver, make_harness, second_started
):
    first = make_harness()
    hook = herald.insert_hook(uri=f"{receiver.base}/a")
    second = make_harness(clock=first.clock) if second_started == "before" else None
    if second is not None:
        await second.run_tick()
    request_id = herald.insert_request(hook=hook, created=int(first.clock.seconds()))
    (candidate,) = await first.store.claims.candidates(limit=10, lease=30, backoff=60)
    assert await first.store.claims.claim(candidate)  # and then the process died
    if second is None:
        second = make_harness(clock=first.clock)
    first.clock.advance(29)
    await second.run_tick()
    assert receiver.count() == 0
    first.clock.advance(2)
    await second.run_tick()
    assert receiver.count("/a") == 1
    assert herald.request(request_id)["status"] == "sent"


def insert_with_id(herald, request_id: int, hook: str, created: int) -> None:
    herald.execute(
        "INSERT INTO herald_webhookrequest (id, phid, webhookPHID, objectPHID, status,"
        " properties, lastRequestResult, lastRequestEpoch, dateCreated, dateModified)"
        " VALUES (%s, %s, %s, 'PHID-TASK-late', 'queued', '{}', 'none', 0, %s, %s)",
        (request_id, f"PHID-HWBR-late{request_id}", hook, created, created),
    )


async def test_a_lower_id_committed_after_a_higher_one_is_picked_up(
    herald, history, receiver, make_harness
):
    harness = make_harness()
    hook = herald.insert_hook(uri=f"{receiver.base}/a")
    await harness.run_tick()
    now = int(harness.clock.seconds())
    # Ids +1 … +4 above the history went to transactions that have not
    # committed yet; +5 commits first.
    insert_with_id(herald, history + 5, hook, now)
    await harness.run_tick()
    assert receiver.count() == 1
    harness.clock.advance(20)  # a slow transaction, within the hole window
    insert_with_id(herald, history + 3, hook, now)
    # Looked up by id (the rest is the background recount's share of 20 s).
    assert await tick_reading(herald, harness) <= 4 * recount.BLOCK + 100
    assert receiver.count() == 2
    # Later than the hole window: the background recount finds it, within one pass.
    harness.clock.advance(queueview.HOLE_SECONDS)
    await harness.run_tick()
    insert_with_id(herald, history + 4, hook, now)
    await sweep_until(harness, lambda: receiver.count() == 3)
    assert herald.status_counts()["sent"] == HISTORY * 9 // 10 + 3


async def sweep_until(harness, done) -> None:
    """Poll once a second (of the test clock) until ``done``, within one full recount."""
    polls = harness.store.view.cursor // int(observation.SWEEP_RATE) + 3
    for _ in range(polls):
        harness.clock.advance(1)
        await harness.run_tick()
        if done():
            return
    raise AssertionError(f"not done after {polls} polls")


async def test_a_row_put_back_to_queued_from_outside_is_found_within_one_recount(
    herald, history, receiver, make_harness, captured_log
):
    harness = make_harness()
    hook = herald.insert_hook(uri=f"{receiver.base}/a")
    request_id = herald.insert_request(hook=hook, created=int(harness.clock.seconds()))
    await harness.run_tick()
    assert herald.request(request_id)["status"] == "sent"
    # What a "retry" by an operator does: status back to queued, Lisk's dateModified.
    now = int(harness.clock.seconds())
    herald.execute(
        "UPDATE herald_webhookrequest SET status = 'queued', dateModified = %s WHERE id = %s",
        (now, request_id),
    )
    await sweep_until(harness, lambda: receiver.count("/a") == 2)
    assert herald.request(request_id)["status"] == "sent"
    assert captured_log.named("WEBHOOK_QUEUED_ROWS_FOUND")[0]["rows"] == 1


async def test_an_open_breaker_backlog_is_not_reread_and_the_count_uses_key_ratelimit(
    herald, history, receiver, make_harness
):
    harness = make_harness(max_concurrent=2)
    broken = herald.insert_hook(uri=f"{receiver.base}/status/500")
    now = int(harness.clock.seconds())
    # Old failures of the broken hook fill the history's range of key_ratelimit.
    fill_history(herald.conn, 5000, [broken], created=OLD - 1, failed_every=1)
    for _ in range(10):
        herald.insert_request(
            hook=broken, status="failed", result="fail", epoch=now, created=now - 10, modified=now
        )
    for _ in range(100):
        herald.insert_request(hook=broken, created=now - 5, properties={"retry": "forever"})
    await harness.run_tick()  # finds the breaker open
    assert harness.metric("gorge_webhook_open_breaker_rows") == 100
    healthy = herald.insert_hook(uri=f"{receiver.base}/ok")
    new_row = herald.insert_request(hook=healthy, created=now)
    # Ids the bulk fill reserved and never used are looked up, one each, as holes.
    assert await tick_reading(herald, harness) < 100 + len(harness.store.view.holes())
    assert herald.request(new_row)["status"] == "sent"
    assert receiver.count("/status/500") == 0


async def test_garbage_collected_rows_are_forgotten_and_a_recreated_table_reloaded(
    herald, history, receiver, make_harness, captured_log
):
    harness = make_harness()
    hook = herald.insert_hook(uri=f"{receiver.base}/a")
    now = int(harness.clock.seconds())
    herald.insert_request(
        hook=hook,
        created=OLD,
        properties={"retry": "forever"},
        result="fail",
        epoch=now,
        modified=now,
    )  # waiting for its retry
    await harness.run_tick()
    assert (await harness.store.observation.stats()).queued == 1
    # Phorge's collector deletes by dateCreated, whatever the status.
    herald.execute("DELETE FROM herald_webhookrequest WHERE dateCreated < %s", (T0,))
    await harness.run_tick()
    stats = await harness.store.observation.stats()
    assert (stats.queued, stats.sent, stats.failed) == (0, 0, 0)
    harness.clock.advance(120)
    await harness.run_tick()
    assert receiver.count() == 0
    # Emptied with its counter reset: ids start again at 1, below everything seen.
    herald.execute("TRUNCATE TABLE herald_webhookrequest")
    request_id = herald.insert_request(hook=hook, created=int(harness.clock.seconds()))
    assert request_id == 1
    await harness.run_tick()
    await harness.run_tick()
    assert receiver.count("/a") == 1
    assert herald.request(request_id)["status"] == "sent"
    assert len(captured_log.named("WEBHOOK_QUEUE_RELOAD")) == 1


async def test_stats_are_kept_not_counted(herald, history, receiver, make_harness):
    harness = make_harness()
    hook = herald.insert_hook(uri=f"{receiver.base}/a")
    failing = herald.insert_hook(uri=f"{receiver.base}/status/500")
    now = int(harness.clock.seconds())
    herald.insert_request(hook=hook, created=now)
    herald.insert_request(hook=failing, created=now, properties={"retry": "never"})
    herald.insert_request(hook=failing, created=now, properties={"retry": "forever"})
    await harness.run_tick()
    before = rows_read(herald)
    stats = await harness.store.observation.stats()
    assert rows_read(herald) - before < 20  # the hook table only
    expected = herald.status_counts()
    assert (stats.queued, stats.sent, stats.failed) == (
        expected["queued"],
        expected["sent"],
        expected["failed"],
    )
    assert stats.queued == 1


class RecordingStore:
    """Every statement a store sends, with its parameters, for EXPLAIN."""

    def __init__(self, store: WebhookStore) -> None:
        self.statements: list[tuple[str, tuple]] = []
        # Every part of the store sends its statements through the one database.
        execute = store.db.execute

        def recording(txn, statement, params=()):
            self.statements.append((statement, tuple(params)))
            return execute(txn, statement, params)

        store.db.execute = recording


def explain(herald, statement: str, params: tuple, how: str = "EXPLAIN") -> list[dict]:
    """EXPLAIN, or ANALYZE (run it: rows really read), inside a rolled-back transaction."""
    with herald.conn.cursor() as cur:
        cur.execute("BEGIN")
        try:
            cur.execute(f"{how} " + cur.mogrify(statement, params))
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        finally:
            cur.execute("ROLLBACK")


def full_scans(plan: list[dict]) -> list[dict]:
    """Plan rows that read all of herald_webhookrequest, or more than one start-up slice.

    The start-up pass reads LOAD_CHUNK ids per statement, the largest range
    any statement may cover; the history is more than twice that.
    """
    assert HISTORY > 2 * observation.LOAD_CHUNK
    return [
        step
        for step in plan
        if step["table"] == "herald_webhookrequest"
        and (step["type"] in ("ALL", "index") or _rows(step) > 1.5 * observation.LOAD_CHUNK)
    ]


def _rows(step: dict) -> float:
    # A plan with a rowid filter says "4 (0%)": the rows read, then the share kept.
    return float(str(step.get("r_rows") or step["rows"] or 0).split()[0])


async def test_every_statement_of_the_store_uses_an_index_range(
    herald, history, receiver, make_harness
):
    # A history row put back to queued (its hook is long gone): found by the start-up pass.
    herald.execute(
        "UPDATE herald_webhookrequest SET status = 'queued' WHERE id >= %s ORDER BY id LIMIT 1",
        (history // 2,),
    )
    harness = make_harness(max_concurrent=2)
    recorder = RecordingStore(harness.store)
    ok = herald.insert_hook(uri=f"{receiver.base}/ok")
    failing = herald.insert_hook(uri=f"{receiver.base}/status/500")
    now = int(harness.clock.seconds())
    herald.insert_request(hook=ok, created=now)
    herald.insert_request(hook=failing, created=now, properties={"retry": "forever"})
    herald.insert_request(hook="PHID-HWBH-missingmissingmissing", created=now)
    await harness.run_tick()  # start-up pass, candidates, claim, finish, retire, breaker
    herald.insert_request(hook=ok, created=now)
    herald.execute(
        "DELETE FROM herald_webhookrequest WHERE id = (SELECT MAX(id) FROM"
        " (SELECT id FROM herald_webhookrequest) AS t)"
    )
    herald.insert_request(hook=ok, created=now)  # leaves a hole behind
    harness.clock.advance(61)
    await harness.run_tick()  # holes, the background recount, a retry
    harness.clock.advance(1)
    await harness.run_tick()
    await harness.store.observation.stats()
    await harness.store.observation.hook_total()
    # Whether the ticks' claims went one by one or as a batch depends on how
    # the deliveries fell across reactor turns; both statements are asked for
    # here, on rows of a hook the dispatcher never sees.
    quiet = herald.insert_hook(uri=f"{receiver.base}/ok")
    for _ in range(3):
        herald.insert_request(hook=quiet, created=now)
    store_claims = harness.store.claims
    found = await store_claims.candidates(limit=10, lease=3600, backoff=0)
    mine = [c for c in found if c.hook_phid == quiet]
    assert len(mine) == 3
    assert await store_claims.claim(mine[0]) is True
    assert await store_claims.claim_many(mine[1:]) == [True, True]

    issued = {statement for statement, _ in recorder.statements}
    for module, name in (
        (observation, "SQL_BOUNDS"),
        (observation, "SQL_NEW_ROWS"),
        (observation, "SQL_BLOCK_COUNTS"),
        (observation, "SQL_RANGE_COUNTS"),
        (observation, "SQL_ROWS_BY_ID"),
        (observation, "SQL_QUEUED_IN_RANGE"),
        (claims, "SQL_CANDIDATES"),
        (claims, "SQL_CLAIM"),
        (claims, "SQL_FINISH"),
        (claims, "SQL_RETIRE"),
        (observation, "SQL_BREAKER_COUNT"),
        (observation, "SQL_ACTIVE_HOOKS"),
        (observation, "SQL_HOOK_TOTAL"),
    ):
        template = getattr(module, name)
        pattern = re.escape(template).replace(r"\{ids\}", ".*").replace(r"\{marks\}", ".*")
        assert any(re.fullmatch(pattern, s) for s in issued), f"{name} was not exercised"
    checked = set()
    for statement, params in recorder.statements:
        if statement in checked or statement == observation.SQL_NOW:
            continue
        checked.add(statement)
        plan = explain(herald, statement, params)
        assert full_scans(plan) == [], (statement, plan)
        analyzed = explain(herald, statement, params, "ANALYZE")
        assert full_scans(analyzed) == [], (statement, analyzed)
        if statement == observation.SQL_BREAKER_COUNT:
            assert [(s["key"], s["type"]) for s in plan] == [("key_ratelimit", "range")]


async def test_the_delivery_log_statements_read_bounded_ranges(
    herald, history, receiver, make_harness
):
    # docs/webhook.md, "Delivery log and replay": a listing call reads at most
    # LIST_BUDGET ids, one window per statement, whatever its filters.
    harness = make_harness()
    recorder = RecordingStore(harness.store)
    ok = herald.insert_hook(uri=f"{receiver.base}/ok")
    busy = herald.insert_hook(uri=f"{receiver.base}/status/429/after/600")
    now = int(harness.clock.seconds())
    live = [herald.insert_request(hook=ok, created=now) for _ in range(3)]
    held = herald.insert_request(hook=busy, created=now, properties={"retry": "forever"})
    await harness.run_tick()
    harness.clock.advance(25)
    await harness.run_tick()  # the Retry-After hold is renewed
    store = harness.store

    page = await store.history.list_requests(limit=10)
    assert [row.id for row in page.rows][:4] == [held, *live[::-1]]
    # A filter nothing under the live rows matches: the budget ends the call.
    page = await store.history.list_requests(limit=10, hook=ok, status="failed")
    assert page.rows == [] and page.next_cursor == held + 1 - delivery_history.LIST_BUDGET
    page = await store.history.list_requests(limit=10, since=now)
    assert [row.id for row in page.rows] == [held, *live[::-1]] and page.next_cursor is None
    page = await store.history.list_requests(limit=10, since=now, result="fail")
    assert len(page.rows) == 1 and page.next_cursor is None
    row = await store.history.request(live[0])
    assert await store.history.request(row.phid) == row
    assert (await store.history.replay(live[0])).after.status == "queued"
    done = await store.history.replay_range(hook=ok, since=now, until=now + 1, statuses=("sent",))
    assert [r.after.id for r in done.replayed] == live[1:]
    assert len(await store.observation.hook_states(300)) == 2

    issued = {statement for statement, _ in recorder.statements}
    for module, name in (
        (delivery_history, "SQL_LIST_WINDOW"),
        (delivery_history, "SQL_FIRST_ID_SINCE"),
        (delivery_history, "SQL_REQUEST_BY_ID"),
        (delivery_history, "SQL_REQUEST_BY_PHID"),
        (delivery_history, "SQL_REPLAY_RANGE"),
        (delivery_history, "SQL_REPLAY"),
        (observation, "SQL_HOOK_LIST"),
        (claims, "SQL_RENEW_HOLD"),
    ):
        template = getattr(module, name)
        pattern = re.escape(template).replace(r"\{filters\}", ".*").replace(r"\{statuses\}", ".*")
        assert any(re.fullmatch(pattern, s) for s in issued), f"{name} was not exercised"
    checked = set()
    for statement, params in recorder.statements:
        if statement in checked or statement == observation.SQL_NOW:
            continue
        checked.add(statement)
        for how in ("EXPLAIN", "ANALYZE"):
            plan = explain(herald, statement, params, how)
            assert full_scans(plan) == [], (statement, plan)
            if statement.startswith("SELECT id, phid") and "id < %s AND id >= %s" in statement:
                (step,) = plan
                assert step["key"] == "PRIMARY" and step["type"] == "range", plan
                assert _rows(step) <= delivery_history.LIST_WINDOW
