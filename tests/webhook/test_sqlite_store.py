"""The webhook store on SQLite (demo): same tables, same SQL through the SQLite engine."""

from __future__ import annotations

import json
import sqlite3

import pytest
from prometheus_client import CollectorRegistry
from twisted.internet import reactor, task
from twisted.internet.defer import Deferred

from gorge.config import MySQLSettings
from gorge.demo.herald_schema import HERALD_SCHEMA
from gorge.webhook.service import build_webhook_service
from gorge.webhook.store import WebhookStore
from tests.webhook.conftest import T0, webhook_settings
from tests.webhook.golden import all_cases


class SQLiteHerald:
    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)

    def insert(self, table: str, row: dict) -> int:
        values = {
            k: (
                v.encode()
                if k in ("phid", "webhookPHID", "objectPHID", "viewPolicy", "editPolicy")
                else v
            )
            for k, v in row.items()
            if k != "id"
        }
        marks = ", ".join("?" * len(values))
        cur = self.conn.execute(
            f"INSERT INTO {table} ({', '.join(values)}) VALUES ({marks})", tuple(values.values())
        )
        return cur.lastrowid

    def request(self, request_id: int) -> dict:
        cur = self.conn.execute(
            "SELECT status, properties, lastRequestResult, lastRequestEpoch, dateCreated,"
            " dateModified FROM herald_webhookrequest WHERE id = ?",
            (request_id,),
        )
        return dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))


@pytest.fixture
def sqlite_service(tmp_path):
    path = str(tmp_path / "herald.sqlite")
    clock = task.Clock()
    clock.advance(T0)
    store = WebhookStore.sqlite(path, reactor, schema=HERALD_SCHEMA, db_clock=clock)
    service = build_webhook_service(
        webhook_settings(MySQLSettings(database="demo_herald")),
        reactor,
        store=store,
        clock=clock,
        registry=CollectorRegistry(),
    )
    # The pool creates the schema on its first connection.
    yield service, clock, path
    store.close()


async def run_tick(service) -> None:
    await Deferred.fromCoroutine(service.part("dispatcher").tick())
    assert await service.part("dispatcher").wait_idle(20, reactor)


async def test_golden_cases_on_sqlite(sqlite_service, receiver):
    service, clock, path = sqlite_service
    assert await service.part("store").ping() is None  # creates the tables
    db = SQLiteHerald(path)
    expected = {}
    for case in all_cases():
        hook = dict(
            case.hook_before,
            webhookURI=receiver.base + case.hook_before["webhookURI"].split("8765", 1)[1],
        )
        if not db.conn.execute(
            "SELECT 1 FROM herald_webhook WHERE phid = ?", (hook["phid"].encode(),)
        ).fetchone():
            db.insert("herald_webhook", hook)
        expected[db.insert("herald_webhookrequest", case.request_before)] = case
    clock.advance(max(c.request_before["dateCreated"] for c in all_cases()) - clock.seconds())
    await run_tick(service)
    for request_id, case in expected.items():
        row = db.request(request_id)
        assert row["status"] == case.request_after["status"], case.name
        assert row["lastRequestResult"] == case.request_after["lastRequestResult"], case.name
        assert row["properties"] == case.request_after["properties"], case.name
        assert row["dateModified"] > row["dateCreated"]
    assert sorted(r.body for r in receiver.requests) == sorted(
        c.body for c in all_cases() if c.made_request
    )


def _insert_hook_a(db: SQLiteHerald, receiver) -> None:
    """The enabled hook ``PHID-HWBH-a``, posting to the receiver's ``/a``."""
    db.insert(
        "herald_webhook",
        dict(
            phid="PHID-HWBH-a",
            name="a",
            webhookURI=f"{receiver.base}/a",
            viewPolicy="u",
            editPolicy="u",
            status="enabled",
            hmacKey="k" * 32,
            dateCreated=T0,
            dateModified=T0,
        ),
    )


