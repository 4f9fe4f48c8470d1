"""The queue's POST routes taken in front of Klein answer exactly as Klein's routing would."""

from __future__ import annotations

import pytest
import pytest_twisted

from tests.support.logcapture import logged_events
from tests.taskqueue.helpers import Client

POST_ROUTES = ("enqueue", "lease", "complete", "fail", "yield", "cancel", "awaken")


@pytest.fixture
def client(memory_store, clock) -> Client:
    return Client(memory_store, clock)


@pytest.fixture
def events():
    with logged_events() as seen:
        yield seen


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("route", POST_ROUTES)
async def test_other_spellings_and_methods_still_meet_klein(client, route):
    not_found = {"error": {"code": "ERR_NOT_FOUND", "message": "Not Found"}}
    not_allowed = {"error": {"code": "ERR_METHOD_NOT_ALLOWED", "message": "Method Not Allowed"}}
    assert await client.call("GET", "/api/queue/" + route) == (405, not_allowed)
    assert client.last_headers.getRawHeaders(b"allow") == [b"POST"]
    assert await client.call("PUT", "/api/queue/" + route, {}) == (405, not_allowed)
    assert await client.post(route + "/x", {}) == (404, not_found)
    # A direct route answers the same envelope, with its request id.
    code, answer = await client.post(route, raw=b"[]", headers={"X-Request-Id": "r-" + route})
    assert (code, answer) == (
        400,
        {"error": {"code": "ERR_BAD_REQUEST", "message": "request body must be a JSON object"}},
    )
    assert client.last_headers.getRawHeaders(b"x-request-id") == [b"r-" + route.encode()]


@pytest_twisted.ensureDeferred
async def test_unauthenticated_direct_route_is_401(client):
    code, answer = await client.post("enqueue", {"taskClass": "X"}, token=None)
    assert (code, answer["error"]["code"]) == (401, "ERR_UNAUTHORIZED")


@pytest_twisted.ensureDeferred
async def test_crash_in_a_direct_route_is_the_opaque_500_with_panic_log(
    client, memory_store, events
):
    def broken(*args):
        raise RuntimeError("boom")

    client.service.part("api")._owner = broken  # outside _call: an unexpected crash
    code, answer = await client.post("lease", {"limit": 1})
    assert (code, answer) == (
        500,
        {"error": {"code": "ERR_INTERNAL", "message": "internal server error"}},
    )
    names = [str(e.get("log_format", "")).split(" ")[0] for e in events]
    assert "PANIC_RECOVERED" in names
    [failed] = [e for e in events if str(e.get("log_format", "")).startswith("REQUEST_FAILED")]
    assert failed["error"] == "boom"
