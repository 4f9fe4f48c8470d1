"""MySQL backend against Phorge's own layout and rows (tests/fixtures/taskqueue):
same id sequence, same columns and values, one-transaction archive,
Phorge-leased rows taken over after expiry."""

from __future__ import annotations

import json

import pymysql
import pytest
import pytest_twisted

from gorge.taskqueue.model import EnqueueRequest
from gorge.taskqueue.sql_lease import (
    PHASE1_CANDIDATES,
    PHASE1_CLAIM,
    PHASE2_CANDIDATES,
    PHASE2_CLAIM,
)
from gorge.taskqueue.store import TaskNotFound
from tests.support.paths import FIXTURES_DIR
from tests.taskqueue.helpers import Client

pytestmark = pytest.mark.integration

GOLDEN = FIXTURES_DIR / "taskqueue"
ACTIVE_COLUMNS = (
    "id",
    "taskClass",
    "leaseOwner",
    "leaseExpires",
    "failureCount",
    "dataID",
    "failureTime",
    "priority",
    "objectPHID",
    "dateCreated",
    "dateModified",
    "containerPHID",
)


def golden(name: str):
    return json.loads((GOLDEN / name).read_text())


def rows(conn, sql: str, args=()) -> list[dict]:
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute(sql, args)
        out = cur.fetchall()
    return [{k: (v.decode() if isinstance(v, bytes) else v) for k, v in r.items()} for r in out]


def phorge_enqueue(conn, task_class: str, now: int, data: str = "[]") -> int:
    """What LiskDAO + PhabricatorWorker::scheduleTask do, statement for statement."""
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("INSERT INTO worker_taskdata (data) VALUES (%s)", (data,))
        data_id = cur.lastrowid
        cur.execute(
            "INSERT INTO lisk_counter (counterName, counterValue) VALUES (%s, LAST_INSERT_ID(1))"
            " ON DUPLICATE KEY UPDATE counterValue = LAST_INSERT_ID(counterValue + 1)",
            ("worker_activetask",),
        )
        task_id = cur.lastrowid
        cur.execute(
            "INSERT INTO worker_activetask (id, taskClass, leaseOwner, leaseExpires, failureCount,"
            " dataID, failureTime, priority, objectPHID, containerPHID, dateCreated, dateModified)"
            " VALUES (%s, %s, NULL, NULL, 0, %s, NULL, 2000, NULL, NULL, %s, %s)",
            (task_id, task_class, data_id, now, now),
        )
        cur.execute("COMMIT")
    return task_id


def phorge_lease(conn, task_id: int, owner: str, expires: int) -> None:
    """Phorge's lease is a raw UPDATE of the two lease columns."""
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE worker_activetask SET leaseOwner = %s, leaseExpires = %s WHERE id = %s",
            (owner, expires, task_id),
        )


@pytest.fixture
def conn(mariadb, mysql_store):
    c = mariadb.connect(mysql_store.database)
    yield c
    c.close()


def golden_requests() -> list[tuple[int, EnqueueRequest]]:
    scheduled = golden("scheduled_tasks.json")
    payloads = {r["id"]: r["data"] for r in golden("worker_taskdata_rows.json")}
    out = []
    for spec in scheduled.values():
        options = spec.get("options") or {}
        out.append(
            (
                spec["scheduled_at"],
                EnqueueRequest(
                    task_class=spec["class"],
                    data=payloads[spec["result"]["dataID"]],
                    priority=options.get("priority", 2000),
                    object_phid=options.get("objectPHID"),
                    container_phid=options.get("containerPHID"),
                    delay_until=options.get("delayUntil"),
                ),
            )
        )
    return out


async def enqueue_golden_requests(mysql_store, conn, clock) -> None:
    """Enqueue the golden requests at their times, the id sequences where Phorge's were."""
    with conn.cursor() as cur:
        cur.execute("INSERT INTO lisk_counter VALUES ('worker_activetask', 36)")
        cur.execute("ALTER TABLE worker_taskdata AUTO_INCREMENT = 35")
    for scheduled_at, request in golden_requests():
        clock.advance(scheduled_at - clock.seconds())
        await mysql_store.enqueue(request)


@pytest_twisted.ensureDeferred
async def test_enqueue_writes_the_rows_phorge_writes(mysql_store, conn, clock):
    steps = golden("steps.json")
    await enqueue_golden_requests(mysql_store, conn, clock)
    assert (
        rows(conn, "SELECT * FROM worker_activetask ORDER BY id") == steps[1]["worker_activetask"]
    )
    assert rows(conn, "SELECT * FROM worker_taskdata ORDER BY id") == golden(
        "worker_taskdata_rows.json"
    )
    assert rows(conn, "SELECT * FROM lisk_counter") == steps[1]["lisk_counter"]


@pytest_twisted.ensureDeferred
async def test_archive_rows_equal_phorges(mysql_store, conn, clock):
    final = {r["id"]: r for r in golden("final_rows.json")["worker_archivetask"]}
    await enqueue_golden_requests(mysql_store, conn, clock)
    # A: leased by Phorge's taskmaster, completed through us (2 µs).
    phorge_lease(conn, 37, "22413:1795947021:vm:1", 1795954221)
    clock.advance(1795947021 - clock.seconds())
    archived = await mysql_store.complete(37, 2)
    # D: leased by Phorge, failed permanently through us.
    phorge_lease(conn, 40, "22509:1795947030:vm:1", 1795954230)
    clock.advance(1795947030 - clock.seconds())
    await mysql_store.fail(40, True, 300)
    # E: leased by Phorge, completed through us (1 µs).
    phorge_lease(conn, 41, "22516:1795947030:vm:1", 1795954230)
    await mysql_store.complete(41, 1)
    got = {r["id"]: r for r in rows(conn, "SELECT * FROM worker_archivetask")}
    assert got == {37: final[37], 40: final[40], 41: final[41]}
    assert archived.to_json()["dateModified"] == final[37]["dateModified"]
    assert {r["id"] for r in rows(conn, "SELECT id FROM worker_activetask")} == {38, 39, 42, 43}
    # Payload rows stay until Phorge's garbage collection.
    assert len(rows(conn, "SELECT id FROM worker_taskdata")) == 7
    assert rows(conn, "SELECT * FROM lisk_counter") == [
        {"counterName": "worker_activetask", "counterValue": 43}
    ]


