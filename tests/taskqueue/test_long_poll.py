"""Long-poll leases (docs/taskqueue.md, Long-poll): a lease call that finds
nothing may be held until a task is runnable or its wait ends."""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from gorge.taskqueue.model import EnqueueRequest
from gorge.taskqueue.wakeup import LeaseWaiters
from tests.support.logcapture import logged_events
from tests.taskqueue.conftest import open_mysql_store, open_redis_store, open_sqlite_store
from tests.taskqueue.helpers import TOKEN, Client

OWNER = "host-a:1:100:gorge-worker"
CHECK = 0.015


@pytest.fixture
def client(memory_store, clock) -> Client:
    return Client(memory_store, clock)


def _lease(client: Client, body: dict) -> Deferred:
    """A lease call left running, answered later."""
    return Deferred.fromCoroutine(client.post("lease", body, headers={"X-Lease-Owner": OWNER}))


def _hung_up_lease(client: Client, body: dict) -> Deferred:
    """A lease call whose caller can hang up: cancel the returned Deferred."""
    return client.stub.request(
        "POST",
        "http://queue.test/api/queue/lease",
        data=json.dumps(body).encode(),
        headers={
            b"content-type": [b"application/json"],
            b"x-service-token": [TOKEN.encode()],
            b"x-lease-owner": [OWNER.encode()],
        },
    )


async def _settle(client: Client | None = None) -> None:
    """Let the real reactor run the in-memory connections a few times."""
    from twisted.internet import reactor

    for _ in range(5):
        if client is not None:
            client.stub.flush()
        await deferLater(reactor, 0.002)


async def _advance_until(clock, d: Deferred, step: float, bound: int = 2000) -> None:
    """Advance ``clock`` by ``step`` until ``d`` fired (a real backend answers
    the shared check from a pool thread, so the real reactor runs between)."""
    from twisted.internet import reactor

    for _ in range(bound):
        if d.called:
            return
        clock.advance(step)
        await deferLater(reactor, 0.002)
    raise AssertionError("the held lease was not answered")


@pytest_twisted.ensureDeferred
async def test_without_wait_an_empty_lease_answers_at_once(client):
    assert await client.post("lease", {"limit": 3}) == (200, {"data": []})
    assert await client.post("lease", {"limit": 3, "wait": 0}) == (200, {"data": []})
    assert len(client.service.part("held-leases")) == 0


@pytest_twisted.ensureDeferred
async def test_held_lease_answers_when_a_task_is_enqueued(client, clock):
    held = _lease(client, {"limit": 2, "wait": 20})
    await _settle()
    assert not held.called and len(client.service.part("held-leases")) == 1
    code, answer = await client.post("enqueue", {"taskClass": "A", "data": "{}"})
    code, answer = await held
    assert code == 200 and [t["id"] for t in answer["data"]] == [1]
    assert answer["data"][0]["leaseOwner"] == OWNER
    assert len(client.service.part("held-leases")) == 0


@pytest_twisted.ensureDeferred
async def test_held_lease_ends_empty_when_its_wait_ends(client, clock):
    held = _lease(client, {"limit": 1, "wait": 2.5})
    await _settle()
    clock.advance(2.4)
    await _settle()
    assert not held.called
    clock.advance(0.2)
    assert await held == (200, {"data": []})
    assert len(client.service.part("held-leases")) == 0


@pytest_twisted.ensureDeferred
async def test_only_a_task_the_call_may_take_answers_it(client, clock):
    held = _lease(client, {"limit": 1, "wait": 10, "taskClasses": ["B"]})
    await _settle()
    await client.post("enqueue", {"taskClass": "A"})
    await _settle()
    assert not held.called
    await client.post("enqueue", {"taskClass": "B"})
    code, answer = await held
    assert [t["taskClass"] for t in answer["data"]] == ["B"]


