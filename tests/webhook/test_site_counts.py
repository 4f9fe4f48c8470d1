"""The site's figures in ``GET /api/webhook/stats`` (docs/webhook.md, "HTTP API"):
counted from the table on a real MariaDB, the same for every replica on one
database, each replica's own figures kept beside them; one count per
``max_age`` (injected clock), shared by the calls that arrive while it runs."""

from __future__ import annotations

import pytest
import treq
from pymysql.err import OperationalError
from twisted.internet import reactor, task
from twisted.internet.defer import CancelledError, gatherResults

from gorge.config import HttpSettings
from gorge.webhook.sitecounts import SiteCounter
from gorge.webhook.store import WebhookStore
from tests.webhook.conftest import T0

pytestmark = pytest.mark.integration

TOKEN = "site-token"
HTTP = HttpSettings(listen_addr="127.0.0.1:0", endpoint="tcp:0:interface=127.0.0.1", token=TOKEN)


async def stats(base: str) -> dict:
    response = await treq.get(
        base + "/api/webhook/stats", headers={"X-Service-Token": TOKEN}, persistent=False
    )
    assert response.code == 200
    return (await response.json())["data"]


def seed(herald, queued: int, sent: int, failed: int) -> str:
    hook = herald.insert_hook(uri="http://127.0.0.1:9/x")
    for status, n in (("queued", queued), ("sent", sent), ("failed", failed)):
        for _ in range(n):
            herald.insert_request(hook=hook, status=status)
    return hook


def mine(data: dict) -> tuple[int, int, int]:
    return data["queuedCount"], data["sentCount"], data["failedCount"]


def site(data: dict) -> tuple[int, int, int]:
    return data["site"]["queuedCount"], data["site"]["sentCount"], data["site"]["failedCount"]


async def test_two_replicas_answer_the_same_site_figures_and_each_its_own(
    herald, make_harness, listen
):
    hook = seed(herald, queued=3, sent=2, failed=1)
    clock = task.Clock()
    clock.advance(T0)
    one = make_harness(clock=clock, http=HTTP, site_stats_max_age=30)
    two = make_harness(clock=clock, http=HTTP, site_stats_max_age=30)
    base_one, base_two = listen(one.service.part("site")), listen(two.service.part("site"))

    first = await stats(base_one)
    assert mine(first) == site(first) == (3, 2, 1)
    assert first["site"]["activeWebhooks"] == 1
    assert (first["site"]["asOf"], first["site"]["ageSeconds"]) == (T0, 0)

    # Rows the first replica has not polled since: it does not know of them,
    # the second (whose view starts now) does, and so does its site count.
    for _ in range(4):
        herald.insert_request(hook=hook, status="queued")
    herald.insert_request(hook=hook, status="sent")
    clock.advance(10)
    second = await stats(base_two)
    assert mine(second) == site(second) == (7, 3, 1)
    again = await stats(base_one)
    assert mine(again) == (3, 2, 1)
    # The first replica's site count is 10 s old: reused, and it says so.
    assert site(again) == (3, 2, 1) and again["site"]["ageSeconds"] == 10

    clock.advance(30)  # both counts are 30 s old or more now: both count again
    answers = [await stats(base_one), await stats(base_two)]
    assert [site(a) for a in answers] == [(7, 3, 1), (7, 3, 1)]
    assert [a["site"]["asOf"] for a in answers] == [T0 + 40, T0 + 40]
    # Each replica's own figures are its view's, as before.
    assert [mine(a) for a in answers] == [(3, 2, 1), (7, 3, 1)]
    assert [h.store.db.transactions["site_counts"].ok for h in (one, two)] == [2, 2]


@pytest.fixture
def counted(mariadb, herald_db):
    store = WebhookStore.mysql(mariadb.settings(herald_db), reactor)
    yield store
    store.close()


async def test_a_count_is_reused_until_it_is_max_age_old(herald, counted):
    hook = seed(herald, queued=1, sent=0, failed=0)
    clock = task.Clock()
    counter = SiteCounter(counted.db, clock, max_age=30)

    counts = await counter.read()
    assert (counts.queued, counts.sent, counts.failed, counts.active_hooks) == (1, 0, 0, 1)
    herald.insert_request(hook=hook, status="sent")
    clock.advance(29.5)
    reused = await counter.read()
    assert reused is counts and counter.age(reused) == 29.5
    assert counted.db.transactions["site_counts"].ok == 1

    clock.advance(0.5)
    fresh = await counter.read()
    assert (fresh.queued, fresh.sent) == (1, 1) and counter.age(fresh) == 0
    assert counted.db.transactions["site_counts"].ok == 2


async def test_calls_during_a_count_share_it_and_one_giving_up_leaves_the_others(herald, counted):
    seed(herald, queued=2, sent=1, failed=1)
    counter = SiteCounter(counted.db, task.Clock(), max_age=30)

    waiting = [counter.read() for _ in range(3)]
    # The count runs in a pool thread: none of the three has its answer yet.
    assert not any(d.called for d in waiting)
    waiting[0].cancel()
    answers = await gatherResults(waiting[1:])
    assert answers[0] is answers[1]
    assert (answers[0].queued, answers[0].sent, answers[0].failed) == (2, 1, 1)
    assert counted.db.transactions["site_counts"].ok == 1
    with pytest.raises(CancelledError):
        await waiting[0]


async def test_a_failed_count_fails_every_waiter_and_is_not_kept(mariadb):
    store = WebhookStore.mysql(mariadb.settings("no_such_herald"), reactor)
    try:
        counter = SiteCounter(store.db, task.Clock(), max_age=30)
        waiting = [counter.read(), counter.read()]
        for waiter in waiting:
            with pytest.raises(OperationalError):
                await waiter
        assert store.db.transactions["site_counts"].failed == 1
        # Not kept: the next call counts again (and fails again).
        with pytest.raises(OperationalError):
            await counter.read()
        assert store.db.transactions["site_counts"].failed == 2
    finally:
        store.close()
