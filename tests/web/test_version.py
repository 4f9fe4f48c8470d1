"""``GET <prefix>version``: served by the shared root, behind the token."""

import importlib.metadata
import json

import pytest_twisted
from prometheus_client import CollectorRegistry
from twisted.internet import task

from gorge.web.site import build_site, stub_client
from gorge.web.version import About, api_version
from tests.web.test_site import LIMIT, TOKEN, ExampleApi, Readiness, call


def make():
    clock = task.Clock()
    clock.advance(1_795_947_000)
    site = build_site(
        api_resource=ExampleApi().app.resource(),
        prefix="/api/example/",
        token=TOKEN,
        body_limit=LIMIT,
        readiness=Readiness(),
        registry=CollectorRegistry(),
        clock=clock,
        about=About.of("gorge-example", "gorge.taskqueue", clock),
    )
    return stub_client(site), clock


@pytest_twisted.ensureDeferred
async def test_the_version_route_answers_release_api_version_and_uptime():
    client, clock = make()
    clock.advance(125)
    response, body = await call(client, "GET", "/api/example/version", {"X-Service-Token": TOKEN})
    assert response.code == 200
    assert json.loads(body) == {
        "data": {
            "service": "gorge-example",
            "version": importlib.metadata.version("gorge"),
            "apiVersion": api_version("gorge.taskqueue"),
            "startedAt": 1_795_947_000,
            "uptimeSeconds": 125,
        }
    }


@pytest_twisted.ensureDeferred
async def test_the_version_route_needs_the_token_and_takes_get_only():
    client, _ = make()
    response, body = await call(client, "GET", "/api/example/version")
    assert response.code == 401
    response, body = await call(
        client, "POST", "/api/example/version", {"X-Service-Token": TOKEN}, b"{}"
    )
    assert response.code == 405
    assert response.headers.getRawHeaders("allow") == ["GET, HEAD"]
    assert json.loads(body)["error"]["code"] == "ERR_METHOD_NOT_ALLOWED"


@pytest_twisted.ensureDeferred
async def test_without_about_the_path_is_the_api_s():
    from tests.web.test_site import make as make_plain

    client, _, _ = make_plain()
    response, _ = await call(client, "GET", "/api/example/version", {"X-Service-Token": TOKEN})
    assert response.code == 404
