"""Contract fixtures (platform.md §12) replayed through the real site."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytest_twisted
from twisted.logger import formatEvent

from tests.mailer.conftest import make_harness, contract_env

FIXTURES = sorted((Path(__file__).parent / "contract").glob("*.json"))
_MISSING = object()


def resolve(doc, path: str):
    """platform.md §12.2 paths: longest literal key first, with backtracking."""
    if path == "":
        return doc
    if isinstance(doc, list):
        head, _, rest = path.partition(".")
        if head.isdigit() and int(head) < len(doc):
            return resolve(doc[int(head)], rest)
        return _MISSING
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
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(loosely_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(loosely_equal(a[k], b[k]) for k in a)
    return a == b


def test_fixture_directory_is_not_empty():
    assert len(FIXTURES) == 11


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
@pytest_twisted.ensureDeferred
async def test_contract(path, events):
    fixture = json.loads(path.read_text())
    assert fixture.get("name") and fixture["request"].get("method") and fixture["request"].get("path")
    h = make_harness(contract_env())
    req, expect = fixture["request"], fixture["expect"]
    headers = {k: [v] for k, v in req.get("headers", {}).items()}
    body = req.get("body")
    response = await h.client.request(req["method"], "http://mailer" + req["path"],
                                      headers=headers,
                                      data=body.encode() if body is not None else None)
    raw = await response.content()
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
    crashes = [formatEvent(e) for e in events if "PANIC_RECOVERED" in (e.get("log_format") or "")
               or e.get("log_failure") is not None]
    assert crashes == []


def test_resolver_paths():
    doc = {"data": [{"id": 1}], "clients.active": 3, "a": {"b.c": {"d": 4}}}
    assert resolve(doc, "data.0.id") == 1
    assert resolve(doc, "data.1") is _MISSING
    assert resolve(doc, "clients.active") == 3
    assert resolve(doc, "a.b.c.d") == 4
