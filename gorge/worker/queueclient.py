"""HTTP client of gorge-taskqueue: lease, renew, complete, fail, yield.

Every call is one POST (over :class:`~gorge.worker.queuewire.QueueWire`'s
kept-alive connections, or one :func:`gorge.client.exchange.exchange` over an
injected agent): bounded for the whole exchange (headers and body) on the
injected clock, its answer read up to a size cap, never following
redirects; it succeeds only for a 2xx JSON object without an ``error``.
Result reports that finish close together go out as one batched call
(:mod:`gorge.worker.reports`); a lease may ask the queue to hold the call
until a task is there (docs/worker.md, Long-poll).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.web.iweb import IAgent

from gorge.client.exchange import Reply, encode_url, exchange
from gorge.client.failure import Cause, TransportFailure
from gorge.log.logger import Logger
from gorge.worker.queueerror import QueueError
from gorge.worker.queuewire import QueueWire
from gorge.worker.reports import FOLLOWUP_BATCH_BYTES, REPORT_PATH, ReportBatcher

log = Logger()

CALL_TIMEOUT = 30.0
#: Bytes of a lease answer read: a batch of tasks with their data. One more
#: fails the lease call (docs/worker.md, Limits).
LEASE_ANSWER_LIMIT = 64 * 1024 * 1024
#: Bytes of any other answer (renewals and reports answer a few hundred).
ANSWER_LIMIT = 1024 * 1024
OWNER_HOST_BYTES = 32

_encoder = json.JSONEncoder(separators=(",", ":"))


def truncate_host(host: str, limit: int = OWNER_HOST_BYTES) -> str:
    """The host part of the lease owner: at most ``limit`` UTF-8 bytes, cut on
    a character boundary and marked with ``...`` when cut."""
    raw = host.encode("utf-8")
    if len(raw) <= limit:
        return host
    cut = raw[: limit - 3].decode("utf-8", errors="ignore")
    while len(cut.encode("utf-8")) > limit - 3:
        cut = cut[:-1]
    return cut + "..."


def lease_owner(hostname: str | None, pid: int, started: int) -> str:
    host = hostname if hostname is not None else socket.gethostname()
    return f"{truncate_host(host)}:{pid}:{started}:gorge-worker"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_lease_answer(data: Any, limit: int) -> list[dict]:
    """Reject the whole answer unless it is a list of at most ``limit`` tasks,
    each an object with a positive integer ``id`` and a non-empty ``taskClass``."""
    if data is None:
        return []
    if not isinstance(data, list):
        raise QueueError("lease: answer data is not a list", task_ids=[])
    ids = [item.get("id") for item in data if isinstance(item, dict)]
    if len(data) > limit:
        raise QueueError(
            f"lease: answer has {len(data)} tasks, asked for {limit} (ids {ids})", task_ids=ids
        )
    for item in data:
        if not (
            isinstance(item, dict)
            and _is_int(item.get("id"))
            and item["id"] > 0
            and isinstance(item.get("taskClass"), str)
            and item["taskClass"]
        ):
            raise QueueError(f"lease: malformed task in answer (ids {ids})", task_ids=ids)
    return data


@dataclass(frozen=True)
class QueueEndpoint:
    base_url: str
    token: str = ""

    def __repr__(self) -> str:
        return f"QueueEndpoint(base_url={self.base_url!r})"


class QueueClient:
    """Speaks the taskqueue HTTP API with one stable lease owner."""

    def __init__(
        self,
        agent: IAgent,
        clock: IReactorTime,
        endpoint: QueueEndpoint,
        owner: str,
        *,
        timeout: float = CALL_TIMEOUT,
        report_batch: int = 1,
        report_delay: float = 0.0,
        report_bytes: int = FOLLOWUP_BATCH_BYTES,
        wire: QueueWire | None = None,
    ) -> None:
        """``wire``: the kept-alive connections the service uses; without it
        every call goes through ``agent`` (tests hand in fakes of it).
        ``report_bytes``: the follow-ups one batched report carries at most."""
        self._agent = agent
        self._wire = wire
        self._heads: dict[tuple[str, bool], bytes] = {}
        self._clock = clock
        self._endpoint = endpoint
        self.owner = owner
        self._timeout = timeout
        self._reports = ReportBatcher(
            self._post_reports,
            clock,
            max_size=report_batch,
            delay=report_delay,
            max_bytes=report_bytes,
        )
        # Built once: URL parsing and header encoding were a sixth of the
        # worker's time per call.
        self._urls: dict[str, bytes] = {}
        self._base_headers = self._headers()
        self._owner_headers = self._headers({b"X-Lease-Owner": owner.encode()})

    @property
    def batching_reports(self) -> bool:
        return self._reports.enabled

    def _headers(self, extra: dict[bytes, bytes] | None = None) -> dict[bytes, bytes]:
        headers = {
            b"Content-Type": b"application/json",
            b"Accept": b"application/json",
        }
        if self._endpoint.token:
            headers[b"X-Service-Token"] = self._endpoint.token.encode()
        headers.update(extra or {})
        return headers

    async def _call(
        self,
        path: str,
        body: dict,
        *,
        timeout: float | None = None,
        fenced: bool = False,
        answer_limit: int = ANSWER_LIMIT,
    ) -> Any:
        payload = _encoder.encode(body).encode()
        # A held lease call asks for more than the usual timeout (its wait).
        limit = self._timeout if timeout is None else timeout
        try:
            reply = await self._send(path, payload, fenced, limit, answer_limit)
            raw = reply.require_body()
        except TransportFailure as failure:
            if failure.cause is Cause.DEADLINE:
                raise QueueError(f"http: POST {path}: timed out after {limit:g}s") from None
            raise QueueError(f"http: POST {path}: {failure}") from None
        return self._parse(path, reply.status, raw)

    async def _send(
        self, path: str, payload: bytes, fenced: bool, limit: float, answer_limit: int
    ) -> Reply:
        """The POST, over the kept connections or through the agent; both raise
        :class:`~gorge.client.failure.TransportFailure` alike."""
        # ``fenced``: the call names the lease owner (the lease, and every
        # report, so a queue that fences refuses a report from a worker whose
        # lease was taken over: 409).
        headers = self._owner_headers if fenced else self._base_headers
        if self._wire is not None:
            head = self._heads.get((path, fenced))
            if head is None:
                head = self._heads[(path, fenced)] = self._wire.head(path, headers)
            return await self._wire.post(
                head, payload, keep=answer_limit, timeout=limit, clock=self._clock
            )
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = encode_url(self._endpoint.base_url + path)
        return await exchange(
            self._agent,
            self._clock,
            "POST",
            url,
            headers=headers,
            body=payload,
            deadline=self._clock.seconds() + limit,
            body_limit=answer_limit,
        )

    @staticmethod
    def _parse(path: str, status: int, raw: bytes) -> Any:
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            # RecursionError: nesting deeper than the decoder's stack allows.
            doc = None
        if not isinstance(doc, dict):
            raise QueueError(
                f"unmarshal (status {status}): {path} answered no JSON object",
                status=status,
                transient=True,
            )
        error = doc.get("error")
        if error is not None:
            code = message = ""
            if isinstance(error, dict):
                code = str(error.get("code", ""))
                message = str(error.get("message", ""))
            raise QueueError(f"api error [{code}]: {message}", status=status, code=code)
        if not 200 <= status < 300:
            raise QueueError(f"http: POST {path}: unexpected status {status}", status=status)
        return doc.get("data")

    async def lease(
        self, limit: int, task_classes: list[str] | None, wait: float = 0
    ) -> list[dict]:
        """Up to ``limit`` tasks; with ``wait`` > 0 the queue may hold the call
        that many seconds until one is there (an older queue answers at once)."""
        body: dict[str, Any] = {"limit": limit}
        if task_classes:
            body["taskClasses"] = sorted(task_classes)
        if wait > 0:
            body["wait"] = wait
        try:
            data = await self._call(
                "/api/queue/lease",
                body,
                timeout=self._timeout + wait,
                fenced=True,
                answer_limit=LEASE_ANSWER_LIMIT,
            )
        except QueueError as exc:
            raise QueueError(
                f"lease: {exc}", status=exc.status, code=exc.code, transient=exc.transient
            ) from None
        return validate_lease_answer(data, limit)

    async def renew(self, task_ids: list[int], *, timeout: float) -> dict[int, int | None]:
        """Extend our leases on ``task_ids``: each id's new ``leaseExpires``, or
        None when the queue says the lease is lost.  An id the answer does not
        mention is left out (its deadline stays as it was)."""
        data = await self._call(
            "/api/queue/renew",
            {"taskIDs": list(task_ids)},
            timeout=min(timeout, self._timeout),
            fenced=True,
        )
        if not isinstance(data, list):
            raise QueueError(
                "unmarshal (status 200): /api/queue/renew answered no list",
                status=200,
                transient=True,
            )
        out: dict[int, int | None] = {}
        for item in data:
            if not isinstance(item, dict) or not _is_int(item.get("taskID")):
                continue
            expires = item.get("leaseExpires")
            if item.get("status") == "renewed" and _is_int(expires):
                out[item["taskID"]] = expires
            elif item.get("status") == "lost":
                out[item["taskID"]] = None
        return out

    async def _post_reports(self, entries: list[dict], timeout: float) -> Any:
        return await self._call(
            REPORT_PATH,
            {"reports": entries},
            timeout=min(timeout, self._timeout),
            fenced=True,
        )

    def _report(self, path: str, body: dict, outcome: str, timeout: float) -> Deferred:
        async def single(left: float) -> None:
            await self._call(path, body, timeout=min(left, self._timeout), fenced=True)

        return self._reports.submit({**body, "outcome": outcome}, timeout, single)

    async def complete(
        self,
        task_id: int,
        duration_us: int,
        *,
        followups: Sequence[Mapping[str, Any]] = (),
        timeout: float,
    ) -> None:
        """Report a success; ``followups`` are the tasks it queues, each in
        the shape ``/api/queue/enqueue`` takes (docs/taskqueue.md, Follow-up
        tasks), stored by the queue with the archive or not at all."""
        body: dict[str, Any] = {"taskID": task_id, "duration": max(0, int(duration_us))}
        if followups:
            # Only when there are some: a plain complete stays what every
            # queue, older ones included, takes.
            body["followups"] = [dict(followup) for followup in followups]
        await self._report("/api/queue/complete", body, "complete", timeout)

    async def fail(
        self,
        task_id: int,
        permanent: bool,
        *,
        retry_wait: int | None = None,
        message: str = "",
        timeout: float,
    ) -> None:
        body: dict[str, Any] = {"taskID": task_id, "permanent": permanent}
        if retry_wait is not None:
            body["retryWait"] = max(0, int(retry_wait))
        if message:
            body["message"] = message[:1000]
        await self._report("/api/queue/fail", body, "fail", timeout)

    async def yield_task(self, task_id: int, seconds: int, *, timeout: float) -> None:
        await self._report(
            "/api/queue/yield",
            {"taskID": task_id, "duration": max(5, int(seconds))},
            "yield",
            timeout,
        )
