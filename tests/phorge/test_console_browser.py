"""The gorge console at /gorge/ in a headless Chromium (Debian's
``chromium``, driven by Playwright with the system browser): an
administrator sees a dead task and a failed webhook request this test made,
requeues and retries them from the page, and the rows change in Phorge's
tables; the daemons log who acted; a non-administrator gets Phorge's access
denied page; no page carries a daemon's token. Acting on many: retry by
class, a hook's failures since a time, and cancel / free / reprioritise by
filter, each with its count shown before the action."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import treq
from twisted.internet.threads import deferToThread

from gorge_testing.gorge_stack import QUEUE_TOKEN
from tests.phorge.console import (
    TOKENS,
    Person,
    person,
    start_worker,
)

CHROMIUM = Path("/usr/bin/chromium")

pytestmark = [
    pytest.mark.phorge,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.parametrize("switched", ["conduit"], indirect=True),
    pytest.mark.skipif(
        not CHROMIUM.exists() or shutil.which("chromium") is None,
        reason="no /usr/bin/chromium (scripts/install-deps.sh installs Debian's chromium)",
    ),
]

DEAD_CLASS = "GorgeConsoleNoSuchWorker"  # worker.execute fails it for good
FAILURE = 1
CANCELLED = 2
WAITING_CLASS = "GorgeConsoleWaitingWorker"  # never leased: the worker is stopped
NEW_PRIORITY = 1234
BROWSER_TIMEOUT_MS = 60_000


@contextmanager
def chromium(base: str) -> Iterator[Callable[[Person], Any]]:
    """Debian's Chromium, headless, driven by Playwright's sync API (run in a
    thread of its own: it blocks); yields ``page_for(person)``, a new page
    logged in to ``base`` as that person."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:

            def page_for(who: Person) -> Any:
                context = browser.new_context()
                context.add_cookies([{"name": "phsid", "value": who.session, "url": base + "/"}])
                page = context.new_page()
                page.set_default_timeout(BROWSER_TIMEOUT_MS)
                return page

            yield page_for
        finally:
            browser.close()


def submit(page: Any) -> str:
    """Press the dialog's submit button; the text of the page it leads to."""
    with page.expect_navigation():
        page.click("button[name=__submit__]")
    return page.inner_text("body")


def last_success(base: str, admin: Person, hook: str) -> str:
    """What /gorge/webhooks/ says of ``hook``'s last delivered request."""
    with chromium(base) as page_for:
        page = page_for(admin)
        response = page.goto(base + "/gorge/webhooks/")
        assert response is not None and response.status == 200
        return page.inner_text(f'[data-gorge-last-success="{hook}"]')


