"""A mail whose answer was lost is delivered once: the SMTP server takes the
message but answers after the adapter has given up, Phorge retries the mail
task, and the retry is answered from gorge-mailer's record of the first send
(keyed by the mail's PHID) instead of being sent again."""

from __future__ import annotations

import pytest
from twisted.internet.defer import Deferred

from tests.phorge.switched import gorge_mailer_entry

pytestmark = [
    pytest.mark.phorge,
    pytest.mark.integration,
    pytest.mark.slow,
    # The adapter's options are read per request on the web server.
    pytest.mark.parametrize("switched", ["conduit"], indirect=True),
]

SUCCESS = 0  # PhabricatorWorkerArchiveTask::RESULT_SUCCESS
# Shorter than the held SMTP reply, which only the test lets go.
ADAPTER_TIMEOUT = 3


async def test_a_mail_accepted_after_the_adapter_timed_out_is_delivered_once(switched):
    impatient = gorge_mailer_entry(switched.gorge.mailer_uri)
    impatient["options"]["timeout"] = ADAPTER_TIMEOUT
    switched.site.configure({"cluster.mailers": [impatient]})
    switched.smtp.release = Deferred()
    switched.smtp.script["dot"] = "hold"
    try:
        mail = await switched.site.helper(
            "mail", to=["once@example.com"], subject="delivered once", body="exactly one copy"
        )
        failed = await switched.until(
            lambda: (t := switched.mail_task(mail["mailID"])) and t["failureCount"] == 1 and t,
            "the adapter timed out and the mail task failed once",
        )
        row = switched.mail(mail["mailID"])
    finally:
        del switched.smtp.script["dot"]
        switched.site.configure(
            {"cluster.mailers": [gorge_mailer_entry(switched.gorge.mailer_uri)]}
        )
        # The server answers the message it holds: 250, accepted.
        switched.smtp.release.callback(None)

    assert row["status"] == "queued" and "did not answer" in row["message"]
    assert len(switched.deliveries_to("once@example.com")) == 1

    # Time travel instead of waiting out PhabricatorMetaMTAWorker's retry wait.
    switched.make_due(failed["id"])
    task = await switched.until(lambda: switched.archived(failed["id"]), "the retry archived")

    assert (task["result"], task["failureCount"]) == (SUCCESS, 1)
    assert switched.mail(mail["mailID"])["status"] == "sent"
    assert len(switched.deliveries_to("once@example.com")) == 1
    # The retry was answered from the record of the first send, by the mail's PHID.
    log = switched.gorge.daemons["mailer"].log_text()
    assert f"MAILER_SEND_REPLAYED key={row['phid']} code=OK mailer=sink" in log
