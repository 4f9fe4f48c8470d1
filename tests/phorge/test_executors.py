"""Local PHP executors on a real Phorge: PHP-only tasks (no native emulation)
run in gorge-worker's own PHP processes, an executor killed mid-task costs
that task one temporary failure and nothing else, and a task's follow-ups
are enqueued exactly once even when the answer to its report is lost and
the report is sent again."""

from __future__ import annotations

import json
import os
import signal

import pytest
import treq
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred
from twisted.web import resource, server

from tests.phorge.site import wait
from tests.phorge.switched import executor_pids

pytestmark = [
    pytest.mark.phorge,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.parametrize("switched", ["executors"], indirect=True),
]

SUCCESS = 0
TEST_WORKER = "PhabricatorTestWorker"


@pytest.fixture
def php_test_worker(switched):
    """gorge-worker restarted with PhabricatorTestWorker run in PHP, not
    emulated; the shared worker is put back afterwards."""
    wait(switched.gorge.stop("worker"))
    wait(switched.gorge.start_ready("worker", GORGE_WORKER_NATIVE_TEST_WORKER="0"))
    try:
        yield switched
    finally:
        wait(switched.gorge.stop("worker"))
        wait(switched.gorge.start_ready("worker"))


async def test_php_only_tasks_run_in_the_executors(php_test_worker):
    s = php_test_worker
    before = await s.php_runs()
    tasks = [
        await s.site.helper("schedule", taskClass=TEST_WORKER, data={"doWork": "nothing"})
        for _ in range(5)
    ]
    failing = await s.site.helper(
        "schedule", taskClass=TEST_WORKER, data={"doWork": "fail-permanent"}
    )
    rows = [
        await s.until(lambda t=t: s.archived(t["taskID"]), f"task {t['taskID']} archived")
        for t in [*tasks, failing]
    ]
    assert [r["result"] for r in rows] == [SUCCESS] * 5 + [1]
    assert all(r["failureCount"] == 0 for r in rows)
    assert s.leased_by_gorge(rows)
    # (Tasks the site queued itself, such as the bot's, may run alongside.)
    assert await s.php_runs() - before >= 6
    # Loaded once per executor, not once per task: no more processes than the pool.
    pids = executor_pids(s.gorge.daemons["worker"].pid)
    assert 1 <= len(pids) <= 4


async def test_an_executor_killed_mid_task_costs_that_task_one_temporary_failure(
    php_test_worker,
):
    s = php_test_worker
    worker = s.gorge.daemons["worker"]
    before = set(executor_pids(worker.pid))
    slow = await s.site.helper(
        "schedule",
        taskClass=TEST_WORKER,
        data={"doWork": "nothing", "duration": 60, "getWaitBeforeRetry": 1},
    )
    await s.until(
        lambda: (row := s.task(slow["taskID"])) and ":gorge-worker:" in (row["leaseOwner"] or ""),
        "the slow task leased by gorge",
    )
    # Every executor is killed; the one running the task among them.
    for pid in before:
        os.kill(pid, signal.SIGKILL)

    failed = await s.until(
        lambda: (row := s.task(slow["taskID"])) and row["failureCount"] == 1 and row,
        "the killed task reported as a temporary failure",
    )
    assert failed["table"] == "worker_activetask"
    assert "gorge-worker" not in (failed["leaseOwner"] or "")
    # The pool replaced its executors: a task runs again, in a new process.
    s.site.execute("worker", "DELETE FROM worker_activetask WHERE id = %s", slow["taskID"])
    quick = await s.site.helper("schedule", taskClass=TEST_WORKER, data={"doWork": "nothing"})
    row = await s.until(lambda: s.archived(quick["taskID"]), "a task after the kill archived")
    assert row["result"] == SUCCESS
    after = set(executor_pids(worker.pid))
    assert after and not (after & before)
    assert "WORKER_EXECUTOR_EXITED" in worker.log_text()


class _LosesOneAnswer(resource.Resource):
    """Forwards every request to the taskqueue, but drops the connection
    instead of answering the first report that carries follow-ups (the
    taskqueue has recorded it by then): the worker's first answer is lost."""

    isLeaf = True

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target
        self.dropped: list[bytes] = []
        # Upstream calls under way. A worker that goes away must take its
        # held lease call with it, as a real proxy does; otherwise the queue
        # would lease the next task to a worker that is no longer there.
        self.in_flight: set[Deferred] = set()

    def cancel_all(self) -> None:
        for call in list(self.in_flight):
            call.cancel()

    def render(self, request):
        body = request.content.read()
        headers = {
            k: v
            for k, v in request.requestHeaders.getAllRawHeaders()
            if k.lower() not in (b"host", b"content-length", b"connection")
        }

        async def forward():
            answer = await treq.request(
                request.method.decode(),
                self.target + request.uri.decode(),
                data=body,
                headers=headers,
                timeout=60,
            )
            content = await answer.content()
            if not self.dropped and b'"followups"' in body:
                self.dropped.append(body)
                request.transport.abortConnection()
                return
            request.setResponseCode(answer.code)
            for key, values in answer.headers.getAllRawHeaders():
                if key.lower() not in (b"content-length", b"connection", b"transfer-encoding"):
                    request.responseHeaders.setRawHeaders(key, values)
            request.write(content)
            request.finish()

        call = Deferred.fromCoroutine(forward())
        self.in_flight.add(call)
        call.addBoth(lambda result: (self.in_flight.discard(call), result)[1])
        call.addErrback(lambda failure: failure.trap(CancelledError))
        request.notifyFinish().addErrback(lambda _: call.cancel())
        return server.NOT_DONE_YET


async def test_follow_ups_are_enqueued_once_when_the_report_answer_is_lost(switched):
    s = switched
    key = await s.published_story_key("a story whose follow-up must come once")

    proxy = _LosesOneAnswer(s.gorge.daemons["taskqueue"].url)
    site = server.Site(proxy)
    site.noisy = False
    port = reactor.listenTCP(0, site, interface="127.0.0.1")
    await s.gorge.stop("worker")
    await s.gorge.start_ready(
        "worker", GORGE_WORKER_TASK_QUEUE_URL=f"http://127.0.0.1:{port.getHost().port}"
    )
    try:
        posts_before = len([r for r in s.receiver.requests if r.path == "/feed"])
        marker = s.task_marker()
        parent = await s.site.helper(
            "schedule", taskClass="FeedPublisherWorker", data={"key": key}, priority=3000
        )
        rows = await s.settled(marker, "FeedPublisherWorker and its follow-up")
        await s.until(
            lambda: len([r for r in s.receiver.requests if r.path == "/feed"]) > posts_before,
            "the follow-up posted the story",
        )
    finally:
        await s.gorge.stop("worker")
        await port.stopListening()
        proxy.cancel_all()
        await s.gorge.start_ready("worker")

    assert len(proxy.dropped) == 1, "the report with follow-ups was never sent"
    assert f'"taskID":{parent["taskID"]}'.encode() in proxy.dropped[0].replace(b" ", b"")
    follow_ups = [r for r in rows if r["taskClass"] == "FeedPublisherHTTPWorker"]
    assert len(follow_ups) == 1, [(r["id"], r["taskClass"]) for r in rows]
    assert follow_ups[0]["priority"] == 3000
    assert json.loads(follow_ups[0]["data"]) == {"key": key, "uri": s.receiver.base + "/feed"}
    parent_row = s.archived(parent["taskID"])
    assert parent_row is not None and parent_row["result"] == SUCCESS
    assert len([r for r in s.receiver.requests if r.path == "/feed"]) == posts_before + 1
