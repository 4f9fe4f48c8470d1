"""Contract fixtures (platform.md §12) replayed in-process through the real site.

The seeded store is the SQLite one (same tables, same SQL as MySQL through
the store's dialect): 2 hooks, 1 disabled; queued/sent/failed = 3/2/1.
``unavailable/`` runs against a store whose every call fails.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from twisted.internet import reactor
from twisted.internet.task import deferLater
from twisted.logger import formatEvent

from gorge.config import HttpSettings, MySQLSettings
from gorge.web import stub_client
from gorge.webhook.service import build_webhook_service
from gorge.webhook.store import WebhookStore
from tests.webhook.conftest import webhook_settings

HERE = Path(__file__).parent / "contract"
FIXTURES = sorted(HERE.glob("*.json"))
UNAVAILABLE = sorted((HERE / "unavailable").glob("*.json"))
TOKEN = "contract-token"
_MISSING = object()


def resolve(doc, path: str):
    """platform.md §12.2 paths: longest literal key first, with backtracking."""
    if path == "":
        return doc
    if isinstance(doc, list):
        head, _, rest = path.partition(".")
        return resolve(doc[int(head)], rest) if head.isdigit() and int(head) < len(doc) else _MISSING
    if not isinstance(doc, dict):
        return _MISSING
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in doc:
            found = resolve(doc[key], ".".join(parts[n:]))
            if found is not _MISSING:
                return found
    return _MISSING


def loosely_equal(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b


def seed(path: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    for phid, status in (("PHID-HWBH-enabled", "enabled"), ("PHID-HWBH-disabled", "disabled")):
        conn.execute("INSERT INTO herald_webhook (phid, name, webhookURI, viewPolicy, editPolicy,"
                     " status, hmacKey, dateCreated, dateModified) VALUES"
                     " (?, 'n', 'http://127.0.0.1:9/x?token=t', 'u', 'u', ?, ?, 1, 1)",
                     (phid.encode(), status, "k" * 32))
    n = 0
    for status, count in (("queued", 3), ("sent", 2), ("failed", 1)):
        for _ in range(count):
            n += 1
            conn.execute("INSERT INTO herald_webhookrequest (phid, webhookPHID, objectPHID, status,"
                         " properties, lastRequestResult, lastRequestEpoch, dateCreated,"
                         " dateModified) VALUES (?, ?, 'PHID-TASK-x', ?, '{}', 'none', 0, 1, 1)",
                         (f"PHID-HWBR-{n}".encode(), b"PHID-HWBH-enabled", status))
    conn.close()


@pytest.fixture
def contract_site(tmp_path):
    made = []

    async def make(available: bool):
        path = str(tmp_path / "herald.sqlite") if available else str(tmp_path / "missing" / "x")
        store = WebhookStore.sqlite(path, reactor)
        made.append(store)
        if available:
            assert await store.ping(reactor) is None  # creates the tables
            seed(path)
        settings = webhook_settings(MySQLSettings(database="contract_herald"), http=HttpSettings(
            listen_addr="127.0.0.1:0", endpoint="tcp:0:interface=127.0.0.1", token=TOKEN))
        service = build_webhook_service(settings, reactor, store=store,
                                        registry=CollectorRegistry())
        return stub_client(service.site)

    yield make
    for store in made:
        store.close()


def test_fixture_directories_are_not_empty():
    assert [p.name for p in FIXTURES] == [
        "hooks.json", "stats.json", "token-via-query-param.json", "unauthorized.json"]
    assert [p.name for p in UNAVAILABLE] == ["stats-database-unreachable.json"]


async def _pumped(client, d):
    """The store answers from its own thread: pump the in-memory connection until ``d`` fires."""
    fired: list = []
    d.addBoth(lambda result: fired.append(result) or result)
    for _ in range(500):
        if fired:
            return await d
        client.flush()
        await deferLater(reactor, 0.01)
    raise AssertionError("no answer within 5 s")


async def _replay(client, path: Path, captured_log) -> None:
    fixture = json.loads(path.read_text())
    assert fixture.get("name") and fixture["request"].get("method") and fixture["request"].get("path")
    req, expect = fixture["request"], fixture["expect"]
    d = client.request(req["method"], "http://webhook" + req["path"],
                       headers={k: [v] for k, v in req.get("headers", {}).items()},
                       data=req["body"].encode() if "body" in req else None)
    response = await _pumped(client, d)
    raw = await _pumped(client, response.content())
    assert response.code == expect["status"], raw
    for name, value in expect.get("headerEquals", {}).items():
        assert response.headers.getRawHeaders(name) == [value]
    for s in expect.get("bodyContains", []):
        assert s in raw.decode()
    for s in expect.get("bodyNotContains", []):
        assert s not in raw.decode()
    if any(k.startswith("json") for k in expect):
        doc = json.loads(raw)
        assert isinstance(doc, dict)
        for p in expect.get("jsonHas", []):
            v = resolve(doc, p)
            assert v is not _MISSING and v is not None and v != "", p
        for p in expect.get("jsonAbsent", []):
            assert resolve(doc, p) is _MISSING, p
        for p, want in expect.get("jsonEquals", {}).items():
            assert loosely_equal(resolve(doc, p), want), p
        for p, subs in expect.get("jsonStringContains", {}).items():
            v = resolve(doc, p)
            assert isinstance(v, str) and all(s in v for s in subs), p


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
async def test_contract(path, contract_site, captured_log):
    await _replay(await contract_site(True), path, captured_log)
    crashes = [formatEvent(e) for e in captured_log
               if "PANIC_RECOVERED" in (e.get("log_format") or "") or e.get("log_failure")]
    assert crashes == []


@pytest.mark.parametrize("path", UNAVAILABLE, ids=[p.stem for p in UNAVAILABLE])
async def test_contract_unavailable(path, contract_site, captured_log):
    await _replay(await contract_site(False), path, captured_log)
