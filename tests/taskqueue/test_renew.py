"""Lease renewal on every backend and over HTTP (docs/taskqueue.md, Renewal)."""

from __future__ import annotations

import pytest
import pytest_twisted

from gorge.taskqueue.memory import MemoryTaskStore
from gorge.taskqueue.model import EnqueueRequest, InvalidArgument
from tests.taskqueue.conftest import T0
from tests.taskqueue.helpers import Client

OWNER, OTHER = "host-a:1:100:gorge-worker", "host-b:2:200:gorge-worker"


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_renew_extends_only_leases_the_owner_holds(backend_store, clock):
    ids = [(await backend_store.enqueue(EnqueueRequest("A", str(i)))).id for i in range(4)]
    await backend_store.lease(OWNER, 2, 60)  # ids 1, 2 until T0+60
    await backend_store.lease(OTHER, 1, 60)  # id 3
    before = await backend_store.get_task(ids[0])
    clock.advance(50)
    answer = await backend_store.renew(OWNER, [ids[1], ids[0], ids[2], ids[3], 99, ids[0]], 120)
    assert answer == {ids[1]: T0 + 170, ids[0]: T0 + 170, ids[2]: None, ids[3]: None, 99: None}
    assert list(answer) == [ids[1], ids[0], ids[2], ids[3], 99]
    renewed = await backend_store.get_task(ids[0])
    assert (renewed.lease_owner, renewed.lease_expires) == (OWNER, T0 + 170)
    assert renewed.date_modified == before.date_modified  # a lease never changes it
    assert (await backend_store.get_task(ids[2])).lease_expires == T0 + 60
    assert (await backend_store.get_task(ids[3])).lease_owner is None
    # Never shortened: a smaller extension keeps the later expiry.
    assert await backend_store.renew(OWNER, [ids[0]], 10) == {ids[0]: T0 + 170}
    # The renewed lease holds off phase 2 past the first expiry...
    clock.advance(100)  # T0+150: first lease long gone
    assert [t.id for t in await backend_store.lease(OTHER, 5, 60)] == [ids[2], ids[3]]
    # ...and once it expires unrenewed, a takeover makes the old holder's renewal "lost".
    clock.advance(21)
    assert {t.id for t in await backend_store.lease(OTHER, 5, 60)} == {ids[0], ids[1]}
    assert await backend_store.renew(OWNER, ids[:2], 60) == {ids[0]: None, ids[1]: None}
    await backend_store.complete(ids[0], 1, OTHER)
    assert await backend_store.renew(OTHER, [ids[0], ids[1]], 60) == {
        ids[0]: None,
        ids[1]: T0 + 231,
    }
    with pytest.raises(InvalidArgument):
        await backend_store.renew(OTHER, [ids[1]], 2**32)
    assert (await backend_store.get_task(ids[1])).lease_expires == T0 + 231


@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_renewed_task_stays_held_in_stats_and_expired_lease_of_the_owner_renews(
    backend_store, clock
):
    task = await backend_store.enqueue(EnqueueRequest("A"))
    await backend_store.lease(OWNER, 1, 60)
    clock.advance(61)  # expired, nobody took it
    assert (await backend_store.stats()).leased == 0
    assert await backend_store.renew(OWNER, [task.id], 60) == {task.id: T0 + 121}
    assert (await backend_store.stats()).leased == 1
    assert await backend_store.lease(OTHER, 1, 60) == []


@pytest.fixture
def client(clock):
    return Client(MemoryTaskStore(clock), clock, lease_duration=600)


@pytest_twisted.ensureDeferred
async def test_renew_over_http(client, clock):
    for _ in range(2):
        await client.post("enqueue", {"taskClass": "A"})
    await client.post("lease", {"limit": 1}, headers={"X-Lease-Owner": OWNER})
    clock.advance(100)
    code, answer = await client.post(
        "renew", {"taskIDs": [1, 2, 2**40, 1]}, headers={"X-Lease-Owner": OWNER}
    )
    assert (code, answer) == (
        200,
        {
            "data": [
                {"taskID": 1, "status": "renewed", "leaseExpires": T0 + 700, "leaseSeconds": 600},
                {"taskID": 2, "status": "lost"},
                {"taskID": 2**40, "status": "lost"},
            ]
        },
    )
    code, answer = await client.post("renew", {"taskIDs": [1], "leaseOwner": OWNER, "duration": 30})
    # A renewal never pulls a lease in; leaseSeconds is what it surely has.
    assert answer["data"] == [
        {"taskID": 1, "status": "renewed", "leaseExpires": T0 + 700, "leaseSeconds": 30}
    ]
    code, answer = await client.get("/metrics", token=None)
    assert 'gorge_taskqueue_lease_renewals_total{result="renewed"} 2.0' in answer
    assert 'gorge_taskqueue_lease_renewals_total{result="lost"} 2.0' in answer


