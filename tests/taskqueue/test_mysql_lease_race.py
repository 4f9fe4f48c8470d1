"""A lease that loses a candidate to a concurrent claimer still answers exactly
the rows it won (the one-statement claim falls back to per-row claims)."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from gorge.taskqueue.model import EnqueueRequest
from tests.taskqueue.conftest import T0

pytestmark = pytest.mark.integration


async def wait_for_blocked_claim(conn, bound: float = 20.0) -> None:
    """Until the lease's claim statement waits on the other claimer's row lock."""
    waited = 0.0
    while waited < bound:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST"
                " WHERE COMMAND = 'Query' AND INFO LIKE 'UPDATE worker_activetask%%'"
            )
            if cur.fetchone()[0]:
                return
        await deferLater(reactor, 0.01)
        waited += 0.01
    raise AssertionError("the lease never reached its claim")


@pytest_twisted.ensureDeferred
async def test_lease_racing_another_claimer_returns_only_rows_it_won(mariadb, mysql_store):
    ids = [(await mysql_store.enqueue(EnqueueRequest("A"))).id for _ in range(3)]
    other = mariadb.connect(mysql_store.database)
    watcher = mariadb.connect(mysql_store.database)
    try:
        with other.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute(
                "UPDATE worker_activetask SET leaseOwner = 'phorge', leaseExpires = %s"
                " WHERE id = %s",
                (T0 + 60, ids[0]),
            )
        leasing = Deferred.fromCoroutine(mysql_store.lease("gorge", 2, 60))
        await wait_for_blocked_claim(watcher)
        with other.cursor() as cur:
            cur.execute("COMMIT")
        tasks = await leasing.addTimeout(20, reactor)
    finally:
        other.close()
        watcher.close()
    assert [t.id for t in tasks] == ids[1:]
    assert all(t.lease_owner == "gorge" for t in tasks)
    # Nothing else was claimed on the way, and the other claim stands.
    assert await mysql_store.lease("gorge", 5, 60) == []
    assert (await mysql_store.get_task(ids[0])).lease_owner == "phorge"


@pytest_twisted.ensureDeferred
async def test_uncontended_lease_claims_the_whole_batch_in_queue_order(mysql_store):
    ids = [
        (await mysql_store.enqueue(EnqueueRequest("A", priority=p))).id
        for p in (3000, 1000, 2000, 1000)
    ]
    tasks = await mysql_store.lease("gorge", 3, 60)
    assert [t.id for t in tasks] == [ids[1], ids[3], ids[2]]
    assert [t.id for t in await mysql_store.lease("gorge", 3, 60)] == [ids[0]]