async def test_claim_and_stats_on_sqlite(sqlite_service, receiver):
    service, clock, path = sqlite_service
    assert await service.part("store").ping() is None
    db = SQLiteHerald(path)
    _insert_hook_a(db, receiver)
    request_id = db.insert(
        "herald_webhookrequest",
        dict(
            phid="PHID-HWBR-a",
            webhookPHID="PHID-HWBH-a",
            objectPHID="PHID-TASK-a",
            status="queued",
            properties=json.dumps({"retry": "forever"}),
            lastRequestResult="none",
            lastRequestEpoch=0,
            dateCreated=T0,
            dateModified=T0,
        ),
    )
    (candidate,) = await service.part("store").claims.candidates(limit=5, lease=30, backoff=60)
    assert await service.part("store").claims.claim(candidate) is True
    assert (
        await service.part("store").claims.claim(candidate) is False
    )  # same second, version moved
    assert db.request(request_id)["dateModified"] == T0 + 1
    stats = await service.part("store").observation.stats()
    assert (stats.queued, stats.sent, stats.failed, stats.active_hooks) == (1, 0, 0, 1)
    assert await service.part("store").observation.hook_total() == 1


async def test_history_start_up_pass_and_recount_on_sqlite(sqlite_service, receiver):
    # Enough rows for the start-up pass's per-block counts (integer division on
    # SQLite) and for the background recount to find a row put back to queued.
    service, clock, path = sqlite_service
    assert await service.part("store").ping() is None
    db = SQLiteHerald(path)
    _insert_hook_a(db, receiver)
    old = db.insert(
        "herald_webhookrequest",
        dict(
            phid="PHID-HWBR-old",
            webhookPHID="PHID-HWBH-a",
            objectPHID="PHID-TASK-a",
            status="queued",
            properties="{}",
            lastRequestResult="none",
            lastRequestEpoch=0,
            dateCreated=T0 - 10,
            dateModified=T0 - 10,
        ),
    )
    db.conn.executemany(
        "INSERT INTO herald_webhookrequest (phid, webhookPHID, objectPHID, status, properties,"
        " lastRequestResult, lastRequestEpoch, dateCreated, dateModified)"
        " VALUES (?, 'PHID-HWBH-a', 'PHID-TASK-a', ?, '{}', ?, 1, 1, 2)",
        [
            (
                f"PHID-HWBR-h{n}".encode(),
                "failed" if n % 4 == 0 else "sent",
                "fail" if n % 4 == 0 else "okay",
            )
            for n in range(3000)
        ],
    )
    stats = await service.part("store").observation.stats()
    assert (stats.queued, stats.sent, stats.failed) == (1, 2250, 750)
    await run_tick(service)
    assert db.request(old)["status"] == "sent" and receiver.count("/a") == 1
    db.conn.execute(
        "UPDATE herald_webhookrequest SET status = 'queued', dateModified = ? WHERE id = 1000",
        (T0,),
    )
    # dateModified now differs from dateCreated: the row counts as leased for one lease.
    clock.advance(30)
    for _ in range(3):  # 2,000 ids a second: the whole table within two seconds
        clock.advance(1)
        await run_tick(service)
    assert receiver.count("/a") == 2
    stats = await service.part("store").observation.stats()
    assert (stats.queued, stats.sent, stats.failed) == (0, 2251, 750)


async def test_the_demo_file_is_opened_like_the_taskqueue_one(sqlite_service):
    # WAL lets the demo's readers (and Phorge-side writers) work beside the
    # store; the busy timeout makes a writer wait rather than fail.
    service, _, path = sqlite_service
    store = service.part("store")
    assert await store.ping() is None

    def pragmas(txn) -> tuple:
        txn.execute("PRAGMA journal_mode")
        journal = txn.fetchone()[0]
        txn.execute("PRAGMA busy_timeout")
        return journal, txn.fetchone()[0]

    assert await store.db.run("pragmas", pragmas) == ("wal", 5000)
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
