"""Who delivers Herald webhooks: gorge-webhook or Phorge's PHP.

Phorge queues one ``HeraldWebhookWorker`` task per webhook request row. When
gorge-webhook is deployed it delivers those rows itself, so running the task
in PHP as well would send every webhook twice; when it is not deployed, the
task is the only thing that delivers. The owner is therefore an explicit
setting, never a default (docs/worker.md, "Webhook ownership").
"""

from __future__ import annotations

import json

from gorge.log.logger import Logger

log = Logger()

TASK_CLASS = "HeraldWebhookWorker"
SETTING = "GORGE_WORKER_WEBHOOK_OWNER"
OWNER_GORGE_WEBHOOK = "gorge-webhook"
OWNER_PHORGE = "phorge"
OWNERS = (OWNER_GORGE_WEBHOOK, OWNER_PHORGE)
CHOICES_EXPLAINED = (
    f"{OWNER_GORGE_WEBHOOK} (gorge-webhook delivers webhooks; this worker completes "
    f"{TASK_CLASS} tasks without delivering) or {OWNER_PHORGE} (no gorge-webhook; "
    f"Phorge delivers them when this worker runs the tasks through worker.execute)"
)


def request_phid(data: str | None) -> str:
    """The request row a task points at, for the log; '' when unreadable."""
    try:
        doc = json.loads(data) if data else None
    except (ValueError, RecursionError):
        return ""
    phid = doc.get("webhookRequestPHID") if isinstance(doc, dict) else None
    return phid if isinstance(phid, str) else ""


class LeftToGorgeWebhook:
    """Completes a ``HeraldWebhookWorker`` task without delivering anything.

    The task's data only names the request row, which gorge-webhook owns and
    delivers; whatever the data holds, completing the task is all that is
    left to do, so this handler never fails.
    """

    def __init__(self, metrics=None) -> None:
        self._metrics = metrics

    async def __call__(self, task: dict, data: str | None) -> None:
        log.debug(
            "WORKER_WEBHOOK_TASK_LEFT_TO_GORGE_WEBHOOK "
            "task_id={task_id} request_phid={request_phid}",
            task_id=task["id"],
            request_phid=request_phid(data),
        )
        if self._metrics is not None:
            self._metrics.webhook_tasks_left.inc()