@pytest_twisted.ensureDeferred
async def test_a_delayed_task_answers_when_its_time_comes(client, memory_store, clock):
    now = int(clock.seconds())
    await client.post("enqueue", {"taskClass": "A", "delayUntil": now + 3})
    held = _lease(client, {"limit": 1, "wait": 30})
    await _settle()
    await _advance_until(clock, held, CHECK, bound=int(3 / CHECK) + 200)
    # Leasable once now > delayUntil, found by the next check after that.
    assert int(clock.seconds()) == now + 4
    code, answer = await held
    assert [t["id"] for t in answer["data"]] == [1]


@pytest_twisted.ensureDeferred
async def test_a_task_written_elsewhere_is_found_by_the_shared_check(client, memory_store, clock):
    """Phorge writes rows itself: no enqueue call tells this process."""
    held = [_lease(client, {"limit": 1, "wait": 10}) for _ in range(3)]
    await _settle()
    checks = []
    check = memory_store.wake_check

    async def counted(since, now):
        checks.append(now)
        return await check(since, now)

    client.service.part("held-leases")._check = counted
    clock.advance(CHECK)  # the first check after start-up wakes everyone once
    await _settle()
    assert not any(d.called for d in held) and len(client.service.part("held-leases")) == 3
    await memory_store.enqueue(EnqueueRequest("A"))
    await _settle()
    assert not any(d.called for d in held)
    clock.advance(CHECK)
    await _settle()
    answered = [d for d in held if d.called]
    assert len(answered) == 1 and (await answered[0])[1]["data"][0]["id"] == 1
    # One check per period for all three calls, not one per call.
    assert len(checks) == 2


@pytest_twisted.ensureDeferred
async def test_stop_answers_held_leases_at_once(client, clock):
    client.service.startService()
    held = _lease(client, {"limit": 1, "wait": 30})
    await _settle()
    assert not held.called
    stopping = client.service.stopService()
    assert await held == (200, {"data": []})
    # A call arriving during the stop is not held either.
    assert await client.post("lease", {"limit": 1, "wait": 30}) == (200, {"data": []})
    await stopping


@pytest_twisted.ensureDeferred
async def test_caller_gone_while_held_is_forgotten(client, clock):
    held = _hung_up_lease(client, {"limit": 1, "wait": 30})
    held.addErrback(lambda _: None)
    await _settle(client)
    assert len(client.service.part("held-leases")) == 1
    held.cancel()
    await _settle(client)
    assert len(client.service.part("held-leases")) == 0
    await client.post("enqueue", {"taskClass": "A"})
    assert (await client.post("lease", {"limit": 1}))[1]["data"][0]["id"] == 1


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_caller_gone_while_its_lease_ran_gets_nothing_stranded(backend_store, clock):
    """The claim was already sent when the caller hung up: what it won is
    freed again instead of staying leased to nobody until the lease expires."""
    task = await backend_store.enqueue(EnqueueRequest("A"))
    other = await backend_store.enqueue(EnqueueRequest("A"))
    await backend_store.lease("someone-else", 1, 600)  # takes `task`
    with logged_events() as events:
        claim = Deferred.fromCoroutine(backend_store.lease(OWNER, 5, 600))
        claim.addErrback(lambda _: None)
        claim.cancel()
        for _ in range(2000):
            # The event first: a read sent before the hand-back was logged may
            # predate the claim itself and see the task unleased.
            if any(
                e.get("log_format", "").startswith("TASKQUEUE_LEASE_HANDED_BACK") for e in events
            ) and ((await backend_store.get_task(other.id)).lease_owner is None):
                break
            await _settle()
    handed = [
        e for e in events if e.get("log_format", "").startswith("TASKQUEUE_LEASE_HANDED_BACK")
    ]
    assert [e["task_ids"] for e in handed] == [[other.id]]
    back = await backend_store.get_task(other.id)
    assert (back.lease_owner, back.lease_expires) == (None, int(clock.seconds()))
    # The other owner's lease is untouched.
    assert (await backend_store.get_task(task.id)).lease_owner == "someone-else"
    clock.advance(1)
    assert [t.id for t in await backend_store.lease(OWNER, 5, 600)] == [other.id]


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize(
    "wait,message",
    [
        ("5", "wait must be a number of seconds"),
        (True, "wait must be a number of seconds"),
        (-1, "wait must be between 0 and 30 seconds"),
        (30.5, "wait must be between 0 and 30 seconds"),
    ],
)
async def test_bad_wait_is_refused(client, wait, message):
    assert await client.post("lease", {"limit": 1, "wait": wait}) == (
        400,
        {"error": {"code": "ERR_BAD_REQUEST", "message": message}},
    )


