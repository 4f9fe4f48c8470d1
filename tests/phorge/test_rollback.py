"""Switching a Phorge back from gorge: Phorge's own daemons take the queued mail
and tasks, and nothing is lost. This module runs its own Phorge, since it
ends switched back."""

from __future__ import annotations

import hashlib
import hmac
import json
import signal

import pytest

from gorge_testing.gorge_stack import WORKER_SUFFIX
from tests.phorge.site import wait
from tests.phorge.switched import Switched, gorge_mailer_entry

pytestmark = [pytest.mark.phorge, pytest.mark.integration, pytest.mark.slow]

SUCCESS = 0


@pytest.fixture(scope="module")
def rollback(phorge_checkout, mariadb, tmp_path_factory):
    s = Switched.build(phorge_checkout, mariadb, tmp_path_factory.mktemp("phorge-rollback"), "r")
    try:
        s.site.configure(
            {
                "cluster.mailers": [gorge_mailer_entry(s.gorge.mailer_uri)],
                "phd.taskmasters": 0,
                # Once switched back, Phorge's HeraldWebhookWorker delivers to
                # the receiver on 127.0.0.1 itself.
                "security.outbound-blacklist": [],
            }
        )
        s.site.start_web()
        wait(s.site.wait_web())
        s.site.bin_sync("phd", "start")
        for name in ("taskqueue", "mailer", "webhook", "worker"):
            wait(s.gorge.start_ready(name))
        yield s
    finally:
        s.close()
        wait(s.stop_listening())


async def test_switching_back_hands_queued_mail_and_tasks_to_phorge(rollback):
    site = rollback.site
    first = rollback.task_marker()
    hook = await site.helper(
        "webhook", author="gorge-worker", name="rollback hook", uri=rollback.receiver.base + "/hook"
    )
    await rollback.settled(first, "publishing the new Herald rule")
    marker = rollback.task_marker()

    # A mail that gorge-worker already tried once while gorge-mailer was down.
    await rollback.gorge.stop("mailer")
    inflight = await site.helper(
        "mail", to=["inflight@example.com"], subject="in flight", body="tried once by gorge"
    )
    tried = await rollback.until(
        lambda: (t := rollback.mail_task(inflight["mailID"])) and t["failureCount"] == 1 and t,
        "the first attempt failed",
    )

    # Rollback: stop gorge-worker (it drains and reports) and gorge-webhook,
    # then work keeps arriving while no one consumes it.
    codes = [await rollback.gorge.stop("worker"), await rollback.gorge.stop("webhook")]
    assert all(code in (0, -signal.SIGTERM) for code in codes), codes
    task = await rollback.create_maniphest_task("created while switching back")
    pending = await site.helper(
        "mail", to=["pending@example.com"], subject="pending", body="queued during the switch"
    )
    test_task = await site.helper(
        "schedule", taskClass="PhabricatorTestWorker", data={"doWork": "nothing"}
    )
    queued = rollback.tasks_since(marker)
    assert {r["table"] for r in queued} == {"worker_activetask"}
    assert test_task["taskID"] in {r["id"] for r in queued}

    # Phorge's mail goes out through its own SMTP mailer again, and its
    # taskmasters run.
    site.configure(
        {
            "cluster.mailers": [
                {
                    "key": "smtp",
                    "type": "smtp",
                    "options": {"host": "127.0.0.1", "port": rollback.smtp_port.getHost().port},
                }
            ],
            "phd.taskmasters": 1,
        }
    )
    await site.bin("phd", "stop")
    await site.bin("phd", "start")
    # Time travel instead of waiting out the mail's retry wait (15 s).
    rollback.make_due(tried["id"])

    rows = await rollback.settled(marker, "Phorge's taskmaster drained the queue")

    assert all(r["result"] == SUCCESS for r in rows), [(r["taskClass"], r["result"]) for r in rows]
    assert not any((r["leaseOwner"] or "").endswith(WORKER_SUFFIX) for r in rows)
    assert rollback.archived(tried["id"])["failureCount"] == 1
    for mail, address in ((inflight, "inflight@example.com"), (pending, "pending@example.com")):
        assert rollback.mail(mail["mailID"])["status"] == "sent"
        assert len(rollback.deliveries_to(address)) == 1
    assert json.loads(rollback.mail(pending["mailID"])["parameters"])["mailer.key"] == "smtp"

    [request] = site.rows(
        "herald", "SELECT * FROM herald_webhookrequest WHERE objectPHID = %s", task["phid"]
    )
    assert (request["status"], request["lastRequestResult"]) == ("sent", "okay")
    [post] = [r for r in rollback.receiver.requests if r.path == "/hook"]
    signature = hmac.new(hook["hmacKey"].encode(), post.body, hashlib.sha256).hexdigest()
    assert post.headers["x-phabricator-webhook-signature"] == [signature]