def browse(
    base: str,
    admin: Person,
    member: Person,
    dead: list[int],
    request_id: int,
    active: dict,
    hook: str,
) -> dict:
    """The browser's part, in a thread of its own (Playwright's sync API
    blocks): returns what it saw."""

    seen: dict = {"sources": {}}
    with chromium(base) as page_for:
        page = page_for(admin)

        def visit(path: str) -> None:
            response = page.goto(base + path)
            assert response is not None and response.status == 200, (path, response)
            seen["sources"][path] = page.content()

        def act(selector: str, path_after: str) -> None:
            page.click(selector)
            page.wait_for_selector("button[name=__submit__]")
            seen["sources"][page.url] = page.content()
            with page.expect_navigation():
                page.click("button[name=__submit__]")
            # A refused action shows the dialog again, with the daemon's error.
            assert page.url == base + path_after, page.inner_text("body")[:3000]
            seen["sources"][page.url + "#after"] = page.content()

        visit("/gorge/")
        seen["overview"] = page.inner_text("body")
        visit("/gorge/tasks/")
        seen["tasks"] = page.inner_text("body")
        seen["last_errors"] = {
            task_id: page.inner_text(f'[data-gorge-last-error="{task_id}"]') for task_id in dead
        }
        act(f'[data-gorge-action="requeue-{dead[0]}"]', "/gorge/tasks/")
        act(f'[data-gorge-action="retry-{dead[1]}"]', "/gorge/tasks/")
        act(f'[data-gorge-action="free-{active["free"]}"]', "/gorge/tasks/")
        act(f'[data-gorge-action="cancel-{active["cancel"]}"]', "/gorge/tasks/")
        page.click(f'[data-gorge-action="priority-{active["priority"]}"]')
        page.fill("input[name=priority]", str(NEW_PRIORITY))
        with page.expect_navigation():
            page.click("button[name=__submit__]")
        assert page.url == base + "/gorge/tasks/", page.inner_text("body")[:3000]
        visit("/gorge/webhooks/")
        seen["webhooks"] = page.inner_text("body")
        seen["last_success_before"] = page.inner_text(f'[data-gorge-last-success="{hook}"]')
        act(f'[data-gorge-action="retry-webhook-{request_id}"]', "/gorge/webhooks/")
        visit("/gorge/mail/")

        outsider = page_for(member)
        response = outsider.goto(base + "/gorge/")
        assert response is not None
        seen["member_page"] = outsider.inner_text("body")
        seen["sources"]["/gorge/ (member)"] = outsider.content()
    return seen


