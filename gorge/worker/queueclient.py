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
from gorge.client.failure import Cause, TransportFailure, tls_detail
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
#: The host part of the lease owner, so that the name, a lease call's
#: sequence number and the rest fit the column's 64 characters.
OWNER_HOST_BYTES = 24
#: Lease calls are numbered modulo this (7 digits): a number comes round again
#: only millions of lease calls later, long after that lease ended.
OWNER_SEQUENCE_MODULO = 10_000_000

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
    """The worker's name; each lease call adds its own sequence number to it
    (:meth:`QueueClient.next_owner`), within the column's 64 characters."""
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
    #: What an https queue's certificate is checked against, for the error
    #: that says it was not accepted.
    trust: str = "the system's CAs"

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
        lease_seconds: int | None = None,
    ) -> None:
        """``wire``: the kept-alive connections the service uses; without it
        every call goes through ``agent`` (tests hand in fakes of it).
        ``report_bytes``: the follow-ups one batched report carries at most."""
        self._agent = agent
        self._wire = wire
        self._heads: dict[str, bytes] = {}
        self._clock = clock
        self._endpoint = endpoint
        self.owner = owner
        # A short lease the heartbeat renews (None: the queue's own).
        self._lease_seconds = lease_seconds
        self._sequence = 0
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
        owner: str | None = None,
        answer_limit: int = ANSWER_LIMIT,
    ) -> Any:
        payload = _encoder.encode(body).encode()
        # A held lease call asks for more than the usual timeout (its wait).
        limit = self._timeout if timeout is None else timeout
        try:
            reply = await self._send(path, payload, owner, limit, answer_limit)
            raw = reply.require_body()
        except TransportFailure as failure:
            if failure.cause is Cause.DEADLINE:
                raise QueueError(f"http: POST {path}: timed out after {limit:g}s") from None
            if failure.cause.tls:
                raise QueueError(self._tls_refusal(path, failure)) from None
            raise QueueError(f"http: POST {path}: {failure}") from None
        return self._parse(path, reply.status, raw)

    async def _send(
        self, path: str, payload: bytes, owner: str | None, limit: float, answer_limit: int
    ) -> Reply:
        """The POST, over the kept connections or through the agent; both raise
        :class:`~gorge.client.failure.TransportFailure` alike."""
        # ``owner``: the lease call's own owner, as the header every queue
        # reads (reports and renewals name theirs in the body).
        if owner is None:
            headers = self._base_headers
        else:
            headers = self._headers({b"X-Lease-Owner": owner.encode()})
        if self._wire is not None:
            cached = self._heads.get(path) if owner is None else None
            if cached is not None:
                head = cached
            else:
                head = self._wire.head(path, headers)
                if owner is None:
                    self._heads[path] = head
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

    def _tls_refusal(self, path: str, failure: TransportFailure) -> str:
        """The queue's TLS refused, with the host, TLS's own words and what
        the certificate was checked against: the setting to look at."""
        detail = tls_detail(failure)
        return (
            f"http: POST {path}: {failure} from {self._endpoint.base_url}"
            f"{': ' + detail if detail else ''} (trusted: {self._endpoint.trust})"
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

    def next_owner(self) -> str:
        """A lease owner of its own for the next lease call: a task freed and
        leased again by this worker is then a lease the old one's renewals
        and reports cannot touch (Phorge's lease query does the same)."""
        self._sequence = self._sequence % OWNER_SEQUENCE_MODULO + 1
        return f"{self.owner}:{self._sequence}"

    async def lease(
        self, limit: int, task_classes: list[str] | None, wait: float = 0
    ) -> list[dict]:
        """Up to ``limit`` tasks; with ``wait`` > 0 the queue may hold the call
        that many seconds until one is there (an older queue answers at once).
        Each task carries ``leaseOwner``, the owner this call leased it as,
        which its renewals and report name."""
        owner = self.next_owner()
        body: dict[str, Any] = {"limit": limit}
        if self._lease_seconds is not None:
            body["leaseDuration"] = self._lease_seconds
        if task_classes:
            body["taskClasses"] = sorted(task_classes)
        if wait > 0:
            body["wait"] = wait
        try:
            data = await self._call(
                "/api/queue/lease",
                body,
                timeout=self._timeout + wait,
                owner=owner,
                answer_limit=LEASE_ANSWER_LIMIT,
            )
        except QueueError as exc:
            raise QueueError(
                f"lease: {exc}", status=exc.status, code=exc.code, transient=exc.transient
            ) from None
        tasks = validate_lease_answer(data, limit)
        for task in tasks:
            task["leaseOwner"] = owner
        return tasks

    async def renew(
        self, leases: Sequence[tuple[int, str]], duration: int, *, timeout: float
    ) -> dict[int, int | None]:
        """Extend the leases ``(task id, lease owner)`` by ``duration`` seconds,
        all in one call: each id's seconds left (``leaseSeconds``, from the
        queue's now; a queue that sends only ``leaseExpires`` is taken to have
        granted ``duration``), or None when the queue says the lease is lost.
        An id the answer does not mention is left out."""
        data = await self._call(
            "/api/queue/renew",
            {
                "leases": [{"taskID": task_id, "leaseOwner": owner} for task_id, owner in leases],
                "duration": duration,
            },
            timeout=min(timeout, self._timeout),
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
            seconds = item.get("leaseSeconds")
            if item.get("status") == "renewed":
                out[item["taskID"]] = seconds if _is_int(seconds) else duration
            elif item.get("status") == "lost":
                out[item["taskID"]] = None
        return out

    async def _post_reports(self, entries: list[dict], timeout: float) -> Any:
        return await self._call(
            REPORT_PATH,
            {"reports": entries},
            timeout=min(timeout, self._timeout),
        )

    def _report(
        self, path: str, body: dict, outcome: str, timeout: float, owner: str | None
    ) -> Deferred:
        """Fenced by the lease's own owner (each entry of a batch names its
        own), or by the worker's name for a task leased without one."""
        body = {**body, "leaseOwner": owner or self.owner}

        async def single(left: float) -> None:
            await self._call(path, body, timeout=min(left, self._timeout))

        return self._reports.submit({**body, "outcome": outcome}, timeout, single)

    async def complete(
        self,
        task_id: int,
        duration_us: int,
        *,
        followups: Sequence[Mapping[str, Any]] = (),
        timeout: float,
        owner: str | None = None,
    ) -> None:
        """Report a success; ``followups`` are the tasks it queues, each in
        the shape ``/api/queue/enqueue`` takes (docs/taskqueue.md, Follow-up
        tasks), stored by the queue with the archive or not at all."""
        body: dict[str, Any] = {"taskID": task_id, "duration": max(0, int(duration_us))}
        if followups:
            # Only when there are some: a plain complete stays what every
            # queue, older ones included, takes.
            body["followups"] = [dict(followup) for followup in followups]
        await self._report("/api/queue/complete", body, "complete", timeout, owner)

    async def fail(
        self,
        task_id: int,
        permanent: bool,
        *,
        retry_wait: int | None = None,
        message: str = "",
        timeout: float,
        owner: str | None = None,
    ) -> None:
        body: dict[str, Any] = {"taskID": task_id, "permanent": permanent}
        if retry_wait is not None:
            body["retryWait"] = max(0, int(retry_wait))
        if message:
            body["message"] = message[:1000]
        await self._report("/api/queue/fail", body, "fail", timeout, owner)

    async def yield_task(
        self, task_id: int, seconds: int, *, timeout: float, owner: str | None = None
    ) -> None:
        await self._report(
            "/api/queue/yield",
            {"taskID": task_id, "duration": max(5, int(seconds))},
            "yield",
            timeout,
            owner,
        )
