"""The sendmail backend with a stub binary written by the test."""

from __future__ import annotations

import email
import email.policy
import stat

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from gorge.mailer.backends.base import BackendEntry
from gorge.mailer.backends.sendmail import SendmailBackend, build, classify_exit
from gorge.mailer.outcome import Kind
from tests.mailer.conftest import parsed_message as message
from tests.support.logcapture import logged_events

STUB = """#!/bin/sh
printf '%s\\0' "$@" > "{dir}/argv"
cat > "{dir}/stdin"
echo "diagnostic output"
{tail}
"""


@pytest.fixture
def reactor():
    from twisted.internet import reactor as global_reactor  # real processes need it

    return global_reactor


def stub(tmp_path, tail: str = "exit 0") -> str:
    path = tmp_path / "sendmail"
    path.write_text(STUB.format(dir=tmp_path, tail=tail))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


async def send(reactor, backend, msg=None, timeout: float = 10):
    return await backend.send(msg or message(), deadline=reactor.seconds() + timeout)


@pytest_twisted.ensureDeferred
async def test_argv_and_stdin(reactor, tmp_path):
    path = stub(tmp_path)
    backend = SendmailBackend("sm", 1, path, reactor=reactor)
    msg = message(
        to=[{"address": "-oQ@example.com"}],
        cc=[{"address": "cc@example.com"}],
        bcc=[{"address": "bcc@example.com"}],
        textBody="a\n.\nb",
    )
    outcome = await send(reactor, backend, msg)
    assert outcome.kind is Kind.ACCEPTED and outcome.message_id == ""
    argv = (tmp_path / "argv").read_bytes().split(b"\0")[:-1]
    assert argv == [
        b"-oi",
        b"-f",
        b"noreply@example.com",
        b"--",
        b"-oQ@example.com",
        b"cc@example.com",
        b"bcc@example.com",
    ]
    raw = (tmp_path / "stdin").read_bytes()
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert parsed["To"] == "-oQ@example.com" and parsed["Bcc"] is None
    assert parsed.get_content() == "a\n.\nb"  # -oi: no dot-stuffing on stdin


@pytest.mark.parametrize(
    "code,kind",
    [
        (0, Kind.ACCEPTED),
        (65, Kind.REJECTED_MESSAGE),
        (67, Kind.REJECTED_MESSAGE),
        (68, Kind.REJECTED_MESSAGE),
        (64, Kind.REJECTED_UNSCOPED),
        (66, Kind.REJECTED_UNSCOPED),
        (77, Kind.REJECTED_BACKEND),
        (78, Kind.REJECTED_BACKEND),
        (75, Kind.TRANSIENT),
        (69, Kind.UNKNOWN),
        (1, Kind.UNKNOWN),
        (70, Kind.UNKNOWN),
    ],
)
@pytest_twisted.ensureDeferred
async def test_exit_code_classification(reactor, tmp_path, code, kind):
    backend = SendmailBackend("sm", 1, stub(tmp_path, f"exit {code}"), reactor=reactor)
    outcome = await send(reactor, backend)
    assert outcome.kind is kind
    if code:
        assert f"exit {code}" in outcome.cause and "diagnostic output" in outcome.cause


@pytest_twisted.ensureDeferred
async def test_missing_binary_is_backend_scoped(reactor, tmp_path):
    backend = SendmailBackend("sm", 1, str(tmp_path / "nope"), reactor=reactor)
    outcome = await send(reactor, backend)
    assert outcome.kind is Kind.REJECTED_BACKEND


@pytest_twisted.ensureDeferred
async def test_not_executable_is_backend_scoped(reactor, tmp_path):
    path = tmp_path / "sendmail"
    path.write_text("#!/bin/sh\nexit 0\n")
    outcome = await send(reactor, SendmailBackend("sm", 1, str(path), reactor=reactor))
    assert outcome.kind is Kind.REJECTED_BACKEND


@pytest_twisted.ensureDeferred
async def test_deadline_kills_the_process_and_is_unknown(reactor, tmp_path):
    backend = SendmailBackend("sm", 1, stub(tmp_path, "exec sleep 30"), reactor=reactor)
    outcome = await send(reactor, backend, timeout=0.5)
    assert outcome.kind is Kind.UNKNOWN and "deadline" in outcome.cause


@pytest_twisted.ensureDeferred
async def test_cancel_kills_the_process(reactor, tmp_path):
    backend = SendmailBackend("sm", 1, stub(tmp_path, "exec sleep 30"), reactor=reactor)
    d = Deferred.fromCoroutine(send(reactor, backend))
    for _ in range(500):  # until the child has started reading its input
        if (tmp_path / "argv").exists():
            break
        wait = Deferred()
        reactor.callLater(0.01, wait.callback, None)
        await wait
    d.cancel()
    outcome = await d
    assert outcome.kind is Kind.UNKNOWN and "cancelled" in outcome.cause


