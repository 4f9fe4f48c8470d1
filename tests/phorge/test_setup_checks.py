"""The library's setup checks on a switched-over Phorge, and Phorge's own
daemon console over the tables gorge-taskqueue serves.

* After the switch-over (``phd.taskmasters`` 0, gorge-worker in
  ``gorge.daemons``) Phorge's "Daemons Are Not Running" is ignored, and no
  gorge issue is open while the daemons are healthy; with taskmasters
  configured again (rollback) the stock issue is back.
* gorge-worker stopped: "gorge-worker Is Not Running Tasks" opens on the next
  run of the checks (the Setup Issues page runs them on every load; the wait
  is bounded, never slept); started again: it is gone.
* ``/daemon/`` lists the tasks gorge completed, leased and left queued.
* ``gorge.daemons`` is locked, hidden and validated; a refused token and a
  gorge mailer missing from ``cluster.mailers`` are issues; a console
  action without Phorge's CSRF token changes nothing."""

from __future__ import annotations

import json
import re

import pytest
import treq

from gorge_testing.gorge_stack import QUEUE_TOKEN
from tests.phorge.console import (
    TOKENS,
    daemons_setting,
    get_page,
    open_issue_keys,
    person,
    start_worker,
)
from tests.phorge.site import wait

pytestmark = [
    pytest.mark.phorge,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.parametrize("switched", ["conduit"], indirect=True),
]

STOCK = "daemons.not-running"
WORKER_DOWN = "gorge.worker.not-running"
# Phorge's checks run once per web server process otherwise; the Setup
# Issues page runs them on each load, so a minute is far more than needed.
WITHIN = 60.0


@pytest.fixture(scope="module")
def admin(console):
    return wait(person(console, "checkadmin", admin=True))


async def test_switched_over_the_stock_daemons_issue_is_replaced_and_rollback_restores_it(
    console, admin
):
    keys = await open_issue_keys(console, admin)
    assert STOCK not in keys
    assert [k for k in keys if k.startswith("gorge.")] == []

    # The stock issue is still raised, marked ignored, where an operator
    # looks for why.
    code, page = await get_page(console, admin, f"/config/issue/{STOCK}/")
    assert code == 200
    assert "Daemons Are Not Running" in page

    console.site.configure({"phd.taskmasters": None})  # rollback: Phorge's default again
    try:
        assert STOCK in await open_issue_keys(console, admin)
    finally:
        console.site.configure({"phd.taskmasters": 0})
    assert STOCK not in await open_issue_keys(console, admin)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({"queue": {"uri": "http://127.0.0.1:8090"}}, 'unknown daemon "queue"'),
        ({"worker": {"uri": "127.0.0.1:8170"}}, "gorge.daemons.worker.uri must be"),
        ({"worker": {"uri": "http://127.0.0.1:8170/api"}}, "no path"),
        ({"mailer": {"uri": "http://h", "token": 7}}, "token must be a string"),
        ({"mailer": {"uri": "http://h", "tokn": "x"}}, 'unknown key "tokn"'),
        (["http://h"], 'unknown daemon "0"'),
        ({"taskqueue": {"uri": "https://queue.example:8090/", "token": "t"}}, None),
    ],
)
async def test_the_daemons_option_is_locked_hidden_and_validated(console, value, error):
    answer = await console.site.helper("validate-option", key="gorge.daemons", value=value)
    assert answer["locked"] and answer["hidden"]
    if error is None:
        assert answer["error"] is None
    else:
        assert error in (answer["error"] or "")


async def test_the_options_page_shows_no_token(console, admin):
    code, page = await get_page(console, admin, "/config/edit/gorge.daemons/")
    assert code == 200
    assert "gorge.daemons" in page
    for token in TOKENS.values():
        assert token not in page


async def test_a_refused_token_and_a_mailer_out_of_cluster_mailers_are_issues(console, admin):
    good = daemons_setting(console)
    wrong_token = {**good, "webhook": {**good["webhook"], "token": "not-the-token"}}
    console.site.configure({"gorge.daemons": wrong_token})
    try:
        keys = await open_issue_keys(console, admin)
        assert "gorge.daemon.webhook.version" in keys
        code, page = await get_page(console, admin, "/config/issue/gorge.daemon.webhook.version/")
        assert "refused the service token" in page
        assert "not-the-token" not in page

        elsewhere = {**good, "mailer": {**good["mailer"], "uri": "http://127.0.0.1:9"}}
        console.site.configure({"gorge.daemons": elsewhere})
        keys = await open_issue_keys(console, admin)
        assert "gorge.mailer.uri-mismatch" in keys
        assert "gorge.daemon.mailer" in keys  # nothing listens on port 9

        mailers = console.site.config["cluster.mailers"]
        console.site.configure({"gorge.daemons": good, "cluster.mailers": None})
        try:
            assert "gorge.mailer.not-in-cluster-mailers" in await open_issue_keys(console, admin)
        finally:
            console.site.configure({"cluster.mailers": mailers})
    finally:
        console.site.configure({"gorge.daemons": good})
    assert [k for k in await open_issue_keys(console, admin) if k.startswith("gorge.")] == []


