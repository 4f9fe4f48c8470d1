"""The /api/queue contract through the real Site,
on the in-memory store; real backends are covered by test_api_backends.py."""

from __future__ import annotations

import pytest
import pytest_twisted

from gorge.taskqueue.model import UINT32_MAX, YIELD_OWNER
from tests.support.logcapture import logged_events
from tests.taskqueue.conftest import LEASE, T0
from tests.taskqueue.helpers import Client

PHID = "PHID-TASK-tzdxqbs3s4qsrzbtcoun"


@pytest.fixture
def client(memory_store, clock) -> Client:
    return Client(memory_store, clock)


@pytest.fixture(autouse=True)
def failure_events():
    """Every 4xx here is an expected path: none may log a crash or a *_FAILED event,
    except the ones a test declares by appending its name to ``allowed``."""
    allowed: list[str] = []
    with logged_events() as events:
        yield allowed
    names = [str(e.get("log_format", "")).split(" ")[0] for e in events]
    unexpected = [
        n for n in names if (n == "PANIC_RECOVERED" or n.endswith("_FAILED")) and n not in allowed
    ]
    assert not unexpected


async def enqueue(client: Client, **fields) -> dict:
    body = {"taskClass": "PhabricatorTestWorker", "data": '{"x":1}'}
    body.update(fields)
    code, answer = await client.post("enqueue", body)
    assert code == 200, answer
    return answer["data"]


async def active_count(client: Client) -> int:
    code, answer = await client.get("stats")
    assert code == 200
    return answer["data"]["activeCount"]


@pytest_twisted.ensureDeferred
async def test_enqueue_answers_the_task_with_absent_keys_absent(client):
    task = await enqueue(client)
    assert task == {
        "id": 1,
        "taskClass": "PhabricatorTestWorker",
        "failureCount": 0,
        "dataID": 1,
        "priority": 2000,
        "dateCreated": T0,
        "dateModified": T0,
    }
    assert client.last_body.startswith(b'{"data":{"id":1,')  # compact JSON


@pytest_twisted.ensureDeferred
async def test_enqueue_keeps_optional_fields_and_delay(client):
    task = await enqueue(
        client, priority=1000, objectPHID=PHID, containerPHID="PHID-USER-x", delayUntil=T0 + 3600
    )
    assert task["priority"] == 1000
    assert task["objectPHID"] == PHID and task["containerPHID"] == "PHID-USER-x"
    assert task["leaseExpires"] == T0 + 3600 and "leaseOwner" not in task
    # delayUntil <= 0 means runnable now: no leaseExpires at all.
    assert "leaseExpires" not in await enqueue(client, delayUntil=0)
    # null is "absent"
    assert (await enqueue(client, priority=None, objectPHID=None))["priority"] == 2000


BAD_ENQUEUES = [
    ({}, "taskClass is required"),
    ({"taskClass": ""}, "taskClass is required"),
    ({"taskClass": 5}, "taskClass must be a string"),
    ({"taskClass": "x" * 65}, "taskClass must be at most 64 characters"),
    ({"taskClass": "X", "data": {"a": 1}}, "data must be a string"),
    ({"taskClass": "X", "priority": "1"}, "priority must be an integer"),
    ({"taskClass": "X", "priority": True}, "priority must be an integer"),
    ({"taskClass": "X", "priority": 1.5}, "priority must be an integer"),
    ({"taskClass": "X", "priority": -1}, "priority must be >= 0"),
    ({"taskClass": "X", "priority": UINT32_MAX + 1}, f"priority must be <= {UINT32_MAX}"),
    ({"taskClass": "X", "objectPHID": 7}, "objectPHID must be a string"),
    ({"taskClass": "X", "objectPHID": "P" * 65}, "objectPHID must be at most 64 characters"),
    ({"taskClass": "X", "containerPHID": "é" * 33}, "containerPHID must be ASCII (a PHID)"),
    ({"taskClass": "X", "objectPHID": "PHID-é"}, "objectPHID must be ASCII (a PHID)"),
    ({"taskClass": "X", "delayUntil": -5}, "delayUntil must be >= 0"),
    ({"taskClass": "X", "delayUntil": UINT32_MAX + 1}, f"delayUntil must be <= {UINT32_MAX}"),
]


@pytest.mark.parametrize("body,message", BAD_ENQUEUES)
@pytest_twisted.ensureDeferred
async def test_bad_enqueue_is_400_and_writes_nothing(client, body, message):
    code, answer = await client.post("enqueue", body)
    assert (code, answer) == (400, {"error": {"code": "ERR_BAD_REQUEST", "message": message}})
    assert await active_count(client) == 0


