"""Client of Phorge's ``worker.execute`` on Phorge's Conduit API (gorge's Phorge library).

The body is a form with exactly ``params`` (JSON text) and ``output=json``:
Phorge rejects a JSON request body and answers errors with HTTP 200, so the
HTTP status never decides success; the envelope does.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlencode

from twisted.internet.defer import CancelledError, DeferredSemaphore
from twisted.internet.interfaces import IReactorTime

from gorge.httpclient import Cause, TransportFailure, exchange
from gorge.logger import Logger

log = Logger()

PROBE_TIMEOUT = 10.0
#: worker.execute calls at once unless told otherwise: each holds one PHP
#: request of Phorge's web server (docs/worker.md, Delegation to PHP).
DEFAULT_CONCURRENCY = 4
#: Bytes of a worker.execute answer read (a small JSON envelope); one more
#: makes the call fail temporarily (docs/worker.md, Limits).
ANSWER_LIMIT = 1024 * 1024
SNIPPET_CHARS = 200
PROBE_PASS_CODE = "ERR-NO-TASK-CLASS"
_LINE_BREAKS = re.compile(r"\r\n|\n|\r")


class ConduitError(Exception):
    """worker.execute did not give a usable answer (always temporary)."""


def snippet(raw: bytes, limit: int = SNIPPET_CHARS) -> str:
    """A log-safe, single-line, bounded view of a response body."""
    text = _LINE_BREAKS.sub(" ", raw.decode("utf-8", errors="replace").strip())
    if len(text) > limit:
        return text[:limit] + "\u2026"
    return text


def build_execute_body(token: str, task_id: int | None, task_class: str, data: str | None) -> bytes:
    params: dict[str, Any] = {}
    if task_id is not None:
        params["taskID"] = task_id
    params["taskClass"] = task_class
    if task_id is not None:
        params["data"] = data or ""
    params["__conduit__"] = {"token": token} if token else {}
    return urlencode(
        [
            ("params", json.dumps(params, separators=(",", ":"), ensure_ascii=False)),
            ("output", "json"),
        ]
    ).encode("ascii")


def parse_conduit_answer(status: int, raw: bytes) -> Any:
    """Return ``result`` of a Conduit envelope or raise ConduitError."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        # A nesting too deep for the decoder is just as unusable as a syntax
        # error, and must not escape as a crash of the probe or the task.
        doc = None
    if not isinstance(doc, dict):
        raise ConduitError(
            f"conduit worker.execute returned non-JSON (HTTP {status}): {snippet(raw)}"
        )
    code = doc.get("error_code")
    if isinstance(code, str):
        info = doc.get("error_info")
        raise ConduitError(f"conduit error [{code}]: {info if isinstance(info, str) else ''}")
    return doc.get("result")


class ConduitClient:
    def __init__(
        self,
        http_client: Any,
        clock: IReactorTime,
        base_url: str,
        token: str,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
    ):
        self._http = http_client
        self._clock = clock
        self._url = base_url + "/api/worker.execute"
        self._token = token
        # The worker's slots are cheap; Phorge's PHP requests are not. A task
        # waiting here holds its slot, and a cancel (its lease deadline) takes
        # it out of the line.
        self._running = DeferredSemaphore(concurrency)

    def _headers(self) -> dict[bytes, bytes]:
        headers = {
            b"Content-Type": b"application/x-www-form-urlencoded",
            b"Accept": b"application/json",
        }
        if self._token:
            headers[b"X-Service-Token"] = self._token.encode()
        return headers

    async def _post(self, body: bytes, deadline: float | None) -> tuple[int, bytes]:
        reply = await exchange(
            self._http,
            self._clock,
            "POST",
            self._url,
            headers=self._headers(),
            body=body,
            deadline=deadline,
            body_limit=ANSWER_LIMIT,
        )
        return reply.status, reply.require_body()

    async def execute(self, task_id: int, task_class: str, data: str | None) -> Any:
        """One worker.execute call.

        Deliberately no deadline of its own: a delegated task may run as long
        as its lease, and the consumer cancels this call at the lease deadline.
        """
        body = build_execute_body(self._token, task_id, task_class, data)
        await self._running.acquire()
        try:
            status, raw = await self._post(body, None)
        except CancelledError:
            raise
        except TransportFailure as failure:
            raise ConduitError(f"http: {failure}") from None
        finally:
            self._running.release()
        return parse_conduit_answer(status, raw)

    async def probe(self, timeout: float = PROBE_TIMEOUT) -> str | None:
        """None when worker.execute is reachable and answers as the r4 method
        does for an empty class; otherwise the reason."""
        body = build_execute_body(self._token, None, "", None)
        try:
            status, raw = await self._post(body, self._clock.seconds() + timeout)
        except TransportFailure as failure:
            if failure.cause in (Cause.DEADLINE, Cause.CANCELLED):
                return f"probe timed out after {timeout:g}s"
            return f"http: {failure}"
        try:
            parse_conduit_answer(status, raw)
        except ConduitError as exc:
            if str(exc).startswith(f"conduit error [{PROBE_PASS_CODE}]"):
                return None
            return str(exc)
        return "conduit worker.execute ran a task without a class"