async def test_an_administrator_requeues_and_retries_from_the_console(console):
    s = console
    admin = await person(s, "consoleadmin", admin=True)
    member = await person(s, "consolemember", admin=False)

    # Two tasks gorge-worker fails for good (no such class in PHP).
    dead = [
        (await s.site.helper("schedule", taskClass=DEAD_CLASS, data={"n": n}))["taskID"]
        for n in (1, 2)
    ]
    await s.until(lambda: all(s.archived(i) for i in dead), "both dead tasks archived")
    assert [s.archived(i)["result"] for i in dead] == [FAILURE, FAILURE]

    # A webhook request that fails once and, retried never, ends "failed".
    [hook] = (
        await s.site.helper(
            "hooks",
            author="gorge-worker",
            name="console",
            count=1,
            uri=s.receiver.base + "/status/500",
        )
    )["hookPHIDs"]
    obj = await s.site.helper("maniphest-task", author="gorge-worker", title="console hook")
    await s.site.helper(
        "webhook-batch",
        hookPHIDs=[hook],
        count=1,
        objectPHID=obj["phid"],
        transactionPHIDs=obj["transactionPHIDs"],
        retryMode="never",
    )

    def failed_request():
        rows = s.site.rows(
            "herald",
            "SELECT * FROM herald_webhookrequest WHERE webhookPHID = %s AND status = 'failed'",
            hook,
        )
        return rows[0] if rows else None

    request = await s.until(failed_request, "the webhook request failed")
    # The receiver is fixed before the retry: the replay is then delivered.
    s.site.execute(
        "herald",
        "UPDATE herald_webhook SET webhookURI = %s WHERE phid = %s",
        s.receiver.base + "/console-ok",
        hook,
    )

    # Nothing leases while the browser acts, so the rows stay as it left them.
    marker = s.task_marker()
    await s.gorge.stop("worker")
    try:
        active = {
            verb: (await s.site.helper("schedule", taskClass=WAITING_CLASS, data={"v": verb}))[
                "taskID"
            ]
            for verb in ("free", "cancel", "priority")
        }
        [held] = await lease(s, WAITING_CLASS, limit=1)
        assert held["id"] == active["free"]

        seen = await deferToThread(
            browse, s.site.base_uri, admin, member, dead, request["id"], active, hook
        )

        # What the administrator saw.
        assert "gorge-taskqueue" in seen["overview"] and "Task Queue" in seen["overview"]
        # The release, API version and uptime of each daemon that runs (its
        # /version; gorge-worker is stopped), and the queue's ages as
        # gorge-taskqueue reads them: the waiting tasks' class in its band.
        assert seen["overview"].count(importlib.metadata.version("gorge")) >= 2 * 3
        assert seen["overview"].count("not reported") == 1
        assert "Queue Age (" in seen["overview"]
        assert re.search(WAITING_CLASS + r"\s+default\s", seen["overview"]), seen["overview"]
        assert DEAD_CLASS in seen["tasks"]
        # Each dead task with the error gorge-worker reported for it (Phorge's
        # tables keep none: gorge-taskqueue's note, /api/queue/failures).
        for task_id in dead:
            error = seen["last_errors"][task_id]
            assert DEAD_CLASS in error and "does not exist" in error, seen["last_errors"]
        assert "console 0" in seen["webhooks"] and "http/500" in seen["webhooks"]

        # Requeue: a new active task from the first; its archive row stays.
        # Free, cancel, priority on waiting and leased tasks.
        freed = s.task(active["free"])
        assert freed["table"] == "worker_activetask" and freed["leaseOwner"] is None
        assert s.archived(active["cancel"])["result"] == CANCELLED
        assert s.task(active["priority"])["priority"] == NEW_PRIORITY

        [requeued] = [r for r in s.tasks_since(marker) if r["taskClass"] == DEAD_CLASS]
        assert requeued["table"] == "worker_activetask"
        assert requeued["failureCount"] == 0 and requeued["leaseOwner"] is None
        assert s.archived(dead[0])["result"] == FAILURE
        # Retry: the second is active again under its own id.
        retried = s.task(dead[1])
        assert retried["table"] == "worker_activetask" and retried["failureCount"] == 0

        # Phorge's activity log and the daemons' logs name the administrator.
        logs = (await s.site.helper("user-logs", action="gorge-console"))["logs"]
        mine = [entry for entry in logs if entry["actorPHID"] == admin.phid]
        assert sorted(e["details"]["action"] for e in mine) == [
            "cancel",
            "free",
            "priority",
            "requeue",
            "retry",
            "retry-webhook-request",
        ]
        assert all(e["details"]["outcome"] == "done" for e in mine)
        actor = f"request_id=phorge:{admin.username}:"
        queue_log = s.gorge.daemons["taskqueue"].log_text()
        assert any(
            "TASKQUEUE_TASK_REQUEUED" in line and actor in line for line in queue_log.splitlines()
        )
        assert any(
            "TASKQUEUE_TASK_RETRIED" in line and actor in line for line in queue_log.splitlines()
        )

        # The non-administrator: Phorge's own access denied page.
        # (Phorge answers a policy rejection with its dialog, status 200.)
        denied = seen["sources"]["/gorge/ (member)"]
        assert "aphront-access-dialog" in denied
        assert "<title>You Shall Not Pass: Restricted Application</title>" in denied
        assert "gorge-taskqueue" not in seen["member_page"]

        # No page the browser got carries a token.
        for where, source in seen["sources"].items():
            for name, token in TOKENS.items():
                assert token not in source, f"{name}'s token in the page source of {where}"
    finally:
        for row in s.tasks_since(marker):
            if row["table"] == "worker_activetask":
                s.forget_task(row["id"])
        s.forget_task(dead[1])
        if "worker" not in s.gorge.daemons:
            await start_worker(s)

    # The replayed request is delivered to the fixed receiver, once.
    def sent():
        row = s.site.rows(
            "herald", "SELECT * FROM herald_webhookrequest WHERE id = %s", request["id"]
        )[0]
        return row if row["status"] == "sent" else None

    row = await s.until(sent, "the retried webhook request delivered")
    assert row["lastRequestResult"] == "okay"
    assert s.receiver.count("/console-ok") == 1
    # The hook's last success: none while its one request had failed, then
    # that delivery (Phorge's own rows).
    assert seen["last_success_before"] == "never"
    assert await deferToThread(last_success, s.site.base_uri, admin, hook) not in ("", "never")
    webhook_log = s.gorge.daemons["webhook"].log_text()
    assert any(
        "WEBHOOK_REQUEST_REPLAYED" in line and f"request_id=phorge:{admin.username}:" in line
        for line in webhook_log.splitlines()
    )