async def test_a_stopped_worker_opens_a_gorge_issue_and_a_started_one_closes_it(console, admin):
    marker = console.task_marker()
    done = await console.site.helper(
        "schedule", taskClass="PhabricatorTestWorker", data={"note": "completed by gorge"}
    )
    await console.settled(marker, "a test task")

    await console.gorge.stop("worker")
    try:

        async def issue_open():
            return WORKER_DOWN in await open_issue_keys(console, admin)

        await console.until(issue_open, "gorge-worker issue open", bound=WITHIN)
        code, page = await get_page(console, admin, "/config/issue/")
        assert "gorge-worker Is Not Running Tasks" in page
        assert STOCK not in await open_issue_keys(console, admin)

        # With taskmasters configured (before the hand-over, after switching
        # back) a stopped gorge-worker is only a daemon down; Phorge's own
        # issue speaks for the queue.
        console.site.configure({"phd.taskmasters": None})
        try:
            keys = await open_issue_keys(console, admin)
            assert "gorge.daemon.worker" in keys and STOCK in keys
            assert WORKER_DOWN not in keys
        finally:
            console.site.configure({"phd.taskmasters": 0})

        # While nothing leases: one task waiting, one leased through
        # gorge-taskqueue by a worker-style owner.
        waiting = await console.site.helper(
            "schedule", taskClass="PhabricatorTestWorker", data={"note": "waits"}
        )
        await console.site.helper(
            "schedule", taskClass="GorgeConsoleLeasedWorker", data={"note": "leased"}
        )
        leased = await lease(console, "GorgeConsoleLeasedWorker")

        code, page = await get_page(console, admin, "/daemon/")
        assert code == 200
        # The daemon console links to the gorge console (a main menu bar
        # item the library adds), on the Daemons pages and for administrators.
        [link] = re.findall(r"<a [^>]*gorge-daemon-console-link[^>]*>", page)
        assert 'href="/gorge/"' in link, link
        _, other = await get_page(console, admin, "/config/issue/")
        assert "gorge-daemon-console-link" not in other
        # A user who is no administrator: Phorge refuses the page (403), and
        # its menu bar has no link either.
        member = await person(console, "daemonviewer", admin=False)
        _, other = await get_page(console, member, "/daemon/")
        assert "gorge-daemon-console-link" not in other
        completed = page.split("Recently Completed Tasks", 1)[1].split("Active Daemons", 1)[0]
        assert "PhabricatorTestWorker" in completed
        leased_part = page.split("Leased Tasks", 1)[1].split("Queued Tasks", 1)[0]
        assert f"/daemon/task/{leased['id']}/" in leased_part
        assert "GorgeConsoleLeasedWorker" in leased_part
        queued_part = page.split("Queued Tasks", 1)[1].split("Next In Queue", 1)[0]
        assert "PhabricatorTestWorker" in queued_part
        code, detail = await get_page(console, admin, f"/daemon/task/{done['taskID']}/")
        assert code == 200 and "PhabricatorTestWorker" in detail

        # gone from the queue so the worker does not run a class that does not exist
        console.forget_task(leased["id"])
        console.forget_task(waiting["taskID"])
    finally:
        if "worker" not in console.gorge.daemons:
            await start_worker(console)

    async def issue_closed():
        return WORKER_DOWN not in await open_issue_keys(console, admin)

    await console.until(issue_closed, "gorge-worker issue closed", bound=WITHIN)


async def lease(s, task_class: str) -> dict:
    response = await treq.post(
        f"http://127.0.0.1:{s.gorge.ports['taskqueue']}/api/queue/lease",
        json.dumps({"limit": 1, "taskClasses": [task_class]}).encode(),
        headers={
            "X-Service-Token": QUEUE_TOKEN,
            "X-Lease-Owner": "console-test:1:1:gorge-worker",
            "Content-Type": "application/json",
        },
        timeout=30,
    )
    body = json.loads(await response.content())
    assert response.code == 200, body
    [task] = body["data"]
    return task


async def test_a_console_action_without_phorges_csrf_token_changes_nothing(console, admin):
    # Not before an hour from now: gorge-worker leaves it alone meanwhile.
    from twisted.internet import reactor

    task = await console.site.helper(
        "schedule",
        taskClass="PhabricatorTestWorker",
        data={"note": "csrf"},
        delayUntil=int(reactor.seconds()) + 3600,
    )
    try:
        path = f"/gorge/task/cancel/{task['taskID']}/"
        response = await treq.post(
            console.site.base_uri + path,
            data={"__form__": "1"},
            cookies=admin.cookies,
            allow_redirects=False,
            timeout=60,
        )
        page = (await response.content()).decode("utf-8", "replace")
        assert response.code != 302
        assert "CSRF" in page
        assert console.task(task["taskID"])["table"] == "worker_activetask"

        # The same page, fetched, only asks.
        code, dialog = await get_page(console, admin, path)
        assert code == 200 and "Cancel Task" in dialog
        assert console.task(task["taskID"])["table"] == "worker_activetask"
    finally:
        console.forget_task(task["taskID"])
