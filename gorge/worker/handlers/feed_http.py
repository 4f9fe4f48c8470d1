"""Native FeedPublisherHTTPWorker.

Sends what Phorge sends: a form built like PHP's ``http_build_query`` from the
story fields, in PHP's order, or a snapshot body that PHP precomputed. A task
that only names the story key needs PHP to load the story, so it is delegated
(or retried) and never sent from here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeGuard
from urllib.parse import quote_plus

from twisted.internet.defer import CancelledError
from twisted.internet.interfaces import IReactorTime

from gorge.client.exchange import exchange
from gorge.client.failure import Cause, TransportFailure
from gorge.log.logger import Logger
from gorge.log.redaction import redact_uri
from gorge.worker.outcome import PermanentFailure, RetryLater

log = Logger()

TASK_CLASS = "FeedPublisherHTTPWorker"
DELIVERY_TIMEOUT = 30.0
STORY_FIELDS = ("storyID", "storyType", "storyData", "storyAuthorPHID", "storyText", "epoch")
RETRY_STEP = 60


def php_urlencode(text: str) -> str:
    """PHP ``urlencode``: space as ``+``, only ``A-Za-z0-9_.-`` left bare."""
    return quote_plus(text, safe="").replace("~", "%7E")


def _scalar(value: Any) -> str:
    if value is True:
        return "1"
    if value is False:
        return "0"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return repr(value)
    return str(value)


def _pairs(name: str, value: Any):
    if value is None:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _pairs(f"{name}[{key}]", item)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _pairs(f"{name}[{index}]", item)
    else:
        yield name, _scalar(value)


def http_build_query(fields: list[tuple[str, Any]]) -> bytes:
    """PHP's ``http_build_query`` with ``&``: nested maps/lists flattened with
    brackets, null members and empty containers dropped."""
    parts = [
        f"{php_urlencode(name)}={php_urlencode(text)}"
        for top, value in fields
        for name, text in _pairs(top, value)
    ]
    return "&".join(parts).encode("ascii")


def _is_int(value: Any) -> TypeGuard[int]:
    # JSON true decodes to a bool, which Python would compare equal to 1.
    return isinstance(value, int) and not isinstance(value, bool)


def _non_empty_str(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and value != ""


def _retry_wait(task: dict) -> int:
    count = task.get("failureCount")
    count = count if _is_int(count) else 0
    return RETRY_STEP * (count + 1)


def read_policy(path: str) -> tuple[bool, list[str]]:
    """Read the feed policy file; any defect is a temporary failure."""
    try:
        with open(path, "rb") as handle:
            doc = json.loads(handle.read())
    except (OSError, ValueError) as exc:
        raise RetryLater(f"feed policy file unusable: {type(exc).__name__}") from None
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("silent"), bool)
        or not (isinstance(doc.get("uris"), list) and all(isinstance(u, str) for u in doc["uris"]))
    ):
        raise RetryLater("feed policy file unusable: needs boolean silent and list uris")
    return doc["silent"], doc["uris"]


class FeedPolicy:
    """The feed policy file as last read: when the worker starts, and again
    on :meth:`reload` (SIGHUP), never per task on the reactor thread.

    A file that was unusable when last read makes every delivery a temporary
    failure, as it would be had the file been read for that delivery.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._policy: tuple[bool, frozenset[str]] | None = None
        self._problem = ""
        self.reload()

    def reload(self) -> None:
        try:
            silent, uris = read_policy(self.path)
        except RetryLater as problem:
            self._policy, self._problem = None, str(problem)
            log.warn(
                "WORKER_FEED_POLICY_UNUSABLE path={path} reason={reason}",
                path=self.path,
                reason=self._problem,
            )
            return
        self._policy, self._problem = (silent, frozenset(uris)), ""
        log.info(
            "WORKER_FEED_POLICY_LOADED path={path} silent={silent} uris={uris}",
            path=self.path,
            silent=silent,
            uris=len(uris),
        )

    def current(self) -> tuple[bool, frozenset[str]]:
        """``(silent, uris)``; raises :class:`RetryLater` while the file is unusable."""
        if self._policy is None:
            raise RetryLater(self._problem)
        return self._policy


class FeedHttpHandler:
    def __init__(
        self,
        http_client: Any,
        clock: IReactorTime,
        *,
        delegate: Callable | None = None,
        policy: FeedPolicy | None = None,
        timeout: float = DELIVERY_TIMEOUT,
    ) -> None:
        self._http = http_client
        self._clock = clock
        self._delegate = delegate
        self._policy = policy
        self._timeout = timeout

    async def __call__(self, task: dict, data: str | None):
        try:
            doc = json.loads(data) if data else None
        except (ValueError, RecursionError):
            # Too deep to decode is as undeliverable as bad syntax; a
            # temporary failure would be retried for ever.
            doc = None
        if not isinstance(doc, dict):
            raise PermanentFailure("invalid task data: not a JSON object")
        uri = doc.get("uri")
        story_id = doc.get("storyID")
        version = doc.get("deliveryVersion")
        if (
            not isinstance(version, bool)
            and version == 1
            and _non_empty_str(uri)
            and _non_empty_str(doc.get("body"))
        ):
            body = doc["body"].encode("utf-8")
        elif _is_int(story_id) and story_id > 0 and _non_empty_str(uri):
            body = http_build_query([(name, doc[name]) for name in STORY_FIELDS if name in doc])
        elif "key" in doc and "storyID" not in doc and "deliveryVersion" not in doc:
            if self._delegate is not None:
                return await self._delegate(task, data)
            raise RetryLater(
                "legacy feed task needs GORGE_WORKER_CONDUIT_URL", retry_wait=_retry_wait(task)
            )
        else:
            raise PermanentFailure("invalid task data: not a deliverable feed task")
        if self._policy is not None:
            silent, uris = self._policy.current()
            if silent:
                return None
            if uri not in uris:
                raise PermanentFailure("feed hook is no longer configured")
        await self._deliver(task, uri, body)
        return None

    async def _deliver(self, task: dict, uri: str, body: bytes) -> None:
        shown = redact_uri(uri)
        try:
            # The answer's body says nothing Phorge looks at: it is read to its
            # end (for the connection's sake) and dropped.
            reply = await exchange(
                self._http,
                self._clock,
                "POST",
                uri,
                headers={
                    b"Content-Type": b"application/x-www-form-urlencoded",
                    b"Accept": b"*/*",
                    b"Accept-Encoding": b"gzip",  # as Phorge's cURL asks
                },
                body=body,
                deadline=self._clock.seconds() + self._timeout,
                keep_body=False,
            )
            reply.require_body()
        except CancelledError:
            raise  # the consumer gave up on this task (lease deadline, shutdown)
        except TransportFailure as failure:
            if failure.cause is Cause.DEADLINE:
                raise RetryLater(
                    f"http request to {shown} failed: timed out after {self._timeout:g}s",
                    retry_wait=_retry_wait(task),
                ) from None
            raise RetryLater(
                f"http request to {shown} failed: {failure}",
                retry_wait=_retry_wait(task),
            ) from None
        if not 200 <= reply.status < 300:
            raise RetryLater(
                f"feed HTTP hook {shown} returned status {reply.status}",
                retry_wait=_retry_wait(task),
            )