async def lease(s, task_class: str, limit: int) -> list[dict]:
    """Lease through gorge-taskqueue as a worker would (owner ends in
    ``:gorge-worker``)."""
    response = await treq.post(
        f"http://127.0.0.1:{s.gorge.ports['taskqueue']}/api/queue/lease",
        json.dumps({"limit": limit, "taskClasses": [task_class]}).encode(),
        headers={
            "X-Service-Token": QUEUE_TOKEN,
            "X-Lease-Owner": "console-test:1:1:gorge-worker",
            "Content-Type": "application/json",
        },
        timeout=30,
    )
    body = json.loads(await response.content())
    assert response.code == 200, body
    return body["data"]


BULK_CLASS = "GorgeConsoleNoSuchBulkWorker"


def browse_bulk(base: str, admin: Person, hook_name: str) -> dict:
    """Retry dead tasks by class, and a hook's failed requests since a time:
    each a choice, a count shown, a confirmation."""

    seen: dict = {}
    with chromium(base) as page_for:
        page = page_for(admin)
        page.goto(base + "/gorge/tasks/")
        page.click('a[href="/gorge/tasks/retry-class/"]')
        page.select_option("select[name=taskClass]", BULK_CLASS)
        seen["task_count"] = submit(page)
        seen["task_done"] = submit(page)

        page.goto(base + "/gorge/webhooks/")
        page.click('a[href="/gorge/webhooks/retry-since/"]')
        page.select_option("select[name=hookPHID]", label=hook_name)
        page.select_option("select[name=window]", "3600")
        seen["hook_count"] = submit(page)
        seen["hook_done"] = submit(page)
    return seen


async def test_an_administrator_retries_dead_tasks_by_class_and_a_hooks_failures_since(console):
    s = console
    admin = await person(s, "bulkadmin", admin=True)

    dead = [
        (await s.site.helper("schedule", taskClass=BULK_CLASS, data={"n": n}))["taskID"]
        for n in (1, 2)
    ]
    await s.until(lambda: all(s.archived(i) for i in dead), "both dead tasks archived")

    [hook] = (
        await s.site.helper(
            "hooks",
            author="gorge-worker",
            name="bulk",
            count=1,
            uri=s.receiver.base + "/status/503",
        )
    )["hookPHIDs"]
    obj = await s.site.helper("maniphest-task", author="gorge-worker", title="bulk hook")
    await s.site.helper(
        "webhook-batch",
        hookPHIDs=[hook],
        count=2,
        objectPHID=obj["phid"],
        transactionPHIDs=obj["transactionPHIDs"],
        retryMode="never",
    )

    def requests(status: str):
        rows = s.site.rows(
            "herald",
            "SELECT * FROM herald_webhookrequest WHERE webhookPHID = %s AND status = %s",
            hook,
            status,
        )
        return rows if len(rows) == 2 else None

    failed = await s.until(lambda: requests("failed"), "both requests failed")
    s.site.execute(
        "herald",
        "UPDATE herald_webhook SET webhookURI = %s WHERE phid = %s",
        s.receiver.base + "/bulk-ok",
        hook,
    )

    await s.gorge.stop("worker")
    try:
        seen = await deferToThread(browse_bulk, s.site.base_uri, admin, "bulk 0")

        assert "2 dead task(s) of class " + BULK_CLASS in seen["task_count"]
        assert "Retried 2 Tasks" in seen["task_done"]
        for task_id in dead:
            row = s.task(task_id)
            assert row["table"] == "worker_activetask" and row["failureCount"] == 0

        assert "2 failed request(s) of bulk 0" in seen["hook_count"]
        assert "Retried 2 Requests" in seen["hook_done"]

        logs = (await s.site.helper("user-logs", action="gorge-console"))["logs"]
        mine = {e["details"]["action"]: e["details"] for e in logs if e["actorPHID"] == admin.phid}
        assert sorted(mine["retry-class"]["taskIDs"]) == sorted(dead)
        assert mine["retry-webhook-since"]["retried"] == 2
    finally:
        for task_id in dead:
            if (s.task(task_id) or {}).get("table") == "worker_activetask":
                s.forget_task(task_id)
        if "worker" not in s.gorge.daemons:
            await start_worker(s)

    await s.until(lambda: requests("sent"), "both retried requests delivered")
    assert s.receiver.count("/bulk-ok") == 2
    assert {r["id"] for r in failed} == {r["id"] for r in requests("sent")}


