"""Shared helpers for the mailer tests: a service built in-process from an
environment mapping, exercised through the real Site with StubTreq."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from twisted.internet import task
from twisted.internet.task import LoopingCall

from gorge.mailer.message import Message, parse_send_request
from gorge.mailer.service import build_mailer_service
from gorge.mailer.settings import load_mailer_settings
from gorge.web.site import stub_client
from tests.support.logcapture import logged_events

TOKEN = "contract-token"

# The mailer runner's four test backends, retries off.
CONTRACT_MAILERS = [
    {"key": "test-mailer", "type": "test", "priority": 100},
    {"key": "rejects", "type": "test", "priority": 50, "options": {"fail": "permanent"}},
    {"key": "down", "type": "test", "priority": 10, "options": {"fail": "temporary"}},
    {"key": "unknown", "type": "test", "priority": 5, "options": {"fail": "unknown"}},
]


def valid_message(**overrides: Any) -> dict:
    message = {
        "from": {"name": "Phorge", "address": "noreply@example.com"},
        "to": [{"name": "Alice", "address": "alice@example.com"}],
        "subject": "[Differential] D123: Fix the thing",
        "textBody": "plain text",
    }
    message.update(overrides)
    return message


def parsed_message(**overrides: Any) -> Message:
    """:func:`valid_message` (with ``overrides``) as the API hands it to a backend."""
    return parse_send_request({"message": valid_message(**overrides)}).message


@dataclass
class Harness:
    service: Any
    client: Any
    clock: Any
    #: With the real reactor, responses that finish later need the stub's
    #: in-memory connections pumped while we wait.
    real: bool = False

    async def _pumped(self, d):
        if not self.real:
            return await d
        loop = LoopingCall(self.client.flush)
        loop.clock = self.clock
        loop.start(0.002)
        try:
            return await d.addTimeout(30, self.clock)
        finally:
            loop.stop()

    @property
    def backends(self) -> dict:
        return {b.key: b for b in self.service.part("dispatcher").backends}

    async def post(
        self, path: str, body: Any, *, token: str | None = TOKEN, headers: dict | None = None
    ) -> tuple[int, Any, bytes]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        hdrs = {"Content-Type": ["application/json"]}
        if token:
            hdrs["X-Service-Token"] = [token]
        for k, v in (headers or {}).items():
            hdrs[k] = [v]
        response = await self._pumped(
            self.client.post("http://mailer" + path, data=data, headers=hdrs)
        )
        raw = await self._pumped(response.content())
        return response.code, _json(raw), raw

    async def get(self, path: str, *, token: str | None = TOKEN) -> tuple[int, Any, bytes]:
        hdrs = {"X-Service-Token": [token]} if token else {}
        response = await self._pumped(self.client.get("http://mailer" + path, headers=hdrs))
        raw = await self._pumped(response.content())
        return response.code, _json(raw), raw

    async def send(self, message: dict | None = None, **extra: Any) -> tuple[int, Any]:
        body = {"message": message if message is not None else valid_message(), **extra}
        status, doc, _ = await self.post("/api/mailer/send", body)
        return status, doc


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def make_harness(env: dict[str, str], clock: Any = None) -> Harness:
    real = clock is not None and not isinstance(clock, task.Clock)
    clock = clock if clock is not None else task.Clock()
    settings = load_mailer_settings(env)
    service = build_mailer_service(settings, clock, listen=False)
    return Harness(service, stub_client(service.part("site")), clock, real)


def contract_env(**extra: str) -> dict[str, str]:
    return {
        "GORGE_SERVICE_TOKEN": TOKEN,
        "GORGE_MAILER_MAX_RETRIES": "0",
        "GORGE_MAILER_CONFIG": json.dumps(CONTRACT_MAILERS),
        **extra,
    }


@pytest.fixture
def harness() -> Harness:
    return make_harness(contract_env())


@pytest.fixture
def events():
    """Every log event emitted during the test."""
    with logged_events() as events:
        yield events
