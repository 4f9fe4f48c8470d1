"""Tasks that Phorge schedules itself, run by gorge-worker through gorge-taskqueue
(MySQL backend on Phorge's worker database) while ``phd.taskmasters`` = 0."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.phorge, pytest.mark.integration, pytest.mark.slow]

SUCCESS, FAILURE = 0, 1  # PhabricatorWorkerArchiveTask::RESULT_*


async def test_phd_runs_no_taskmaster(switched):
    _, out, _ = await switched.site.bin("phd", "status")
    assert "phd-daemon" in out

    def running():
        log = switched.site.rows(
            "daemon", "SELECT daemon FROM daemon_log WHERE status IN ('run', 'wait')"
        )
        daemons = {row["daemon"] for row in log}
        return daemons if "PhabricatorTriggerDaemon" in daemons else None

    daemons = await switched.until(running, "phd's trigger daemon running")
    assert "PhabricatorTaskmasterDaemon" not in daemons


async def test_a_maniphest_edit_runs_its_publish_task_and_follow_ups_through_gorge(switched):
    marker = switched.task_marker()
    calls_before = await switched.php_runs()

    task = await switched.create_maniphest_task("gorge runs what this edit causes")

    rows = await switched.settled(marker, "publish and its follow-ups")
    by_class = {}
    for row in rows:
        by_class.setdefault(row["taskClass"], []).append(row)
    publish = by_class["PhabricatorApplicationTransactionPublishWorker"]
    assert [r["objectPHID"] for r in publish] == [task["phid"]]
    # The publish task, run in PHP, scheduled the rest (directly, or as
    # follow-ups the queue enqueued with its archive).
    assert {"PhabricatorSearchWorker", "FeedPublisherWorker", "FeedPublisherHTTPWorker"} <= set(
        by_class
    )
    assert all(r["result"] == SUCCESS for r in rows), [(r["taskClass"], r["result"]) for r in rows]
    assert switched.leased_by_gorge(rows)
    # Every one of them is PHP-only here (a Herald webhook's task, if a rule
    # fires, is completed without PHP).
    php_only = [r for r in rows if r["taskClass"] != "HeraldWebhookWorker"]
    assert await switched.php_runs() - calls_before >= len(php_only)
    # FeedPublisherHTTPWorker (PHP) posted the story to the configured feed hook.
    story_posts = [
        r
        for r in switched.receiver.requests
        if r.path == "/feed" and task["phid"].encode() in r.body
    ]
    assert len(story_posts) >= 1


async def test_test_worker_runs_natively_and_a_permanent_failure_is_archived_as_failure(switched):
    calls_before = await switched.php_runs()
    ok = await switched.site.helper(
        "schedule", taskClass="PhabricatorTestWorker", data={"doWork": "nothing"}
    )
    failing = await switched.site.helper(
        "schedule", taskClass="PhabricatorTestWorker", data={"doWork": "fail-permanent"}
    )

    done = await switched.until(lambda: switched.archived(ok["taskID"]), "test task archived")
    failed = await switched.until(
        lambda: switched.archived(failing["taskID"]), "failing test task archived"
    )

    assert (done["result"], failed["result"]) == (SUCCESS, FAILURE)
    assert failed["failureCount"] == 0  # permanent: never retried
    assert switched.leased_by_gorge([done, failed])
    assert await switched.php_runs() == calls_before  # no PHP involved


async def test_php_only_permanent_failures_through_worker_execute(switched):
    calls_before = await switched.php_runs()
    # A mail task's data is the bare mail ID; this one names no mail.
    no_mail = await switched.site.helper(
        "schedule", taskClass="PhabricatorMetaMTAWorker", data=987654321
    )
    no_class = await switched.site.helper("schedule", taskClass="GorgeNoSuchWorker", data={})

    rows = [
        await switched.until(lambda t=t: switched.archived(t["taskID"]), f"task {t} archived")
        for t in (no_mail, no_class)
    ]

    assert [r["result"] for r in rows] == [FAILURE, FAILURE]
    assert [r["failureCount"] for r in rows] == [0, 0]
    assert switched.leased_by_gorge(rows)
    assert await switched.php_runs() - calls_before >= 2


async def test_follow_up_tasks_get_the_priority_of_the_task_that_queued_them(switched):
    key = await switched.published_story_key("a story to publish again")
    marker = switched.task_marker()

    # FeedPublisherWorker queues one FeedPublisherHTTPWorker per feed hook
    # with queueTask(), which names no priority.
    parent = await switched.site.helper(
        "schedule", taskClass="FeedPublisherWorker", data={"key": key}, priority=3000
    )

    rows = await switched.settled(marker, "FeedPublisherWorker and its follow-up")
    follow_ups = [r for r in rows if r["taskClass"] == "FeedPublisherHTTPWorker"]
    assert [r["id"] for r in rows if r["taskClass"] == "FeedPublisherWorker"] == [parent["taskID"]]
    assert len(follow_ups) == 1
    assert follow_ups[0]["priority"] == 3000
    assert json.loads(follow_ups[0]["data"]) == {
        "key": key,
        "uri": switched.receiver.base + "/feed",
    }
    assert all(r["result"] == SUCCESS for r in rows)


async def test_a_yield_runs_again_after_its_delay(switched):
    first = switched.task_marker()
    task = await switched.create_maniphest_task("an index that is busy")
    await switched.settled(first, "first publish")
    lock = (
        await switched.site.helper(
            "lock-name", name="index", parameters={"objectPHID": task["phid"]}
        )
    )["name"]

    # Hold the index lock that PhabricatorSearchWorker takes: it then yields
    # for 15 seconds instead of indexing.
    holder = switched.site.mariadb.connect()
    try:
        with holder.cursor() as cur:
            cur.execute("SELECT GET_LOCK(%s, 0)", (lock,))
            assert cur.fetchone()[0] == 1
        marker = switched.task_marker()
        await switched.edit_maniphest_task(task["phid"], "an index that is busy, edited")

        def yielded():
            for row in switched.tasks_since(marker):
                if (
                    row["taskClass"] == "PhabricatorSearchWorker"
                    and row["table"] == "worker_activetask"
                    and row["leaseOwner"] == "(yield)"
                ):
                    return row
            return None

        row = await switched.until(yielded, "search task yielded")
    finally:
        holder.close()

    assert row["failureCount"] == 0
    wait = row["leaseExpires"] - row["dateModified"]
    assert 14 <= wait <= 16, wait
    # Time travel instead of waiting out the 15 seconds: the queue sees the
    # yield's window as over.
    switched.make_due(row["id"], owner="(yield)")
    archived = await switched.until(lambda: switched.archived(row["id"]), "yielded task ran again")
    assert archived["result"] == SUCCESS
    assert archived["failureCount"] == 0
    assert switched.leased_by_gorge([archived])