FILTER_CANCEL_CLASS = "GorgeConsoleFilterCancelWorker"
FILTER_FREE_CLASS = "GorgeConsoleFilterFreeWorker"
FILTER_PRIORITY_CLASS = "GorgeConsoleFilterPriorityWorker"
FILTER_PRIORITY = 3456


def browse_filters(base: str, admin: Person) -> dict:
    """Cancel, free and reprioritise by filter: each a choice, the count shown
    in the confirmation dialog, then the action."""

    seen: dict = {}
    with chromium(base) as page_for:
        page = page_for(admin)

        def by_filter(name: str, choose) -> None:
            page.goto(base + "/gorge/tasks/")
            page.click('a[href="/gorge/tasks/filter/"]')
            choose()
            seen[name + "_count"] = submit(page)
            seen[name + "_done"] = submit(page)

        def cancel() -> None:
            page.select_option("select[name=verb]", "cancel")
            page.select_option("select[name=taskClass]", FILTER_CANCEL_CLASS)
            page.select_option("select[name=state]", "waiting")

        def free() -> None:
            page.select_option("select[name=verb]", "free")
            page.select_option("select[name=taskClass]", FILTER_FREE_CLASS)

        def priority() -> None:
            page.select_option("select[name=verb]", "priority")
            page.select_option("select[name=taskClass]", FILTER_PRIORITY_CLASS)
            page.select_option("select[name=state]", "failing")
            page.fill("input[name=priority]", str(FILTER_PRIORITY))

        by_filter("cancel", cancel)
        by_filter("free", free)

        # The class's own button chooses the class already.
        page.goto(base + "/gorge/tasks/")
        page.click(f'[data-gorge-action="filter-{FILTER_PRIORITY_CLASS}"]')
        seen["preselected"] = page.input_value("select[name=taskClass]")
        page.select_option("select[name=verb]", "priority")
        page.select_option("select[name=state]", "failing")
        page.fill("input[name=priority]", "soon")
        seen["bad_priority"] = submit(page)
        page.fill("input[name=priority]", str(FILTER_PRIORITY))
        seen["priority_count"] = submit(page)
        seen["priority_done"] = submit(page)
    return seen


