"""The delivery log: requests as the API shows them, replays, hooks with their
breaker and backlog (docs/webhook.md, "Delivery log and replay").

This module says what the answers mean; gorge/webhook/api.py reads and checks
the HTTP side, gorge/webhook/history.py runs the statements.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gorge.log.logger import Logger
from gorge.webhook import payload
from gorge.webhook.history import NotReplayable, Replay, RequestRow
from gorge.webhook.metrics import WebhookMetrics
from gorge.webhook.store import WebhookStore

log = Logger()

__all__ = ["DeliveryLog", "NotReplayable", "describe"]


def _error_type(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


def _error_code(value: Any) -> int | str | None:
    # Phorge stores HTTP and cURL codes as integers, our own codes as strings.
    if (
        value is None
        or isinstance(value, str)
        or (isinstance(value, int) and not isinstance(value, bool))
    ):
        return value
    return json.dumps(value, separators=(",", ":"))


def describe(
    row: RequestRow, *, detail: bool = False, held_until: int | None = None
) -> dict[str, Any]:
    """One request as the API answers it; ``detail`` adds what ``show`` shows."""
    try:
        parsed = payload.parse_properties(row.properties)
        props: payload.Properties | None = parsed
        document = parsed.document
    except payload.InvalidProperties as e:
        props, document = None, e.document or {}
    item: dict[str, Any] = {
        "id": row.id,
        "phid": row.phid,
        "hookPHID": row.hook_phid,
        "objectPHID": row.object_phid,
        "status": row.status,
        "lastRequestResult": row.last_result,
        "lastRequestEpoch": row.last_epoch,
        "errorType": _error_type(document.get("errorType")),
        "errorCode": _error_code(document.get("errorCode")),
        "retry": "forever" if document.get("retry") == "forever" else "never",
        "dateCreated": row.date_created,
        "dateModified": row.date_modified,
    }
    if detail:
        item.update(
            {
                "propertiesValid": props is not None,
                "test": props.test if props else None,
                "silent": props.silent if props else None,
                "secure": props.secure if props else None,
                "triggerPHIDs": list(props.triggers) if props else None,
                # In the order the body lists them.
                "transactionPHIDs": payload.newest_first(props.transactions) if props else None,
                "heldUntil": held_until,
            }
        )
    return item


class DeliveryLog:
    def __init__(
        self,
        store: WebhookStore,
        metrics: WebhookMetrics,
        *,
        breaker_threshold: int,
        breaker_window: int,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._threshold = breaker_threshold
        self._window = breaker_window

    async def list(
        self,
        *,
        limit: int,
        cursor: int | None,
        hook: str | None,
        status: str | None,
        result: str | None,
        since: int | None,
    ) -> dict:
        page = await self._store.history.list_requests(
            limit=limit, cursor=cursor, hook=hook, status=status, result=result, since=since
        )
        return {"requests": [describe(row) for row in page.rows], "nextCursor": page.next_cursor}

    async def show(self, request: int | str) -> dict | None:
        row = await self._store.history.request(request)
        if row is None:
            return None
        return describe(row, detail=True, held_until=self._store.claims.held_until(row.id))

    async def replay(self, request: int | str) -> dict | None:
        """The request after it was put back in the queue; None when it does not
        exist. Raises NotReplayable when it is queued."""
        replay = await self._store.history.replay(request)
        if replay is None:
            return None
        self._replayed(replay)
        return describe(replay.after, detail=True)

    async def replay_range(
        self,
        *,
        hook: str,
        since: int,
        until: int,
        statuses: Sequence[str],
        after_id: int,
        limit: int,
    ) -> dict:
        done = await self._store.history.replay_range(
            hook=hook, since=since, until=until, statuses=statuses, after_id=after_id, limit=limit
        )
        for replay in done.replayed:
            self._replayed(replay)
        return {
            "retried": [
                {"id": r.after.id, "phid": r.after.phid, "previousStatus": r.before.status}
                for r in done.replayed
            ],
            "skipped": [{"id": row.id, "phid": row.phid} for row in done.skipped],
            "nextAfterId": done.next_after_id,
        }

    async def hooks(self) -> dict:
        states = await self._store.observation.hook_states(self._window)
        return {
            "threshold": self._threshold,
            "window": self._window,
            "hooks": [
                {
                    "phid": state.phid,
                    "name": state.name,
                    "status": state.status,
                    "breaker": "open" if state.failures >= self._threshold else "closed",
                    "failures": state.failures,
                    "queued": state.queued,
                    "oldestQueuedSeconds": state.oldest_queued,
                }
                for state in states
            ],
        }

    def _replayed(self, replay: Replay) -> None:
        """The row's history leaves it here: the log line keeps the outcome it had."""
        before = describe(replay.before)
        self._metrics.replays.labels(previous=replay.before.status).inc()
        log.info(
            "WEBHOOK_REQUEST_REPLAYED request={request} hook={hook}"
            " previous_status={previous_status} previous_result={previous_result}"
            " error_type={error_type} error_code={error_code} attempted_at={attempted_at}",
            request=replay.after.phid,
            hook=replay.after.hook_phid,
            previous_status=replay.before.status,
            previous_result=replay.before.last_result,
            error_type=before["errorType"],
            error_code=before["errorCode"],
            attempted_at=replay.before.last_epoch,
        )