@pytest_twisted.ensureDeferred
async def test_phorge_and_gorge_enqueues_share_one_id_sequence(mysql_store, conn, clock):
    ids = []
    for i in range(6):
        if i % 2:
            ids.append(phorge_enqueue(conn, "PhorgeSide", int(clock.seconds())))
        else:
            ids.append((await mysql_store.enqueue(EnqueueRequest("GorgeSide", "{}"))).id)
    assert ids == [1, 2, 3, 4, 5, 6]
    assert rows(
        conn, "SELECT counterValue FROM lisk_counter WHERE counterName = %s", ("worker_activetask",)
    ) == [{"counterValue": 6}]
    listed = await mysql_store.list_tasks(10, 0)
    assert [(t.id, t.task_class) for t in listed] == [
        (1, "GorgeSide"),
        (2, "PhorgeSide"),
        (3, "GorgeSide"),
        (4, "PhorgeSide"),
        (5, "GorgeSide"),
        (6, "PhorgeSide"),
    ]


@pytest_twisted.ensureDeferred
async def test_expired_phorge_lease_is_taken_in_phase_two(mysql_store, conn, clock):
    now = int(clock.seconds())
    held = phorge_enqueue(conn, "PhabricatorTestWorker", now - 9000, '{"doWork":"succeed"}')
    live = phorge_enqueue(conn, "PhabricatorTestWorker", now - 9000)
    phorge_lease(conn, held, "22413:1795947021:vm:1", now - 1)  # crashed taskmaster
    phorge_lease(conn, live, "22414:1795947021:vm:1", now)  # still held this second
    won = await mysql_store.lease("host:1:2:gorge-worker", 5, 7200)
    assert [(t.id, t.lease_owner, t.lease_expires, t.data) for t in won] == [
        (held, "host:1:2:gorge-worker", now + 7200, '{"doWork":"succeed"}')
    ]
    assert won[0].date_modified == now - 9000
    assert rows(conn, "SELECT leaseOwner FROM worker_activetask WHERE id = %s", (live,)) == [
        {"leaseOwner": "22414:1795947021:vm:1"}
    ]


@pytest_twisted.ensureDeferred
async def test_archive_is_one_transaction(mysql_store, conn):
    task = await mysql_store.enqueue(EnqueueRequest("X", "{}"))
    # A stale archive row with the same id makes the archive INSERT fail:
    # the active row must survive (rolled back), not vanish.
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO worker_archivetask (id, taskClass, failureCount, dataID, result,"
            " duration, dateCreated, dateModified, priority) VALUES (%s,'X',0,1,1,0,1,1,1)",
            (task.id,),
        )
    with pytest.raises(pymysql.err.IntegrityError):
        await mysql_store.cancel(task.id)
    assert (await mysql_store.get_task(task.id)).id == task.id
    with pytest.raises(TaskNotFound):
        await mysql_store.complete(task.id + 1, 0)


@pytest_twisted.ensureDeferred
async def test_phids_come_back_as_text_and_multibyte_owner_fits(mysql_store):
    await mysql_store.enqueue(
        EnqueueRequest("X", "ü", object_phid="PHID-TASK-a", container_phid="PHID-USER-b")
    )
    owner = "é" * 64  # 64 characters, 128 bytes: VARCHAR(64) counts characters
    (task,) = await mysql_store.lease(owner, 1, 7200)
    assert (task.object_phid, task.container_phid, task.lease_owner, task.data) == (
        "PHID-TASK-a",
        "PHID-USER-b",
        owner,
        "ü",
    )
    assert (await mysql_store.get_task(task.id)).lease_owner == owner


@pytest_twisted.ensureDeferred
async def test_http_refuses_an_owner_the_column_would_cut(mysql_store, conn, clock):
    client = Client(mysql_store, clock, backend="mysql")
    await client.post("enqueue", {"taskClass": "X"})
    code, answer = await client.post("lease", {}, headers={"X-Lease-Owner": "w" * 65})
    assert (code, answer["error"]["code"]) == (400, "ERR_BAD_REQUEST")
    assert rows(conn, "SELECT leaseOwner, leaseExpires FROM worker_activetask") == [
        {"leaseOwner": None, "leaseExpires": None}
    ]
    code, answer = await client.get("tasks/1")
    assert answer["data"]["id"] == 1 and "leaseOwner" not in answer["data"]


def test_claims_are_conditional_writes():
    # Protocol-defining statements: a claim re-checks the predicate it was selected by.
    assert "leaseOwner IS NULL AND leaseExpires IS NULL" in PHASE1_CANDIDATES
    assert PHASE1_CLAIM.endswith("WHERE id = %s AND leaseOwner IS NULL AND leaseExpires IS NULL")
    assert "leaseExpires < %s" in PHASE2_CANDIDATES
    assert PHASE2_CLAIM.endswith("WHERE id = %s AND leaseExpires < %s")
    for statement in (PHASE1_CANDIDATES, PHASE2_CANDIDATES):
        assert statement.endswith("ORDER BY priority, id LIMIT %s")