@pytest.mark.parametrize("raw", [b"{", b"[1]", b'"x"', b"", b"null", b"\xff"])
@pytest_twisted.ensureDeferred
async def test_malformed_json_is_400_on_every_post(client, raw):
    for path in ("enqueue", "lease", "complete", "fail", "yield", "cancel", "awaken"):
        code, answer = await client.post(path, raw=raw)
        assert code == 400 and answer["error"]["code"] == "ERR_BAD_REQUEST", (path, answer)
        assert answer["error"]["message"]
    assert await active_count(client) == 0


@pytest_twisted.ensureDeferred
async def test_lease_returns_only_claimed_tasks_with_data_in_queue_order(client, clock):
    await enqueue(client, priority=3000)
    await enqueue(client, priority=1000)
    await enqueue(client, priority=1000)
    code, answer = await client.post(
        "lease", {"limit": 2}, headers={"X-Lease-Owner": "22413:1795947021:vm:1"}
    )
    assert code == 200
    assert [t["id"] for t in answer["data"]] == [2, 3]
    first = answer["data"][0]
    assert first["leaseOwner"] == "22413:1795947021:vm:1"
    assert first["leaseExpires"] == T0 + LEASE
    assert first["data"] == '{"x":1}' and first["dateModified"] == T0
    # The same owner asking again gets only new work.
    code, answer = await client.post(
        "lease", {"limit": 5}, headers={"X-Lease-Owner": "22413:1795947021:vm:1"}
    )
    assert [t["id"] for t in answer["data"]] == [1]
    code, answer = await client.post("lease", {})
    assert (code, client.last_body) == (200, b'{"data":[]}')


@pytest_twisted.ensureDeferred
async def test_lease_owner_defaults_to_client_address_and_long_owner_is_refused(client):
    await enqueue(client)
    code, answer = await client.post("lease", {"limit": 1}, headers={"X-Lease-Owner": "o" * 65})
    assert code == 400
    assert answer["error"]["message"] == "leaseOwner must be at most 64 characters"
    code, answer = await client.post("lease", {"limit": 1})
    assert answer["data"][0]["leaseOwner"].endswith(":gorge-taskqueue")
    code, answer = await client.post("lease", {"limit": 1}, headers={"X-Lease-Owner": "o" * 64})
    assert answer == {"data": []}


