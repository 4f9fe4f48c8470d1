"""The MySQL task store on grown worker tables: no statement reads a whole table.

``worker_archivetask`` keeps every finished task until Phorge's garbage
collector removes it, and ``worker_activetask`` can hold a long backlog
(delayed tasks, tasks failing and retrying, an import). Every statement the
store issues while doing all of its operations is run through EXPLAIN on
tables holding 40,000 archived and 25,000 active tasks, and the rows each
one really read are counted.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from gorge.taskqueue import counts, sql_calls, sql_lease, sql_reads, sqlstore
from gorge.taskqueue.model import EnqueueRequest
from tests.taskqueue.conftest import LEASE, T0, open_mysql_store

pytestmark = pytest.mark.integration

ARCHIVED = 40_000
ACTIVE = 25_000
CLASSES = (
    "PhabricatorRepositoryPullWorker",
    "PhabricatorSearchWorker",
    "FeedPublisherWorker",
    "PhabricatorMetaMTAWorker",
)


def fill(conn) -> None:
    """Grown tables, the way Phorge leaves them; the counter continues above them."""
    with conn.cursor() as cur:
        cur.execute("INSERT INTO worker_taskdata (id, data) VALUES (1, '[]')")
        cur.executemany(
            "INSERT INTO worker_archivetask (id, taskClass, leaseOwner, leaseExpires,"
            " failureCount, dataID, result, duration, dateCreated, dateModified, priority,"
            " objectPHID, archivedEpoch, containerPHID) VALUES"
            " (%s, %s, 'x', %s, 0, 1, 0, 1000, %s, %s, 2000, NULL, %s, NULL)",
            [
                (n + 1, CLASSES[n % 4], T0 - 86400, T0 - 86400, T0 - 86400, T0 - 86400)
                for n in range(8)
            ],
        )
        while True:
            cur.execute("SELECT COUNT(*), MAX(id) FROM worker_archivetask")
            count, top = cur.fetchone()
            if count >= ARCHIVED:
                break
            cur.execute(
                "INSERT INTO worker_archivetask (id, taskClass, leaseOwner, leaseExpires,"
                " failureCount, dataID, result, duration, dateCreated, dateModified, priority,"
                " objectPHID, archivedEpoch, containerPHID)"
                " SELECT id + %s, taskClass, leaseOwner, leaseExpires, failureCount, dataID,"
                " result, duration, dateCreated, dateModified, priority, objectPHID,"
                " archivedEpoch, containerPHID FROM worker_archivetask ORDER BY id LIMIT %s",
                (top, ARCHIVED - count),
            )
        # The backlog: mostly never leased, some delayed, failing or leased by Phorge.
        rows = []
        for n in range(ACTIVE):
            task_id = ARCHIVED + 1 + n
            kind = n % 10
            owner = "1234:1795940000:phorge-daemon:1" if kind == 9 else None
            expires = None if kind < 7 else T0 + 3600
            failures = 1 if kind == 8 else 0
            rows.append(
                (
                    task_id,
                    CLASSES[n % 4],
                    owner,
                    expires,
                    failures,
                    T0 - 60 if failures else None,
                    2000 + (n % 3) * 1000,
                    T0 - 600,
                    T0 - 600,
                )
            )
        cur.executemany(
            "INSERT INTO worker_activetask (id, taskClass, leaseOwner, leaseExpires,"
            " failureCount, dataID, failureTime, priority, objectPHID, dateCreated,"
            " dateModified, containerPHID) VALUES (%s, %s, %s, %s, %s, 1, %s, %s, NULL, %s,"
            " %s, NULL)",
            rows,
        )
        cur.execute(
            "INSERT INTO lisk_counter (counterName, counterValue) VALUES ('worker_activetask', %s)",
            (ARCHIVED + ACTIVE,),
        )
        cur.execute("ANALYZE TABLE worker_activetask, worker_archivetask")
        cur.fetchall()


@pytest.fixture
def grown(mariadb, worker_db, clock):
    conn = mariadb.connect(worker_db)
    fill(conn)
    store = open_mysql_store(mariadb, worker_db, clock)
    statements: list[tuple[str, tuple]] = []
    execute = store._exec

    def recording(txn, statement, args=()):
        statements.append((statement, tuple(args)))
        return execute(txn, statement, args)

    store._exec = recording
    yield store, conn, statements
    pytest_twisted.blockon(Deferred.fromCoroutine(store.close()))
    conn.close()


NEW_CLASS = "GorgeExplainWorker"


async def exercise(store, clock) -> None:
    """Every operation of the store, as the workers and the API use them."""
    made = [
        await store.enqueue(EnqueueRequest(task_class=NEW_CLASS, data="{}", priority=1000))
        for n in range(6)
    ]
    leased = await store.lease("gorge:1", 3, LEASE)
    leased += await store.lease("gorge:2", 3, LEASE, task_classes=[NEW_CLASS])
    await store.complete(leased[0].id, 5)
    await store.fail(leased[1].id, False, 60)
    await store.fail(leased[2].id, True, 0)
    await store.yield_(leased[3].id, 300)
    await store.awaken([leased[3].id, made[5].id])
    await store.cancel(made[5].id)
    clock.advance(LEASE + 1)  # leases run out: the expired-lease phase
    await store.lease("gorge:3", 5, LEASE)
    await store.lease("gorge:4", 5, LEASE, task_classes=[NEW_CLASS])
    await store.stats()
    await store.oldest_waiting()
    await store.list_tasks(100, 0)
    await store.list_tasks(100, 15_000)
    await store.get_task(ARCHIVED + 1)
    await store.get_archived(leased[0].id)


def plan(conn, how: str, statement: str, args: tuple) -> list[dict]:
    """EXPLAIN, or ANALYZE (run it, report the rows really read) inside a
    rolled-back transaction."""
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        try:
            cur.execute(f"{how} " + cur.mogrify(statement, args))
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        finally:
            cur.execute("ROLLBACK")


WORKER_TABLES = ("worker_activetask", "worker_archivetask", "t", "d")
# The largest slice any statement may read: one statement of the first count.
MOST_ROWS = counts.LOAD_CHUNK
assert min(ACTIVE, ARCHIVED) > 2 * MOST_ROWS


def reads_too_much(steps: list[dict]) -> list[dict]:
    return [
        step
        for step in steps
        if step["table"] in WORKER_TABLES
        and (step["type"] in ("ALL", "index") or float(step.get("r_rows") or 0) > MOST_ROWS)
    ]


# Where the SQL store's statements live.
STATEMENT_MODULES = (sqlstore, sql_calls, sql_lease, sql_reads)


async def test_no_statement_of_the_mysql_store_reads_a_whole_table(grown, clock):
    store, conn, statements = grown
    await exercise(store, clock)
    issued = {statement for statement, _ in statements}
    for name in (
        "STATS",
        "LIST",
        "PHASE1_CANDIDATES",
        "PHASE2_CANDIDATES",
        "FETCH_WON",
        "SELECT_ACTIVE",
        "SELECT_ARCHIVED",
        "TEMPORARY_FAIL",
        "YIELD",
        "GET",
        "NEXT_WAITING_PRIORITY",
        "WAITING_HEAD",
        "DUE_AGAIN_HEAD",
    ):
        home = next(m for m in STATEMENT_MODULES if hasattr(m, name))
        template = getattr(home, name).format(classes="", lock="", ids="%s")
        assert any(s.startswith(template.split("%s")[0][:60]) for s in issued), name
    checked = set()
    for statement, args in statements:
        if statement in checked or statement.startswith("INSERT"):
            continue  # inserts of given values read nothing
        checked.add(statement)
        explained = plan(conn, "EXPLAIN", statement, args)
        analyzed = plan(conn, "ANALYZE", statement, args)
        assert reads_too_much(explained) == [] and reads_too_much(analyzed) == [], (
            statement,
            analyzed,
        )


async def test_stats_follow_every_writer_without_counting_whole_tables(grown, clock):
    """Counts kept per block stay equal to COUNT(*) whoever changes the tables."""
    store, conn, statements = grown

    def truth():
        with conn.cursor() as cur:
            cur.execute(
                "SELECT (SELECT COUNT(*) FROM worker_activetask),"
                " (SELECT COUNT(*) FROM worker_archivetask)"
            )
            return tuple(int(v) for v in cur.fetchone())

    def changed_outside(sql: str, args: tuple = ()) -> None:
        with conn.cursor() as cur:
            cur.execute(sql, args)

    stats = await store.stats()
    assert (stats.active, stats.archived) == truth() == (ACTIVE, ARCHIVED)
    await exercise(store, clock)
    stats = await store.stats()
    assert (stats.active, stats.archived) == truth()
    # Phorge's own daemons archive a task (insert + delete, stamped with their clock).
    changed_outside(
        "INSERT INTO worker_archivetask (id, taskClass, leaseOwner, leaseExpires, failureCount,"
        " dataID, result, duration, dateCreated, dateModified, priority, objectPHID,"
        " archivedEpoch, containerPHID) SELECT id, taskClass, leaseOwner, leaseExpires,"
        " failureCount, dataID, 0, 10, dateCreated, %s, priority, objectPHID, %s,"
        " containerPHID FROM worker_activetask WHERE id = %s",
        (int(clock.seconds()) - 30, int(clock.seconds()), ARCHIVED + 7),
    )
    changed_outside("DELETE FROM worker_activetask WHERE id = %s", (ARCHIVED + 7,))
    # ... and the garbage collector removes the oldest archived tasks.
    changed_outside("DELETE FROM worker_archivetask WHERE id <= 2500")
    before = len(statements)
    stats = await store.stats()
    assert (stats.active, stats.archived) == truth()
    for statement, args in statements[before:]:
        assert reads_too_much(plan(conn, "ANALYZE", statement, args)) == [], statement
    # A row removed by hand in the middle is found by the round of recounts.
    changed_outside("DELETE FROM worker_archivetask WHERE id = 20000")
    for _ in range((ARCHIVED + ACTIVE) // 1000 + 2):
        stats = await store.stats()
    assert (stats.active, stats.archived) == truth()