def test_wake_ups_are_never_lost_between_a_lease_and_the_wait(clock):
    """A wake-up after the call took its generation, before it waits: it
    does not sleep."""
    waiters = LeaseWaiters(None, clock)
    seen = waiters.generation
    waiters.notify("A")
    assert waiters.wait(None, 10, seen).result is True
    assert len(waiters) == 0
    d = waiters.wait(["B"], 10, waiters.generation)
    waiters.notify("A")
    assert not d.called
    waiters.notify(None)
    assert d.result is True


def _store(backend, request, clock, tmp_path, shared):
    if backend == "sqlite":
        return open_sqlite_store(tmp_path / "shared.sqlite3", clock)
    if backend == "mysql":
        mariadb = request.getfixturevalue("mariadb")
        shared.setdefault("db", mariadb.create_database("worker"))
        return open_mysql_store(mariadb, shared["db"], clock)
    redis_server = request.getfixturevalue("redis_server")
    shared.setdefault("prefix", redis_server.unique_prefix("lp"))
    return open_redis_store(redis_server, shared["prefix"], clock)


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["mysql", "sqlite", "redis"])
@pytest_twisted.ensureDeferred
async def test_a_replica_sees_an_enqueue_made_through_another(backend, request, clock, tmp_path):
    shared: dict = {}
    stores = [_store(backend, request, clock, tmp_path, shared) for _ in range(2)]
    a, b = (Client(store, clock, backend=backend) for store in stores)
    try:
        held = _lease(a, {"limit": 1, "wait": 20})
        # The first check after start-up wakes the call once; it leases
        # nothing and waits again.
        for _ in range(200):
            if (
                len(a.service.part("held-leases")) == 1
                and a.service.part("held-leases")._mark is not None
            ):
                break
            clock.advance(CHECK)
            await _settle()
        assert not held.called
        code, answer = await b.post("enqueue", {"taskClass": "A", "data": "{}"})
        assert code == 200
        await _advance_until(clock, held, CHECK)
        code, answer = await held
        assert [t["id"] for t in answer["data"]] == [answer["data"][0]["id"]]
        assert answer["data"][0]["leaseOwner"] == OWNER
    finally:
        for store in stores:
            await store.close()


def test_checks_start_one_period_apart_whatever_each_one_takes():
    from twisted.internet.task import Clock

    clock = Clock()
    started: list[float] = []
    answers: list[Deferred] = []

    def check(since, now):
        started.append(clock.seconds())
        answers.append(Deferred())
        return answers[-1]

    waiters = LeaseWaiters(check, clock, 1.0)
    waiters.wait(None, 100, waiters.generation)
    clock.advance(1.0)
    assert started == [1.0]
    clock.advance(0.25)  # the check takes a quarter of the period
    answers[0].callback((0, False))  # the first check wakes everyone: wait again
    held = waiters.wait(None, 100, waiters.generation)
    assert not held.called
    clock.advance(0.5)
    assert started == [1.0]
    clock.advance(0.25)
    assert started == [1.0, 2.0]
    clock.advance(1.5)  # slower than a period: a full period follows it
    answers[1].callback((0, False))
    clock.advance(0.75)
    assert started == [1.0, 2.0]
    clock.advance(0.25)
    assert started == [1.0, 2.0, 4.5]
    waiters.close()