BAD_RENEWALS = [
    ({"taskIDs": []}, {"X-Lease-Owner": OWNER}, "taskIDs is required"),
    ({}, {"X-Lease-Owner": OWNER}, "taskIDs is required"),
    ({"taskIDs": [1, "2"]}, {"X-Lease-Owner": OWNER}, "taskIDs must be a list of integers"),
    (
        {"taskIDs": list(range(1, 1002))},
        {"X-Lease-Owner": OWNER},
        "taskIDs must have at most 1000 ids",
    ),
    ({"taskIDs": [1], "duration": 0}, {"X-Lease-Owner": OWNER}, "duration must be >= 1"),
    (
        {"leases": [{"taskID": 1, "leaseOwner": OWNER}, {"taskID": "2"}]},
        {},
        "each lease must be an object with an integer taskID",
    ),
    ({"leases": []}, {}, "leases must be a non-empty list of {taskID, leaseOwner} objects"),
    (
        {"leases": [{"taskID": 1, "leaseOwner": "x" * 65}]},
        {},
        "leaseOwner must be at most 64 characters",
    ),
    ({"taskIDs": [1], "duration": "60"}, {"X-Lease-Owner": OWNER}, "duration must be an integer"),
    ({"taskIDs": [1]}, {"X-Lease-Owner": "(yield)"}, "leaseOwner (yield) holds no lease"),
    (
        {"taskIDs": [1], "leaseOwner": OTHER},
        {"X-Lease-Owner": OWNER},
        "leaseOwner and X-Lease-Owner name different owners",
    ),
]


@pytest.mark.parametrize("body, headers, message", BAD_RENEWALS)
@pytest_twisted.ensureDeferred
async def test_bad_renewal_is_400_and_changes_nothing(client, body, headers, message):
    await client.post("enqueue", {"taskClass": "A"})
    await client.post("lease", {"limit": 1}, headers={"X-Lease-Owner": OWNER})
    assert await client.post("renew", body, headers=headers) == (
        400,
        {"error": {"code": "ERR_BAD_REQUEST", "message": message}},
    )
    assert (await client.get("tasks/1"))[1]["data"]["leaseExpires"] == T0 + 600


@pytest_twisted.ensureDeferred
async def test_a_renewal_without_an_owner_renews_what_a_lease_without_one_took(client, clock):
    """No owner (or an empty one) is the owner a lease call without one is
    given, on lease and renew alike, so neither refuses what the other takes."""
    for _ in range(2):
        await client.post("enqueue", {"taskClass": "A"})
    leased = (await client.post("lease", {"limit": 1}))[1]["data"][0]
    assert leased["leaseOwner"].endswith(":gorge-taskqueue")
    await client.post("lease", {"limit": 1}, headers={"X-Lease-Owner": OWNER})
    clock.advance(100)
    for body, headers in (
        ({"taskIDs": [1, 2]}, {}),
        ({"taskIDs": [1, 2], "leaseOwner": ""}, {"X-Lease-Owner": ""}),
        ({"leases": [{"taskID": 1}, {"taskID": 2, "leaseOwner": ""}]}, {}),
    ):
        code, answer = await client.post("renew", body, headers=headers)
        assert code == 200
        assert [(e["taskID"], e["status"]) for e in answer["data"]] == [
            (1, "renewed"),
            (2, "lost"),
        ]
        if "leases" in body:
            assert {e["leaseOwner"] for e in answer["data"]} == {leased["leaseOwner"]}


@pytest_twisted.ensureDeferred
async def test_renew_needs_the_token(client):
    code, answer = await client.post("renew", {"taskIDs": [1]}, token=None)
    assert (code, answer["error"]["code"]) == (401, "ERR_UNAUTHORIZED")


