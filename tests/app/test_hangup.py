"""ReloadOnHangup: SIGHUP runs a reload in the reactor thread while the
service runs, alongside any handler installed before it."""

from __future__ import annotations

import os
import signal

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from gorge.app.hangup import ReloadOnHangup
from tests.support.logcapture import first_event


@pytest.fixture
def reactor():
    from twisted.internet import reactor as global_reactor  # a real signal needs it

    return global_reactor


@pytest.fixture
def hangup_restored():
    original = signal.getsignal(signal.SIGHUP)
    yield
    signal.signal(signal.SIGHUP, original)


@pytest_twisted.ensureDeferred
async def test_sighup_reloads_and_chains_the_earlier_handler(reactor, hangup_restored):
    earlier = []
    signal.signal(signal.SIGHUP, lambda signum, frame: earlier.append(signum))
    before = signal.getsignal(signal.SIGHUP)
    reloaded: Deferred = Deferred()
    service = ReloadOnHangup(lambda: reloaded.callback(reactor.seconds()), reactor, name="r")
    service.startService()
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        await reloaded.addTimeout(10, reactor)
    finally:
        service.stopService()
    assert earlier == [signal.SIGHUP]
    assert signal.getsignal(signal.SIGHUP) is before


@pytest_twisted.ensureDeferred
async def test_a_failing_reload_is_logged_and_the_next_hangup_still_reloads(
    reactor, hangup_restored
):
    calls = []
    done: Deferred = Deferred()

    def reload() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("unreadable")
        done.callback(None)

    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    service = ReloadOnHangup(reload, reactor, name="policy")
    service.startService()
    try:
        with first_event("RELOAD_FAILED") as failed:
            os.kill(os.getpid(), signal.SIGHUP)
            event = await failed.addTimeout(10, reactor)
        assert event["service"] == "policy"
        os.kill(os.getpid(), signal.SIGHUP)
        await done.addTimeout(10, reactor)
    finally:
        service.stopService()
    assert len(calls) == 2
    # Stopped, the default action is back (a SIGHUP would end the process).
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
