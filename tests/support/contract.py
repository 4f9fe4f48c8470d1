"""The contract-fixture runner, shared by the domain tests.

A domain seeds its store, builds its real site and hands a StubTreq client
for it (``gorge.web.site.stub_client(site)``) to :func:`replay` with one fixture
file; everything about the fixture format and the assertion vocabulary
lives here so that every domain reads the fixtures the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import formatEvent
from twisted.web.http_headers import Headers

from tests.support.stubpump import pumped

CONTRACT_TOKEN = "contract-token"

#: What :func:`resolve` answers for a path that does not resolve; a key
#: present with ``null`` resolves to ``None`` and so counts as present.
MISSING: Any = object()

# A store backed by a thread answers within this.
_ANSWER_BOUND = 5.0


def fixture_files(directory: Path) -> list[Path]:
    """The ``*.json`` files of one directory (not its sub-directories), in name order."""
    return sorted(directory.glob("*.json"))


def load_fixture(path: Path) -> dict:
    fixture = json.loads(path.read_text())
    request = fixture.get("request") or {}
    assert fixture.get("name") and request.get("method") and request.get("path"), path.name
    assert isinstance(fixture.get("expect"), dict) and "status" in fixture["expect"], path.name
    return fixture


def resolve(doc: Any, path: str) -> Any:
    """A dotted path: a numeric segment indexes a list (out of range is absent); at
    each step the longest literal key wins, backtracking if the rest fails."""
    if path == "":
        return doc
    if isinstance(doc, list):
        head, _, rest = path.partition(".")
        if head.isdigit() and int(head) < len(doc):
            return resolve(doc[int(head)], rest)
        return MISSING
    if not isinstance(doc, dict):
        return MISSING
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in doc:
            found = resolve(doc[key], ".".join(parts[n:]))
            if found is not MISSING:
                return found
    return MISSING


def loosely_equal(a: Any, b: Any) -> bool:
    """Numbers numerically (3 == 3.0) but a boolean never equals a number;
    strings exactly; lists and objects structurally, by the same rule."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(loosely_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(loosely_equal(a[k], b[k]) for k in a)
    return a == b


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Headers
    body: bytes


def check(expect: dict, answer: Answer) -> None:
    """Assert the fixture's ``expect`` block: status, then headers and raw body, then
    the JSON paths (the body is decoded only when a ``json*`` check asks for it)."""
    raw = answer.body
    assert answer.status == expect["status"], raw
    for name, value in (expect.get("headerEquals") or {}).items():
        assert answer.headers.getRawHeaders(name) == [value], name
    for needle in expect.get("bodyContains") or []:
        assert needle.encode() in raw, needle
    for needle in expect.get("bodyNotContains") or []:
        assert needle.encode() not in raw, needle
    if not any(key.startswith("json") for key in expect):
        return
    doc = json.loads(raw)
    assert isinstance(doc, dict), raw
    for path in expect.get("jsonHas") or []:
        found = resolve(doc, path)
        assert found is not MISSING and found is not None and found != "", path
    for path in expect.get("jsonAbsent") or []:
        assert resolve(doc, path) is MISSING, path
    for path, want in (expect.get("jsonEquals") or {}).items():
        got = resolve(doc, path)
        assert loosely_equal(got, want), (path, got, want)
    for path, needles in (expect.get("jsonStringContains") or {}).items():
        found = resolve(doc, path)
        assert isinstance(found, str) and all(n in found for n in needles), (path, found)


async def send(client, request: dict, *, base: str = "http://contract.test") -> Answer:
    """Send the fixture's request as written (no header added) through ``client``."""
    body = request.get("body")

    async def exchange() -> Answer:
        response = await client.request(
            request["method"],
            base + request["path"],
            headers={k: [v] for k, v in (request.get("headers") or {}).items()},
            data=None if body is None else body.encode(),
        )
        return Answer(response.code, response.headers, await response.content())

    return await pumped(client, Deferred.fromCoroutine(exchange()), bound=_ANSWER_BOUND)


async def replay(client, path: Path) -> None:
    """Replay one fixture file through ``client`` and assert what it expects."""
    fixture = load_fixture(path)
    check(fixture["expect"], await send(client, fixture["request"]))


def crashes(events: list[dict]) -> list[str]:
    """The unhandled-exception events among ``events``, formatted: a handler that
    answered and then crashed is otherwise invisible behind a green status."""
    return [
        formatEvent(e)
        for e in events
        if "PANIC_RECOVERED" in (e.get("log_format") or "") or e.get("log_failure") is not None
    ]
