"""A Herald webhook on a switched-over Phorge: the publish task (run in PHP via
``worker.execute``) creates the request, gorge-webhook delivers it, and
gorge-worker completes its ``HeraldWebhookWorker`` task without delivering
(``GORGE_WORKER_WEBHOOK_OWNER=gorge-webhook``)."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

pytestmark = [
    pytest.mark.phorge,
    pytest.mark.integration,
    pytest.mark.slow,
    # Delivery does not depend on where PHP tasks run; once is enough.
    pytest.mark.parametrize("switched", ["conduit"], indirect=True),
]

SUCCESS = 0


async def test_a_new_task_calls_the_herald_webhook_exactly_once(switched):
    hook = await switched.site.helper(
        "webhook",
        author="gorge-worker",
        name="new tasks to the receiver",
        uri=switched.receiver.base + "/hook",
    )
    marker = switched.task_marker()

    task = await switched.create_maniphest_task("a task that Herald announces")

    def sent():
        rows = switched.site.rows(
            "herald",
            "SELECT r.* FROM herald_webhookrequest r JOIN herald_webhook h"
            " ON h.phid = r.webhookPHID WHERE h.phid = %s",
            hook["hookPHID"],
        )
        return rows if rows and all(r["status"] != "queued" for r in rows) else None

    requests = await switched.until(sent, "the webhook request left 'queued'")
    rows = await switched.settled(marker, "publish and webhook tasks")

    assert [(r["objectPHID"], r["status"], r["lastRequestResult"]) for r in requests] == [
        (task["phid"], "sent", "okay")
    ]
    hook_tasks = [r for r in rows if r["taskClass"] == "HeraldWebhookWorker"]
    assert len(hook_tasks) == 1
    assert json.loads(hook_tasks[0]["data"]) == {"webhookRequestPHID": requests[0]["phid"]}
    assert hook_tasks[0]["result"] == SUCCESS
    assert switched.leased_by_gorge(rows)

    [post] = [r for r in switched.receiver.requests if r.path == "/hook"]
    payload = json.loads(post.body)
    assert payload["object"] == {"type": "TASK", "phid": task["phid"]}
    assert payload["triggers"] == [{"phid": hook["rulePHID"]}]
    # Phorge's signature: HMAC-SHA256 of the body with the hook's key.
    signature = hmac.new(hook["hmacKey"].encode(), post.body, hashlib.sha256).hexdigest()
    assert post.headers["x-phabricator-webhook-signature"] == [signature]
