"""``worker.execute`` called directly, the way gorge-worker calls it, on a real
Phorge: who may call it, what it answers, and that it only reads the row of
the task it runs."""

from __future__ import annotations

import pytest

pytestmark = [
    pytest.mark.phorge,
    pytest.mark.integration,
    pytest.mark.slow,
    # worker.execute itself: the Conduit path's own tests.
    pytest.mark.parametrize("switched", ["conduit"], indirect=True),
]

FAR_FUTURE = 4_000_000_000  # a delayed task that no queue leases meanwhile


async def execute(switched, token, **params):
    return await switched.site.conduit("worker.execute", params, token)


async def test_the_readiness_probe_gets_the_code_gorge_worker_expects(switched):
    envelope = await execute(switched, switched.token, taskClass="")
    assert envelope["error_code"] == "ERR-NO-TASK-CLASS"
    assert envelope["result"] is None


async def test_only_an_administrator_may_run_tasks(switched):
    other = await switched.site.helper("setup", username="not-an-admin", admin=False)

    refused = await execute(switched, other["token"], taskClass="PhabricatorTestWorker", data="{}")
    anonymous = await execute(switched, None, taskClass="PhabricatorTestWorker", data="{}")

    # Seen once in CI as ERR-CONDUIT-CORE (an exception inside Phorge): say
    # which, with what Phorge's web server logged, should it come back.
    web = switched.site.web
    assert refused["error_code"] == "ERR-NOT-ADMIN", (
        refused,
        web.log_text()[-3000:] if web is not None else "",
    )
    assert "administrator" in refused["error_info"]
    assert anonymous["error_code"] not in (None, "ERR-NO-TASK-CLASS")
    assert anonymous["result"] is None


async def test_parameters_are_exactly_the_ones_gorge_worker_sends(switched):
    extra = await execute(
        switched, switched.token, taskClass="PhabricatorTestWorker", data="{}", priority=1
    )
    wrong = await execute(
        switched, switched.token, taskClass="PhabricatorTestWorker", data={"not": "text"}
    )

    assert extra["error_code"] == "ERR-CONDUIT-CALL" and "priority" in extra["error_info"]
    assert wrong["error_code"] == "ERR-BAD-PARAMETER" and '"data"' in wrong["error_info"]


@pytest.mark.parametrize(
    "task_class, data, reason",
    [
        ("GorgeNoSuchWorker", "{}", 'Task class "GorgeNoSuchWorker" does not exist.'),
        ("PhabricatorUser", "{}", 'is not a subclass of "PhabricatorWorker"'),
        ("PhabricatorWorker", "{}", 'is not a subclass of "PhabricatorWorker"'),
        ("PhabricatorTestWorker", "{not json", "is not valid JSON"),
        # A bare number reaches the worker as a number (the mail ID it loads).
        ("PhabricatorMetaMTAWorker", "987654321", 'mail message (with ID "987654321")'),
        ("PhabricatorTestWorker", '{"doWork":"fail-permanent"}', "Permanent failure!"),
    ],
)
async def test_permanent_failures(switched, task_class, data, reason):
    envelope = await execute(switched, switched.token, taskClass=task_class, data=data)
    result = envelope["result"]
    assert envelope["error_code"] is None
    assert result["result"] == "permanent-failure"
    assert reason in result["failureReason"]


async def test_success_and_a_failure_with_the_workers_own_wait(switched):
    ok = await execute(
        switched, switched.token, taskClass="PhabricatorTestWorker", data='{"doWork":"nothing"}'
    )
    failing = await execute(
        switched,
        switched.token,
        taskClass="PhabricatorTestWorker",
        data='{"doWork":"fail-temporary","getWaitBeforeRetry":42}',
    )
    no_wait = await execute(
        switched,
        switched.token,
        taskClass="PhabricatorTestWorker",
        data='{"doWork":"fail-temporary"}',
    )

    assert ok["result"]["result"] == "success"
    assert failing["result"]["result"] == "failure"
    assert failing["result"]["retry"] == 42
    assert failing["result"]["failureReason"] == "Temporary failure!"
    assert no_wait["result"]["result"] == "failure" and "retry" not in no_wait["result"]


async def test_the_failure_count_comes_from_the_row_which_is_never_written(switched):
    first = switched.task_marker()
    story_of = await switched.create_maniphest_task("a story whose hook fails")
    await switched.settled(first, "publishing")
    key = str(
        switched.site.rows(
            "feed",
            "SELECT chronologicalKey FROM feed_storyreference WHERE objectPHID = %s",
            story_of["phid"],
        )[0]["chronologicalKey"]
    )
    failing_hook = switched.receiver.base + "/status/500"
    hooks = switched.site.config["feed.http-hooks"]
    switched.site.configure({"feed.http-hooks": [*hooks, failing_hook]})
    try:
        scheduled = await switched.site.helper(
            "schedule",
            taskClass="FeedPublisherHTTPWorker",
            data={"key": key, "uri": failing_hook},
            delayUntil=FAR_FUTURE,
        )
        task_id = scheduled["taskID"]
        switched.site.execute(
            "worker", "UPDATE worker_activetask SET failureCount = 2 WHERE id = %s", task_id
        )
        before = switched.task(task_id)
        data = switched.site.rows(
            "worker", "SELECT data FROM worker_taskdata WHERE id = %s", before["dataID"]
        )[0]["data"]

        envelope = await execute(
            switched, switched.token, taskID=task_id, taskClass="FeedPublisherHTTPWorker", data=data
        )
    finally:
        switched.site.configure({"feed.http-hooks": hooks})
    after = switched.task(task_id)
    switched.forget_task(task_id)

    result = envelope["result"]
    assert result["result"] == "failure"
    # FeedPublisherHTTPWorker waits max(failureCount, 1) x 60 s, and Phorge
    # counts the failure at hand before asking: (2 + 1) x 60.
    assert result["retry"] == 180
    assert switched.receiver.count("/status/500") >= 1
    assert after == before


async def test_a_task_over_its_retry_limit_fails_permanently(switched):
    scheduled = await switched.site.helper(
        "schedule", taskClass="PhabricatorMetaMTAWorker", data=1, delayUntil=FAR_FUTURE
    )
    switched.site.execute(
        "worker",
        "UPDATE worker_activetask SET failureCount = 251 WHERE id = %s",
        scheduled["taskID"],
    )

    envelope = await execute(
        switched,
        switched.token,
        taskID=scheduled["taskID"],
        taskClass="PhabricatorMetaMTAWorker",
        data="1",
    )
    switched.forget_task(scheduled["taskID"])

    assert envelope["result"]["result"] == "permanent-failure"
    assert "maximum number of failures (250)" in envelope["result"]["failureReason"]