@pytest_twisted.ensureDeferred
async def test_helper_holding_the_pipes_does_not_block_acceptance(reactor, tmp_path):
    # A forked helper keeps stdout open for 4 s; exit 0 is acceptance after
    # the 1 s pipe grace, before the helper is done.
    tail = f"(sleep 4; touch '{tmp_path}/helper-done') & exit 0"
    backend = SendmailBackend("sm", 1, stub(tmp_path, tail), reactor=reactor)
    outcome = await send(reactor, backend)
    assert outcome.kind is Kind.ACCEPTED
    assert not (tmp_path / "helper-done").exists()


def test_signal_is_unknown():
    assert classify_exit(None, 9).kind is Kind.UNKNOWN


def test_build_default_path():
    backend = build(BackendEntry("k", "sendmail", 1, {}), reactor=None)
    assert backend.path == "/usr/sbin/sendmail"
    assert build(BackendEntry("k", "sendmail", 1, {"path": "/x"}), reactor=None).path == "/x"


class _ExitedTransport:
    """The transport of a child that already exited: no process to signal."""

    def signalProcess(self, signal):
        from twisted.internet.error import ProcessExitedAlready

        raise ProcessExitedAlready()


@pytest.mark.parametrize(
    "exit_reason,kind",
    [
        ("done", Kind.ACCEPTED),
        ("dataerr", Kind.REJECTED_MESSAGE),
    ],
)
@pytest.mark.parametrize("how", ["cancel", "deadline"])
def test_stop_during_the_pipe_grace_keeps_the_exit_verdict(exit_reason, kind, how):
    # Once the main process has exited, only the wait for its pipes
    # remains; a deadline or cancel then must not turn its exit status (exit
    # 0 = accepted) into "outcome unknown", nor wait for the grace timer.
    from twisted.internet import task
    from twisted.internet.error import ProcessDone, ProcessTerminated
    from twisted.python.failure import Failure

    from gorge.mailer.backends.sendmail import _Child

    clock = task.Clock()
    child = _Child(clock, b"")
    child.transport = _ExitedTransport()
    reason = ProcessDone(0) if exit_reason == "done" else ProcessTerminated(exitCode=65)
    child.processExited(Failure(reason))
    results = []
    child.done.addBoth(results.append)
    if how == "cancel":
        child.done.cancel()
    else:
        child.kill("deadline")
    assert len(results) == 1, "the verdict must not wait for the pipe grace"
    assert results[0].kind is kind
    assert not clock.getDelayedCalls()


@pytest_twisted.ensureDeferred
async def test_the_binary_is_looked_at_when_built_and_on_reload_not_per_send(reactor, tmp_path):
    missing = tmp_path / "sendmail"
    with logged_events() as events:
        backend = SendmailBackend("sm", 1, str(missing), reactor=reactor)
    assert [e["log_format"].split()[0] for e in events] == ["MAILER_SENDMAIL_UNUSABLE"]
    stub(tmp_path)
    outcome = await send(reactor, backend)  # not looked at again for this send
    assert outcome.kind is Kind.REJECTED_BACKEND and "missing or not executable" in outcome.cause
    with logged_events() as events:
        backend.reload()
    assert [e["log_format"].split()[0] for e in events] == ["MAILER_SENDMAIL_USABLE"]
    assert (await send(reactor, backend)).kind is Kind.ACCEPTED


@pytest_twisted.ensureDeferred
async def test_sighup_makes_the_running_mailer_look_at_the_binary_again(reactor, tmp_path):
    import json
    import os
    import signal

    from tests.mailer.conftest import TOKEN, make_harness
    from tests.support.logcapture import first_event

    original = signal.getsignal(signal.SIGHUP)
    mailers = [{"key": "sm", "type": "sendmail", "options": {"path": str(tmp_path / "sendmail")}}]
    h = make_harness(
        {
            "GORGE_SERVICE_TOKEN": TOKEN,
            "GORGE_MAILER_MAX_RETRIES": "0",
            "GORGE_MAILER_CONFIG": json.dumps(mailers),
        },
        clock=reactor,
    )
    h.service.startService()
    try:
        stub(tmp_path)
        status, doc = await h.send()
        assert status == 502 and "missing or not executable" in doc["error"]["message"]
        with first_event("MAILER_SENDMAIL_USABLE") as usable:
            os.kill(os.getpid(), signal.SIGHUP)
            await usable.addTimeout(10, reactor)
        status, doc = await h.send()
        assert (status, doc) == (200, {"data": {"mailerKey": "sm"}})
    finally:
        await h.service.stopService()
        signal.signal(signal.SIGHUP, original)
