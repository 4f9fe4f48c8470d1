"""Phorge's mail through the library's ``gorge`` mail adapter and gorge-mailer
(smtp backend) to an SMTP sink on 127.0.0.1."""

from __future__ import annotations

import email
import email.policy
import json

import pytest

from tests.phorge.switched import gorge_mailer_entry

pytestmark = [pytest.mark.phorge, pytest.mark.integration, pytest.mark.slow]

SUCCESS, FAILURE = 0, 1  # PhabricatorWorkerArchiveTask::RESULT_*


def parsed(delivery) -> email.message.EmailMessage:
    return email.message_from_bytes(delivery.data, policy=email.policy.default)


async def test_send_test_reaches_the_sink_through_gorge_mailer(switched, tmp_path):
    attachment = tmp_path / "notes.txt"
    attachment.write_bytes(b"attached through gorge\n")

    await switched.site.bin(
        "mail",
        "send-test",
        "--to",
        "alice@example.com",
        "--subject",
        "gorge send-test",
        "--attach",
        str(attachment),
        "--html",
        stdin=b"<p>Hello from <b>Phorge</b></p>",
    )

    [delivery] = switched.deliveries_to("alice@example.com")
    message = parsed(delivery)
    assert "gorge send-test" in message["Subject"]
    assert message["From"].addresses[0].addr_spec == "noreply@example.com"
    assert message["X-Phabricator-Sent-This-Message"] == "Yes"  # Phorge's headers pass through
    html = message.get_body(("html",)).get_content()
    assert "Hello from <b>Phorge</b>" in html
    [part] = list(message.iter_attachments())
    assert part.get_filename() == "notes.txt"
    assert part.get_content() in ("attached through gorge\n", b"attached through gorge\n")
    row = switched.site.rows("metamta", "SELECT * FROM metamta_mail ORDER BY id DESC LIMIT 1")[0]
    assert row["status"] == "sent"
    assert json.loads(row["parameters"])["mailer.key"] == "gorge"


async def test_a_mail_to_a_refused_recipient_fails_and_is_not_retried(switched):
    switched.smtp.script["rcpt:refused@example.com"] = (
        "550 5.1.1 <refused@example.com>: no such user"
    )
    try:
        mail = await switched.site.helper(
            "mail", to=["refused@example.com"], subject="to nobody", body="refused"
        )
        task = await switched.until(
            lambda: (
                (t := switched.mail_task(mail["mailID"]))
                and t["table"] == "worker_archivetask"
                and t
            ),
            "the mail task archived",
        )
    finally:
        del switched.smtp.script["rcpt:refused@example.com"]

    assert task["result"] == FAILURE
    assert task["failureCount"] == 0
    row = switched.mail(mail["mailID"])
    assert row["status"] == "fail"
    assert "rejected the mail permanently" in row["message"] and "550" in row["message"]
    assert switched.deliveries_to("refused@example.com") == []


async def test_a_mail_whose_outcome_is_unknown_is_failed_not_resent(switched):
    # The connection drops after the message was handed over: a mail server
    # may hold it, so gorge-mailer answers "outcome unknown".
    switched.smtp.script["dot"] = "drop"
    try:
        mail = await switched.site.helper(
            "mail", to=["maybe@example.com"], subject="maybe sent", body="unknown"
        )
        task = await switched.until(
            lambda: (
                (t := switched.mail_task(mail["mailID"]))
                and t["table"] == "worker_archivetask"
                and t
            ),
            "the mail task archived",
        )
    finally:
        del switched.smtp.script["dot"]

    assert (task["result"], task["failureCount"]) == (FAILURE, 0)
    row = switched.mail(mail["mailID"])
    assert row["status"] == "fail"
    assert "unknown" in row["message"] and "not sent again" in row["message"]


async def test_mail_queued_while_gorge_mailer_is_down_is_sent_once_when_it_is_back(switched):
    await switched.gorge.stop("mailer")
    try:
        mail = await switched.site.helper(
            "mail", to=["later@example.com"], subject="sent later", body="after the outage"
        )
        failed = await switched.until(
            lambda: (t := switched.mail_task(mail["mailID"])) and t["failureCount"] == 1 and t,
            "the first attempt failed",
        )
        row = switched.mail(mail["mailID"])
    finally:
        await switched.gorge.start_ready("mailer")

    assert failed["table"] == "worker_activetask" and failed["leaseOwner"] is None
    # PhabricatorMetaMTAWorker's own wait: failure count x 15 seconds.
    assert failed["leaseExpires"] - failed["failureTime"] == 15
    assert row["status"] == "queued"
    assert "did not answer" in row["message"]
    assert switched.deliveries_to("later@example.com") == []

    # Time travel instead of waiting out the retry wait.
    switched.make_due(failed["id"])
    task = await switched.until(lambda: switched.archived(failed["id"]), "the retry archived")

    assert (task["result"], task["failureCount"]) == (SUCCESS, 1)
    assert switched.mail(mail["mailID"])["status"] == "sent"
    assert len(switched.deliveries_to("later@example.com")) == 1


async def test_any_other_answer_leaves_the_mail_queued_for_a_retry(switched):
    entry = gorge_mailer_entry(switched.gorge.mailer_uri)
    entry["options"]["token"] = "not-the-mailer-token"
    switched.site.configure({"cluster.mailers": [entry]})
    try:
        status, out, err = await switched.site.bin(
            "mail",
            "send-test",
            "--to",
            "unauthorized@example.com",
            "--subject",
            "wrong token",
            stdin=b"refused by gorge-mailer",
            check=False,
        )
    finally:
        switched.site.configure(
            {"cluster.mailers": [gorge_mailer_entry(switched.gorge.mailer_uri)]}
        )

    # send-test runs in-process: a temporary failure ends the command, and
    # the mail stays queued.
    assert status != 0
    row = switched.site.rows("metamta", "SELECT * FROM metamta_mail ORDER BY id DESC LIMIT 1")[0]
    assert row["status"] == "queued"
    assert "HTTP 401, ERR_UNAUTHORIZED" in row["message"]
    assert switched.deliveries_to("unauthorized@example.com") == []


async def test_bin_config_checks_the_adapter_options(switched):
    bad_entries = {
        "required": {"key": "g", "type": "gorge", "options": {}},
        "http:// or https://": {"key": "g", "type": "gorge", "options": {"uri": "ftp://127.0.0.1"}},
    }
    for message, entry in bad_entries.items():
        status, out, err = await switched.site.bin(
            "config", "set", "--database", "cluster.mailers", json.dumps([entry]), check=False
        )
        assert status != 0
        assert 'Option "uri"' in out + err and message in out + err

    # A valid entry passes validation and reaches the next check:
    # cluster.mailers is locked to local configuration, which (being the
    # checkout's conf/local/local.json) these tests never write.
    good = json.dumps([gorge_mailer_entry(switched.gorge.mailer_uri)])
    status, out, err = await switched.site.bin(
        "config", "set", "--database", "cluster.mailers", good, check=False
    )
    assert status != 0
    assert "is locked" in out + err and 'Option "uri"' not in out + err
