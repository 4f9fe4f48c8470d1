"""Client of Phorge's ``worker.execute`` on Phorge's Conduit API (gorge's Phorge library).

The body is a form with exactly ``params`` (JSON text) and ``output=json``:
Phorge rejects a JSON request body and answers errors with HTTP 200, so the
HTTP status never decides success; the envelope does.

A call that never reached PHP (nothing answered, or a proxy in front of PHP
answered 502, 503 or 504) raises :class:`ConduitNotReached`: the task did
nothing, and gorge-worker hands it back without counting a failure
(docs/worker.md, When Phorge's web server is down).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from twisted.internet.defer import CancelledError, DeferredSemaphore
from twisted.internet.interfaces import IReactorTime

from gorge.client.exchange import Reply, exchange
from gorge.client.failure import Cause, TransportFailure
from gorge.log.logger import Logger

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


#: How an exchange can end before any answer byte and still show that PHP
#: never saw the request: no connection, or one that closed before it
#: answered anything (a web server going down, or a kept-alive connection
#: it had already dropped). A deadline or a cancel is not among them: PHP may
#: be running the task meanwhile.
UNREACHED_CAUSES = frozenset(
    {
        Cause.DNS,
        Cause.REFUSED,
        Cause.CONNECT,
        Cause.TIMED_OUT,
        Cause.NOT_SENT,
        Cause.SEND_FAILED,
        Cause.EMPTY_REPLY,
        Cause.RESET,
    }
)
#: What a proxy in front of PHP (a load balancer, php-fpm's web server)
#: answers when PHP did not take the request. A 500 is PHP's own.
PROXY_STATUSES = frozenset({502, 503, 504})


class ConduitError(Exception):
    """worker.execute did not give a usable answer (always temporary)."""


class ConduitNotReached(ConduitError):
    """The call never reached PHP: the task has not run."""


def never_reached(failure: TransportFailure) -> bool:
    """Whether a failure before the status line shows that PHP never saw
    the request (:data:`UNREACHED_CAUSES`, or TLS failing before the request
    was handed over)."""
    if failure.cause in UNREACHED_CAUSES:
        return True
    return failure.cause.tls and not failure.submitted


def _unreached_reply(reply: Reply) -> str | None:
    """Why ``reply`` is a proxy's, not PHP's: None when PHP answered."""
    if reply.status not in PROXY_STATUSES:
        return None
    shown = snippet(reply.body) if reply.body else ""
    return f"HTTP {reply.status} from a proxy in front of PHP" + (f": {shown}" if shown else "")


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
    # The follow-ups come back in the answer, for the queue to enqueue with
    # the archive. Sent with the probe too, so that a library too old to
    # know it fails the probe, not every task.
    params["returnFollowups"] = True
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

    async def _post(self, body: bytes, deadline: float | None) -> Reply:
        """The answer's status line and body; :class:`TransportFailure` when
        no status line came (a failure reading the body stays in the reply:
        the answer had started)."""
        return await exchange(
            self._http,
            self._clock,
            "POST",
            self._url,
            headers=self._headers(),
            body=body,
            deadline=deadline,
            body_limit=ANSWER_LIMIT,
        )

    async def execute(self, task_id: int, task_class: str, data: str | None) -> Any:
        """One worker.execute call.

        Deliberately no deadline of its own: a delegated task may run as long
        as its lease, and the consumer cancels this call at the lease deadline
        (a cancel stays a cancel, never "not reached").
        """
        body = build_execute_body(self._token, task_id, task_class, data)
        await self._running.acquire()
        try:
            reply = await self._post(body, None)
        except CancelledError:
            raise
        except TransportFailure as failure:
            kind = ConduitNotReached if never_reached(failure) else ConduitError
            raise kind(f"http: {failure}") from None
        finally:
            self._running.release()
        unreached = _unreached_reply(reply)
        if unreached is not None:
            raise ConduitNotReached(unreached)
        try:
            raw = reply.require_body()
        except CancelledError:
            raise  # the lease deadline, while PHP was answering
        except TransportFailure as failure:
            raise ConduitError(f"http: {failure}") from None
        return parse_conduit_answer(reply.status, raw)

    async def probe(self, timeout: float = PROBE_TIMEOUT) -> str | None:
        """None when worker.execute is reachable and answers as the r4 method
        does for an empty class; otherwise the reason."""
        return (await self.check(timeout)).reason

    async def check(self, timeout: float = PROBE_TIMEOUT) -> ProbeResult:
        """:meth:`probe`, also saying whether the probe reached PHP."""
        body = build_execute_body(self._token, None, "", None)
        try:
            reply = await self._post(body, self._clock.seconds() + timeout)
        except TransportFailure as failure:
            if failure.cause in (Cause.DEADLINE, Cause.CANCELLED):
                return ProbeResult(f"probe timed out after {timeout:g}s")
            return ProbeResult(f"http: {failure}", reached=not never_reached(failure))
        unreached = _unreached_reply(reply)
        if unreached is not None:
            return ProbeResult(unreached, reached=False)
        try:
            parse_conduit_answer(reply.status, reply.require_body())
        except TransportFailure as failure:
            return ProbeResult(f"http: {failure}")
        except ConduitError as exc:
            if str(exc).startswith(f"conduit error [{PROBE_PASS_CODE}]"):
                return ProbeResult(None)
            return ProbeResult(str(exc))
        return ProbeResult("conduit worker.execute ran a task without a class")


@dataclass(frozen=True)
class ProbeResult:
    """One probe: ``reason`` is None when it passed; ``reached`` is False
    when it never reached PHP (so it left no row in Phorge's call log)."""

    reason: str | None
    reached: bool = True


class DelegationPause:
    """Whether delegated task classes wait, and why (docs/worker.md, When
    Phorge's web server is down).

    Paused from the first sign that worker.execute cannot be reached (a
    failed probe, or a task's call that never reached PHP) until a probe
    passes again. While paused the consumer leases only the classes
    ``delegated`` says run natively, and hands back a delegated task the
    queue gives it anyway. One log line when it pauses, one when it resumes.
    """

    def __init__(self, clock: IReactorTime, delegated: Callable[[str], bool]) -> None:
        self._clock = clock
        self._delegated = delegated
        self.reason: str | None = None
        self._since = 0.0
        # The probe's quick retry: a call that never reached PHP asks it to
        # look again soon instead of at its next period.
        self._recheck: Callable[[], None] | None = None

    @property
    def paused(self) -> bool:
        return self.reason is not None

    def delegated(self, task_class: str) -> bool:
        return self._delegated(task_class)

    def recheck_with(self, recheck: Callable[[], None]) -> None:
        self._recheck = recheck

    def probed(self, reason: str | None) -> None:
        """A probe ended: ``reason`` None resumes, anything else pauses."""
        if reason is None:
            self._resume()
        else:
            self._pause(reason)

    def not_reached(self, reason: str) -> None:
        """A delegated call never reached PHP: pause now and have the probe
        tell when Phorge's web server is back."""
        self._pause(reason)
        if self._recheck is not None:
            self._recheck()

    def readiness_reason(self) -> str | None:
        if self.reason is None:
            return None
        return f"conduit: {self.reason}; delegated classes paused"

    def _pause(self, reason: str) -> None:
        if self.reason is None:
            self._since = self._clock.seconds()
            log.warn("WORKER_DELEGATION_PAUSED reason={reason}", reason=reason)
        # The latest reason is the one /readyz shows; a new reason is not a
        # new state (the probe logs its own changes).
        self.reason = reason

    def _resume(self) -> None:
        if self.reason is None:
            return
        log.info(
            "WORKER_DELEGATION_RESUMED paused_sec={paused_sec}",
            paused_sec=round(self._clock.seconds() - self._since, 3),
        )
        self.reason = None