async def test_an_administrator_cancels_frees_and_reprioritises_by_filter(console):
    s = console
    admin = await person(s, "filteradmin", admin=True)

    # Nothing leases while the browser acts, so only the console moves rows.
    await s.gorge.stop("worker")
    made: list[int] = []
    try:

        async def schedule(task_class: str, n: int) -> int:
            task_id = (await s.site.helper("schedule", taskClass=task_class, data={"n": n}))[
                "taskID"
            ]
            made.append(task_id)
            return task_id

        # Three of the class wait and one is leased: cancelling the waiting
        # ones leaves the leased one.
        cancels = [await schedule(FILTER_CANCEL_CLASS, n) for n in range(4)]
        [held_cancel] = await lease(s, FILTER_CANCEL_CLASS, limit=1)
        assert held_cancel["id"] == cancels[0]
        # Two of three leased: free acts on those two only.
        frees = [await schedule(FILTER_FREE_CLASS, n) for n in range(3)]
        held_free = await lease(s, FILTER_FREE_CLASS, limit=2)
        assert [t["id"] for t in held_free] == frees[:2]
        # Two of three failed once: only they get the new priority.
        priorities = [await schedule(FILTER_PRIORITY_CLASS, n) for n in range(3)]
        for task_id in priorities[1:]:
            s.site.execute(
                "worker",
                "UPDATE worker_activetask SET failureCount = 1, failureTime = %s WHERE id = %s",
                int(time.time()),
                task_id,
            )
        untouched_priority = s.task(priorities[0])["priority"]

        seen = await deferToThread(browse_filters, s.site.base_uri, admin)

        # The count first, then the action.
        assert (
            f"This will cancel 3 task(s) of class {FILTER_CANCEL_CLASS} (not leased)"
            in seen["cancel_count"]
        ), seen["cancel_count"]
        assert "Cancelled 3 Tasks" in seen["cancel_done"]
        assert (
            f"This will free 2 task(s) of class {FILTER_FREE_CLASS} (leased)"
            in (seen["free_count"])
        ), seen["free_count"]
        assert "Freed 2 Tasks" in seen["free_done"]
        assert seen["preselected"] == FILTER_PRIORITY_CLASS
        assert "The priority must be a whole number" in seen["bad_priority"]
        assert (
            f"This will set the priority of 2 task(s) of class {FILTER_PRIORITY_CLASS} "
            f"(failing) to {FILTER_PRIORITY}" in seen["priority_count"]
        ), seen["priority_count"]
        assert "Set the Priority of 2 Tasks" in seen["priority_done"]

        # The rows changed in Phorge's tables, and only the chosen ones.
        assert [s.archived(i)["result"] for i in cancels[1:]] == [CANCELLED] * 3
        assert s.task(cancels[0])["table"] == "worker_activetask"
        for task_id in frees[:2]:
            assert s.task(task_id)["leaseOwner"] is None
        assert s.task(frees[2])["leaseOwner"] is None  # never leased
        assert s.task(frees[2])["leaseExpires"] is None
        assert [s.task(i)["priority"] for i in priorities] == [
            untouched_priority,
            FILTER_PRIORITY,
            FILTER_PRIORITY,
        ]

        # Phorge's activity log: one entry per action, with the filter and
        # the ids; the daemon's log names the administrator on each call.
        logs = (await s.site.helper("user-logs", action="gorge-console"))["logs"]
        mine = {e["details"]["action"]: e["details"] for e in logs if e["actorPHID"] == admin.phid}
        assert sorted(mine) == ["cancel-by-filter", "free-by-filter", "priority-by-filter"]
        assert mine["cancel-by-filter"]["taskIDs"] == cancels[1:]
        assert mine["cancel-by-filter"]["state"] == "waiting"
        assert mine["free-by-filter"]["taskIDs"] == frees[:2]
        assert mine["priority-by-filter"]["taskIDs"] == priorities[1:]
        assert mine["priority-by-filter"]["priority"] == FILTER_PRIORITY
        assert all(e["outcome"] == "done" for e in mine.values())
        queue_log = s.gorge.daemons["taskqueue"].log_text().splitlines()
        for details in mine.values():
            lines = [line for line in queue_log if details["requestID"] in line]
            assert len(lines) >= len(details["taskIDs"]), (details, lines)
            assert details["requestID"].startswith(f"phorge:{admin.username}:")
        assert any(
            "TASKQUEUE_TASK_FREED" in line and mine["free-by-filter"]["requestID"] in line
            for line in queue_log
        )
    finally:
        for task_id in made:
            if (s.task(task_id) or {}).get("table") == "worker_activetask":
                s.forget_task(task_id)
        if "worker" not in s.gorge.daemons:
            await start_worker(s)
