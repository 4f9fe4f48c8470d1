"""Contract fixtures replayed in-process through the real site.

The seeded store is the SQLite one (same tables, same SQL as MySQL through
the SQLite engine): 2 hooks, 1 disabled; queued/sent/failed = 3/2/1.
``unavailable/`` runs against a store whose every call fails.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from twisted.internet import reactor

from gorge.config import HttpSettings, MySQLSettings
from gorge.demo.herald_schema import HERALD_SCHEMA
from gorge.web.site import stub_client
from gorge.webhook.service import build_webhook_service
from gorge.webhook.store import WebhookStore
from tests.support.contract import CONTRACT_TOKEN, crashes, fixture_files, replay
from tests.support.logcapture import logged_events
from tests.webhook.conftest import webhook_settings

HERE = Path(__file__).parent / "contract"
FIXTURES = fixture_files(HERE)
UNAVAILABLE = fixture_files(HERE / "unavailable")


def seed(path: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    for phid, status in (("PHID-HWBH-enabled", "enabled"), ("PHID-HWBH-disabled", "disabled")):
        conn.execute(
            "INSERT INTO herald_webhook (phid, name, webhookURI, viewPolicy, editPolicy,"
            " status, hmacKey, dateCreated, dateModified) VALUES"
            " (?, 'n', 'http://127.0.0.1:9/x?token=t', 'u', 'u', ?, ?, 1, 1)",
            (phid.encode(), status, "k" * 32),
        )
    n = 0
    for status, count in (("queued", 3), ("sent", 2), ("failed", 1)):
        for _ in range(count):
            n += 1
            conn.execute(
                "INSERT INTO herald_webhookrequest (phid, webhookPHID, objectPHID, status,"
                " properties, lastRequestResult, lastRequestEpoch, dateCreated,"
                " dateModified) VALUES (?, ?, 'PHID-TASK-x', ?, '{}', 'none', 0, 1, 1)",
                (f"PHID-HWBR-{n}".encode(), b"PHID-HWBH-enabled", status),
            )
    conn.close()


@pytest.fixture
def contract_site(tmp_path):
    made = []

    async def make(available: bool):
        path = str(tmp_path / "herald.sqlite") if available else str(tmp_path / "missing" / "x")
        store = WebhookStore.sqlite(path, reactor, schema=HERALD_SCHEMA)
        made.append(store)
        if available:
            assert await store.ping() is None  # creates the tables
            seed(path)
        settings = webhook_settings(
            MySQLSettings(database="contract_herald"),
            http=HttpSettings(
                listen_addr="127.0.0.1:0",
                endpoint="tcp:0:interface=127.0.0.1",
                token=CONTRACT_TOKEN,
            ),
        )
        service = build_webhook_service(
            settings, reactor, store=store, registry=CollectorRegistry()
        )
        return stub_client(service.part("site"))

    yield make
    for store in made:
        store.close()


def test_fixture_directories_are_not_empty():
    assert [p.name for p in FIXTURES] == [
        "hooks-state.json",
        "hooks.json",
        "request-retry-queued.json",
        "request-retry.json",
        "request-show.json",
        "request-unknown.json",
        "requests-bad-filter.json",
        "requests-list.json",
        "stats.json",
        "token-via-query-param.json",
        "unauthorized.json",
    ]
    assert [p.name for p in UNAVAILABLE] == ["stats-database-unreachable.json"]


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
async def test_contract(path, contract_site):
    with logged_events() as events:
        await replay(await contract_site(True), path)
    assert crashes(events) == []


@pytest.mark.parametrize("path", UNAVAILABLE, ids=[p.stem for p in UNAVAILABLE])
async def test_contract_unavailable(path, contract_site):
    await replay(await contract_site(False), path)
