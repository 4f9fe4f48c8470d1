"""Building the real site around a store, and a JSON call helper."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.defer import Deferred

from gorge.config import HttpSettings
from gorge.taskqueue.service import build_taskqueue_service
from gorge.taskqueue.settings import TaskQueueSettings
from gorge.web.site import stub_client
from tests.support.stubpump import pumped

TOKEN = "contract-token"


def make_settings(**overrides) -> TaskQueueSettings:
    http = HttpSettings(
        listen_addr="127.0.0.1:0", endpoint="tcp:0:interface=127.0.0.1", token=TOKEN
    )
    values: dict[str, Any] = {"http": http, "backend": "sqlite"}
    values.update(overrides)
    return TaskQueueSettings(**values)


class Client:
    """Requests through gorge.web's real Site (auth, body limit, envelope)."""

    def __init__(self, store, clock, **overrides) -> None:
        self.service = build_taskqueue_service(make_settings(**overrides), clock, store=store)
        self.stub = stub_client(self.service.part("site"))

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict | None = None,
        token: str | None = TOKEN,
    ) -> tuple[int, Any]:
        hdrs = {b"content-type": [b"application/json"]}
        if token is not None:
            hdrs[b"x-service-token"] = [token.encode()]
        for k, v in (headers or {}).items():
            hdrs[k.encode()] = [v.encode()]
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())

        async def exchange():
            response = await self.stub.request(
                method, "http://queue.test" + path, data=data, headers=hdrs
            )
            return response, await response.content()

        # A real backend answers from a pool thread.
        response, content = await pumped(self.stub, Deferred.fromCoroutine(exchange()), bound=30.0)
        self.last_body = content
        self.last_headers = response.headers
        ctype = response.headers.getRawHeaders(b"content-type", [b""])[0]
        if ctype.startswith(b"application/json") and content:
            return response.code, json.loads(content)
        return response.code, content.decode("utf-8")

    async def post(self, path: str, body: Any = None, **kw) -> tuple[int, Any]:
        return await self.call("POST", "/api/queue/" + path, body, **kw)

    async def get(self, path: str, **kw) -> tuple[int, Any]:
        return await self.call("GET", path if path.startswith("/") else "/api/queue/" + path, **kw)