@pytest_twisted.ensureDeferred
async def test_one_renewal_renews_leases_of_several_owners_each_by_its_own(client, clock):
    """A worker names each lease's own owner: one call renews them all, and a
    lease the task no longer has under that owner is lost even when the same
    worker's other lease holds it (docs/taskqueue.md, Renew)."""
    for _ in range(2):
        await client.post("enqueue", {"taskClass": "A"})
    await client.post("lease", {"limit": 1}, headers={"X-Lease-Owner": "w:1"})
    await client.post("lease", {"limit": 1}, headers={"X-Lease-Owner": "w:2"})
    assert (await client.post("free", {"taskID": 2}))[0] == 200
    clock.advance(1)
    _, again = await client.post("lease", {"limit": 1}, headers={"X-Lease-Owner": "w:3"})
    assert [task["id"] for task in again["data"]] == [2]
    clock.advance(99)
    code, answer = await client.post(
        "renew",
        {
            "leases": [
                {"taskID": 1, "leaseOwner": "w:1"},
                {"taskID": 2, "leaseOwner": "w:2"},
                {"taskID": 2, "leaseOwner": "w:3"},
                {"taskID": 1, "leaseOwner": "w:3"},
            ],
            "duration": 9999,  # capped by the queue's lease, not refused
        },
    )
    assert (code, answer["data"]) == (
        200,
        [
            {
                "taskID": 1,
                "leaseOwner": "w:1",
                "status": "renewed",
                "leaseExpires": T0 + 700,
                "leaseSeconds": 600,
            },
            {"taskID": 2, "leaseOwner": "w:2", "status": "lost"},
            {
                "taskID": 2,
                "leaseOwner": "w:3",
                "status": "renewed",
                "leaseExpires": T0 + 700,
                "leaseSeconds": 600,
            },
            {"taskID": 1, "leaseOwner": "w:3", "status": "lost"},
        ],
    )


@pytest_twisted.ensureDeferred
async def test_a_lease_may_ask_for_a_shorter_lease_capped_by_the_queues(client, clock):
    for _ in range(3):
        await client.post("enqueue", {"taskClass": "A"})
    _, short = await client.post("lease", {"limit": 1, "leaseDuration": 60})
    _, capped = await client.post("lease", {"limit": 1, "leaseDuration": 10**9})
    _, default = await client.post("lease", {"limit": 1})
    assert [(t["leaseExpires"], t["leaseSeconds"]) for t in short["data"]] == [(T0 + 60, 60)]
    assert [(t["leaseExpires"], t["leaseSeconds"]) for t in capped["data"]] == [(T0 + 600, 600)]
    assert [(t["leaseExpires"], t["leaseSeconds"]) for t in default["data"]] == [(T0 + 600, 600)]
    for bad in (0, -1, "60", True, 1.5):
        assert await client.post("lease", {"leaseDuration": bad}) == (
            400,
            {
                "error": {
                    "code": "ERR_BAD_REQUEST",
                    "message": "leaseDuration must be a positive integer (seconds)",
                }
            },
        )


@pytest_twisted.ensureDeferred
async def test_each_report_entry_is_fenced_by_its_own_lease_owner(client, clock):
    for _ in range(3):
        await client.post("enqueue", {"taskClass": "A"})
    for owner in ("w:1", "w:2", "w:3"):
        await client.post("lease", {"limit": 1}, headers={"X-Lease-Owner": owner})
    code, answer = await client.post(
        "report",
        {
            "leaseOwner": "w:3",  # the call's: for entries that name none
            "reports": [
                {"taskID": 1, "outcome": "complete", "leaseOwner": "w:1"},
                {"taskID": 2, "outcome": "yield", "duration": 60, "leaseOwner": "w:1"},
                {"taskID": 3, "outcome": "complete"},
            ],
        },
    )
    assert code == 200
    assert [(e["taskID"], e["status"], e.get("code")) for e in answer["data"]] == [
        (1, "reported", None),
        (2, "refused", "ERR_LEASE_CONFLICT"),
        (3, "reported", None),
    ]
    assert (await client.get("tasks/2"))[1]["data"]["leaseOwner"] == "w:2"
