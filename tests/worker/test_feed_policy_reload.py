"""The running worker reads its feed policy file at start-up and again on
SIGHUP, never per task."""

from __future__ import annotations

import json
import os
import signal

import pytest
import pytest_twisted
from treq.testing import RequestTraversalAgent
from twisted.internet.defer import Deferred
from twisted.internet.task import LoopingCall
from twisted.web.resource import Resource

from gorge.worker.outcome import PermanentFailure
from gorge.worker.service import build_worker_service
from gorge.worker.settings import load_worker_settings
from tests.support.logcapture import first_event

FEED = "FeedPublisherHTTPWorker"
TASK = json.dumps({"storyID": 3, "uri": "http://hook.test/feed"})


class EmptyQueue(Resource):
    isLeaf = True

    def render(self, request):
        return b'{"data":[]}'


@pytest.fixture
def hangup_restored():
    original = signal.getsignal(signal.SIGHUP)
    yield
    signal.signal(signal.SIGHUP, original)


@pytest_twisted.ensureDeferred
async def test_sighup_makes_the_running_worker_read_the_policy_again(tmp_path, hangup_restored):
    from twisted.internet import reactor

    policy = tmp_path / "policy.json"
    policy.write_text('{"silent": true, "uris": []}')
    stub = RequestTraversalAgent(EmptyQueue())
    settings = load_worker_settings(
        {
            "GORGE_WORKER_TASK_QUEUE_URL": "http://queue:8090",
            "GORGE_LISTEN_ADDR": "127.0.0.1:0",
            "GORGE_WORKER_FEED_POLICY_FILE": str(policy),
        }
    )
    svc = build_worker_service(settings, reactor, http_client=stub)
    handler = svc.part("registry").get(FEED)

    async def run_task():
        return await Deferred.fromCoroutine(handler({"id": 1, "failureCount": 0}, TASK))

    pump = LoopingCall(stub.flush)  # the stub's lease answers need delivering
    pump.start(0.01)
    svc.startService()
    try:
        assert await run_task() is None  # silent: done without sending
        policy.write_text('{"silent": false, "uris": ["http://hook.test/other"]}')
        assert await run_task() is None  # the edit alone changes nothing
        with first_event("WORKER_FEED_POLICY_LOADED") as loaded:
            os.kill(os.getpid(), signal.SIGHUP)
            event = await loaded.addTimeout(10, reactor)
        assert (event["silent"], event["uris"]) == (False, 1)
        with pytest.raises(PermanentFailure, match="no longer configured"):
            await run_task()
    finally:
        await svc.stopService()
        pump.stop()