@pytest.mark.parametrize(
    "body,message",
    [
        ({"limit": "2"}, "limit must be an integer"),
        ({"limit": True}, "limit must be an integer"),
        ({"taskClasses": "X"}, "taskClasses must be a list of strings"),
        ({"taskClasses": [1]}, "taskClasses must be a list of strings"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_bad_lease_is_400_and_claims_nothing(client, body, message):
    await enqueue(client)
    code, answer = await client.post("lease", body)
    assert (code, answer["error"]["message"]) == (400, message)
    code, answer = await client.get("stats")
    assert answer["data"]["leasedCount"] == 0


@pytest_twisted.ensureDeferred
async def test_lease_limit_is_clamped_and_classes_filter(client):
    await enqueue(client, taskClass="A")
    await enqueue(client, taskClass="B")
    await enqueue(client, taskClass="A")
    code, answer = await client.post("lease", {"limit": -3, "taskClasses": ["B"]})
    assert [t["id"] for t in answer["data"]] == [2]
    code, answer = await client.post("lease", {"limit": 10**9, "taskClasses": None})
    assert [t["id"] for t in answer["data"]] == [1, 3]


@pytest.mark.parametrize("path", ["complete", "fail", "yield", "cancel"])
@pytest.mark.parametrize(
    "body,message",
    [
        ({}, "taskID is required"),
        ({"taskID": 0}, "taskID is required"),
        ({"taskID": -4}, "taskID is required"),
        ({"taskID": "1"}, "taskID must be an integer"),
        ({"taskID": 1.5}, "taskID must be an integer"),
        ({"taskID": True}, "taskID must be an integer"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_result_endpoints_validate_task_id(client, path, body, message):
    await enqueue(client)
    code, answer = await client.post(path, body)
    assert (code, answer) == (400, {"error": {"code": "ERR_BAD_REQUEST", "message": message}})
    code, answer = await client.get("tasks/1")
    assert answer["data"]["failureCount"] == 0 and "leaseOwner" not in answer["data"]


@pytest_twisted.ensureDeferred
async def test_an_integer_written_with_a_fraction_of_zero_is_that_integer(client):
    """JSON does not tell 2 from 2.0, and the OpenAPI document types these
    fields integer, which admits both: each names the same number."""
    await enqueue(client, priority=1000.0, delayUntil=T0 + 60.0)
    task = (await client.get("tasks/1"))[1]["data"]
    assert (task["priority"], task["leaseExpires"]) == (1000, T0 + 60)
    assert (await client.post("priority", {"taskID": 1.0, "priority": 7.0}))[0] == 200
    assert (await client.post("awaken", {"taskIDs": [1.0]}))[0] == 200
    code, answer = await client.post("cancel", {"taskID": 1.0})
    assert (code, answer["data"]["id"], answer["data"]["priority"]) == (200, 1, 7)
    assert client.last_body.startswith(b'{"data":{"id":1,')


@pytest.mark.parametrize(
    "path,body",
    [
        ("complete", {}),
        ("fail", {"permanent": True}),
        ("fail", {"permanent": False}),
        ("yield", {"duration": 60}),
        ("cancel", {}),
    ],
)
@pytest_twisted.ensureDeferred
async def test_unknown_task_is_404_everywhere(client, path, body):
    await enqueue(client)
    code, answer = await client.post(path, {"taskID": 99, **body})
    assert (code, answer) == (
        404,
        {"error": {"code": "ERR_NOT_FOUND", "message": "task not found"}},
    )
    code, answer = await client.get("stats")
    assert answer["data"] == {
        "activeCount": 1,
        "leasedCount": 0,
        "archivedCount": 0,
        "failedCount": 0,
        "oldestWaiting": [
            {"taskClass": "PhabricatorTestWorker", "priorityBand": "default", "ageSeconds": 0}
        ],
        "oldestWaitingAt": T0,
    }


@pytest_twisted.ensureDeferred
async def test_complete_archives_and_a_replay_answers_the_archived_row(client, clock):
    await enqueue(client, objectPHID=PHID)
    await client.post("lease", {"limit": 1}, headers={"X-Lease-Owner": "w1"})
    clock.advance(7)
    code, answer = await client.post("complete", {"taskID": 1, "duration": 1234})
    assert code == 200
    archived = answer["data"]
    assert archived == {
        "id": 1,
        "taskClass": "PhabricatorTestWorker",
        "leaseOwner": "w1",
        "leaseExpires": T0 + LEASE,
        "failureCount": 0,
        "dataID": 1,
        "priority": 2000,
        "objectPHID": PHID,
        "dateCreated": T0,
        "dateModified": T0 + 7,
        "result": 0,
        "duration": 1234,
        "archivedEpoch": T0 + 7,
    }
    clock.advance(30)
    assert await client.post("complete", {"taskID": 1, "duration": 1}) == (200, {"data": archived})
    # Only complete replays: cancel and permanent fail of an archived id are 404.
    assert (await client.post("cancel", {"taskID": 1}))[0] == 404
    assert (await client.post("fail", {"taskID": 1, "permanent": True}))[0] == 404
    assert (await client.get("tasks/1"))[0] == 404


@pytest_twisted.ensureDeferred
async def test_complete_rejects_negative_duration(client):
    await enqueue(client)
    code, answer = await client.post("complete", {"taskID": 1, "duration": -1})
    assert (code, answer["error"]["message"]) == (400, "duration must be >= 0")
    code, answer = await client.post("complete", {"taskID": 1, "duration": 2**63})
    assert (code, answer["error"]["message"]) == (400, f"duration must be <= {2**63 - 1}")
    assert await active_count(client) == 1


@pytest_twisted.ensureDeferred
async def test_replay_does_not_apply_to_failed_archives(client):
    await enqueue(client)
    await client.post("fail", {"taskID": 1, "permanent": True})
    assert (await client.post("complete", {"taskID": 1}))[0] == 404


@pytest_twisted.ensureDeferred
async def test_temporary_fail_backs_off_and_permanent_fail_archives(client, clock):
    await enqueue(client)
    await client.post("lease", {}, headers={"X-Lease-Owner": "w"})
    clock.advance(2)
    assert await client.post("fail", {"taskID": 1, "retryWait": 60, "message": "boom"}) == (
        200,
        {"data": {"status": "ok"}},
    )
    _, answer = await client.get("tasks/1")
    task = answer["data"]
    assert "leaseOwner" not in task
    assert task["leaseExpires"] == T0 + 62 and task["failureTime"] == T0 + 2
    assert task["failureCount"] == 1 and task["dateModified"] == T0 + 2
    assert (await client.post("lease", {}))[1] == {"data": []}
    # Default wait is GORGE_TASKQUEUE_RETRY_WAIT (300).
    await client.post("fail", {"taskID": 1, "permanent": False})
    assert (await client.get("tasks/1"))[1]["data"]["leaseExpires"] == T0 + 2 + 300
    code, answer = await client.post("fail", {"taskID": 1, "permanent": True})
    assert (code, answer) == (200, {"data": {"status": "ok"}})
    _, stats = await client.get("stats")
    assert stats["data"] == {
        "activeCount": 0,
        "leasedCount": 0,
        "archivedCount": 1,
        "failedCount": 0,
        "oldestWaiting": [],
        "oldestWaitingAt": T0 + 2,
    }


@pytest.mark.parametrize(
    "body,message",
    [
        ({"retryWait": -1}, "retryWait must be >= 0"),
        ({"retryWait": "5"}, "retryWait must be an integer"),
        ({"retryWait": UINT32_MAX}, "retryWait is too large"),
        ({"permanent": "yes"}, "permanent must be a boolean"),
        ({"permanent": 1}, "permanent must be a boolean"),
        ({"message": 5}, "message must be a string"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_bad_fail_is_400_and_writes_nothing(client, body, message):
    await enqueue(client)
    code, answer = await client.post("fail", {"taskID": 1, **body})
    assert (code, answer["error"]["message"]) == (400, message)
    assert (await client.get("tasks/1"))[1]["data"]["failureCount"] == 0


@pytest_twisted.ensureDeferred
async def test_yield_and_awaken(client, clock):
    await enqueue(client)
    await enqueue(client)
    await client.post("lease", {"limit": 2}, headers={"X-Lease-Owner": "w"})
    assert await client.post("yield", {"taskID": 1, "duration": -10}) == (
        200,
        {"data": {"status": "ok"}},
    )
    assert (await client.get("tasks/1"))[1]["data"]["leaseExpires"] == T0 + 5
    await client.post("yield", {"taskID": 2, "duration": 600})
    task = (await client.get("tasks/2"))[1]["data"]
    assert task["leaseOwner"] == YIELD_OWNER and task["leaseExpires"] == T0 + 600
    _, stats = await client.get("stats")
    assert stats["data"]["leasedCount"] == 2  # yielded tasks inside their window are held
    assert await client.post("awaken", {"taskIDs": [2, 2, 99, 0, -1]}) == (
        200,
        {"data": {"awakened": 1}},
    )
    task = (await client.get("tasks/2"))[1]["data"]
    assert task["leaseOwner"] == YIELD_OWNER and task["leaseExpires"] == T0 - 3600
    code, answer = await client.post("lease", {}, headers={"X-Lease-Owner": "w2"})
    assert [t["id"] for t in answer["data"]] == [2]


@pytest.mark.parametrize(
    "body,message",
    [
        ({}, "taskIDs is required"),
        ({"taskIDs": []}, "taskIDs is required"),
        ({"taskIDs": None}, "taskIDs is required"),
        ({"taskIDs": 3}, "taskIDs must be a list of integers"),
        ({"taskIDs": ["3"]}, "taskIDs must be a list of integers"),
        ({"taskIDs": [True]}, "taskIDs must be a list of integers"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_bad_awaken_is_400(client, body, message):
    code, answer = await client.post("awaken", body)
    assert (code, answer["error"]["message"]) == (400, message)


@pytest_twisted.ensureDeferred
async def test_yield_duration_must_be_an_integer(client):
    await enqueue(client)
    code, answer = await client.post("yield", {"taskID": 1, "duration": "60"})
    assert (code, answer["error"]["message"]) == (400, "duration must be an integer")


@pytest_twisted.ensureDeferred
async def test_cancel_copies_owner_and_expiry_as_they_stand(client):
    await enqueue(client)
    code, answer = await client.post("cancel", {"taskID": 1})
    assert code == 200
    archived = answer["data"]
    assert "leaseOwner" not in archived and "leaseExpires" not in archived
    assert archived["result"] == 2 and archived["duration"] == 0
    assert "failureTime" not in archived and "data" not in archived


@pytest_twisted.ensureDeferred
async def test_list_pages_in_queue_order_without_data(client):
    for priority in (3000, 1000, 2000, 1000):
        await enqueue(client, priority=priority)
    code, answer = await client.get("tasks?limit=2&offset=1")
    assert [t["id"] for t in answer["data"]] == [4, 3]
    assert all("data" not in t for t in answer["data"])
    for query in ("", "?limit=x&offset=y", "?limit=0&offset=-7", "?limit=-1"):
        code, answer = await client.get("tasks" + query)
        assert [t["id"] for t in answer["data"]] == [2, 4, 3, 1], query
    code, answer = await client.get("tasks?offset=10")
    assert client.last_body == b'{"data":[]}'


@pytest_twisted.ensureDeferred
async def test_get_task(client):
    await enqueue(client)
    code, answer = await client.get("tasks/1")
    assert code == 200 and answer["data"]["data"] == '{"x":1}'
    assert (await client.get("tasks/+1"))[0] == 200
    for bad in ("abc", "1.5", "++1", "99999999999999999999", "1_0", "%201", "-", "%D9%A1"):
        code, answer = await client.get("tasks/" + bad)
        assert (code, answer) == (
            400,
            {"error": {"code": "ERR_BAD_REQUEST", "message": "invalid task ID"}},
        ), bad
    for missing in ("2", "0", "-3", "9223372036854775807"):
        code, answer = await client.get("tasks/" + missing)
        assert (code, answer["error"]["message"]) == (404, "task not found"), missing


@pytest_twisted.ensureDeferred
async def test_auth_routing_and_methods(client):
    assert (await client.get("stats", token=None))[0] == 401
    code, answer = await client.get("nope", token="wrong")
    assert (code, answer["error"]["code"]) == (401, "ERR_UNAUTHORIZED")
    code, answer = await client.get("nope")
    assert (code, answer["error"]["code"]) == (404, "ERR_NOT_FOUND")
    code, answer = await client.get("enqueue")  # a known path, the wrong method
    assert (code, answer["error"]["code"]) == (405, "ERR_METHOD_NOT_ALLOWED")
    assert (await client.get("tasks/"))[0] == 404
    assert await client.get("/healthz", token=None) == (200, {"status": "ok"})
    assert await client.get("/readyz", token=None) == (200, {"status": "ok"})


@pytest_twisted.ensureDeferred
async def test_oversize_body_is_413(client):
    code, answer = await client.post(
        "enqueue", raw=b'{"taskClass":"X","data":"' + b"a" * (2 * 1024 * 1024) + b'"}'
    )
    assert (code, answer["error"]["code"]) == (413, "ERR_TOO_LARGE")
    assert await active_count(client) == 0


@pytest_twisted.ensureDeferred
async def test_readyz_follows_the_backend_without_restart(client, memory_store, failure_events):
    failure_events.append("REQUEST_FAILED")  # the access log flags every 5xx, 503 included
    memory_store.unreachable = "ping database: unreachable"
    assert await client.get("/readyz", token=None) == (
        503,
        {"status": "unavailable", "reason": "ping database: unreachable"},
    )
    memory_store.unreachable = None
    assert await client.get("/readyz", token=None) == (200, {"status": "ok"})


@pytest_twisted.ensureDeferred
async def test_backend_failure_is_opaque_500(client, memory_store, failure_events):
    failure_events += ["TASKQUEUE_BACKEND_FAILED", "REQUEST_FAILED"]

    async def broken(*args):
        raise ConnectionRefusedError("connect to 10.0.0.5:3306: connection refused")

    memory_store.stats = broken
    code, answer = await client.get("stats")
    assert (code, answer) == (
        500,
        {"error": {"code": "ERR_INTERNAL", "message": "internal server error"}},
    )


@pytest_twisted.ensureDeferred
async def test_metrics_count_by_class(client, clock):
    await enqueue(client, taskClass="A")
    await enqueue(client, taskClass="A")
    await enqueue(client, taskClass="B")
    await client.post("lease", {"limit": 3}, headers={"X-Lease-Owner": "w"})
    await client.post("complete", {"taskID": 1})
    await client.post("fail", {"taskID": 2})
    await client.post("cancel", {"taskID": 3})
    await client.get("stats")
    _, text = await client.get("/metrics", token=None)
    assert 'gorge_taskqueue_tasks_enqueued_total{task_class="A"} 2.0' in text
    assert 'gorge_taskqueue_tasks_leased_total{task_class="B"} 1.0' in text
    assert 'gorge_taskqueue_tasks_completed_total{task_class="A"} 1.0' in text
    assert 'gorge_taskqueue_tasks_failed_total{permanent="false",task_class="A"} 1.0' in text
    assert 'gorge_taskqueue_tasks_cancelled_total{task_class="B"} 1.0' in text
    assert 'gorge_taskqueue_queue_depth{state="active"} 1.0' in text
    assert "gorge_taskqueue_lease_seconds_count 1.0" in text
