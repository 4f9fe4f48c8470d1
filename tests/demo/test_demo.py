"""``gorge demo`` end to end, plus the demo's own parts in isolation."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import pytest_twisted
from treq.testing import StubTreq
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from gorge.cli.main import build_parser
from gorge.demo.handlers import FailOnce, Observed, YieldOnce
from gorge.demo.progress import summary_table
from gorge.demo.receiver import ReceiverPath, build_receiver, signature_of
from gorge.demo.seed import MAILS, REQUESTS, TASKS, request_properties
from gorge.demo.smtp import SinkFactory, SmtpSink
from gorge.demo.state import Check, DemoState
from gorge.worker.outcome import RetryLater, Yield, classify

REPO = Path(__file__).resolve().parents[2]
DEMO_BOUND = 150  # seconds; the demo itself settles in under 10


def run_demo(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "gorge.cli", "demo", "--workdir", str(tmp_path), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEMO_BOUND,
    )


@pytest.mark.slow
def test_demo_settles_every_seeded_item_and_exits_0(tmp_path):
    result = run_demo(tmp_path, "--timeout", "60")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    items = len(REQUESTS) + len(TASKS) + len(MAILS)
    assert f"All {items} seeded items reached their expected state" in out
    table = out[out.index("area ") :]
    rows = [line for line in table.splitlines()[2:] if line.strip() and not line.startswith("All ")]
    assert len(rows) == items
    assert all(row.rstrip().endswith(" ok") for row in rows), table
    # The narration shows each path the issue asks for.
    assert "signature ok, answered 200" in out
    assert "will be retried" in out
    assert "breaker OPENED for broken" in out
    assert "failed on purpose, retry in 1s" in out
    assert "yielded for 5s" in out
    assert "archived: success" in out and "archived: failure" in out
    assert "sink accepted" in out and "sink refused RCPT nobody@bounce.demo.test" in out
    assert "HTTP 422 ERR_PERMANENT_FAILURE" in out
    # Tasks were first leased in priority order once the worker started.
    first_runs: dict[str, int] = {}
    for line in out.splitlines():
        if " leased, running " in line:
            task = line.split("task #")[1].split()[0]
            first_runs.setdefault(task, int(line.split("(priority ")[1].split(")")[0]))
    assert len(first_runs) == len(TASKS)
    assert list(first_runs.values()) == sorted(first_runs.values())
    # The services logged to the file, not to the narration.
    log_text = (tmp_path / "services.log").read_text()
    assert "WEBHOOK_DELIVERED" in log_text
    assert "PANIC_RECOVERED" not in log_text and "POLL_LOOP_DIED" not in log_text
    assert "WEBHOOK_DELIVERED" not in out


@pytest.mark.slow
def test_demo_that_cannot_settle_in_time_exits_1_naming_what_is_missing(tmp_path):
    # The yielding task cannot finish before its 5 s yield window has passed.
    result = run_demo(tmp_path, "--timeout", "1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "did not reach their expected state within 1s" in result.stdout
    assert "yields once" in result.stdout.split("FAILED:")[1]
    assert "MISSING" in result.stdout


def test_cli_rejects_a_non_positive_timeout(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["demo", "--timeout", "0"])
    assert exit_info.value.code == 2
    assert "must be > 0" in capsys.readouterr().err


def test_cli_demo_defaults():
    args = build_parser().parse_args(["demo"])
    assert (args.command, args.serve, args.timeout, args.workdir) == ("demo", False, 60.0, "")


# -- the receiver ----------------------------------------------------------


def _receiver(events):
    paths = [ReceiverPath("good", "key-good", 200), ReceiverPath("bad", "key-bad", 500)]
    return StubTreq(build_receiver(paths, events.append))


@pytest_twisted.ensureDeferred
async def test_receiver_accepts_a_correct_signature_and_answers_the_paths_status():
    events = []
    client = _receiver(events)
    body = json.dumps({"object": {"type": "TASK", "phid": "PHID-TASK-x"}}).encode()
    good = await client.post(
        "http://r/hooks/good",
        data=body,
        headers={"X-Phabricator-Webhook-Signature": signature_of("key-good", body)},
    )
    bad = await client.post(
        "http://r/hooks/bad",
        data=body,
        headers={"X-Phabricator-Webhook-Signature": signature_of("key-bad", body)},
    )
    assert (good.code, bad.code) == (200, 500)
    assert [(e.path, e.object_phid, e.signature_ok, e.status) for e in events] == [
        ("good", "PHID-TASK-x", True, 200),
        ("bad", "PHID-TASK-x", True, 500),
    ]


@pytest_twisted.ensureDeferred
async def test_receiver_refuses_a_wrong_or_missing_signature():
    events = []
    client = _receiver(events)
    body = b'{"object":{"phid":"PHID-TASK-y"}}'
    wrong = await client.post(
        "http://r/hooks/good",
        data=body,
        headers={"X-Phabricator-Webhook-Signature": signature_of("key-bad", body)},
    )
    missing = await client.post("http://r/hooks/good", data=body)
    assert (wrong.code, missing.code) == (401, 401)
    assert [e.signature_ok for e in events] == [False, False]


def test_signature_is_lowercase_hex_hmac_sha256():
    # RFC 4231 test case 2.
    assert signature_of("Jefe", b"what do ya want for nothing?") == (
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    )


# -- the task handlers -----------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_fail_once_fails_the_first_run_only():
    handler = FailOnce()
    with pytest.raises(RetryLater) as first:
        await handler({"id": 1, "failureCount": 0}, None)
    assert first.value.retry_wait == 1
    assert await handler({"id": 1, "failureCount": 1}, None) is None


@pytest_twisted.ensureDeferred
async def test_yield_once_yields_per_task_then_completes():
    handler = YieldOnce()
    with pytest.raises(Yield) as yielded:
        await handler({"id": 7}, None)
    assert classify(yielded.value).kind == "yield"
    assert await handler({"id": 7}, None) is None
    with pytest.raises(Yield):
        await handler({"id": 8}, None)


@pytest_twisted.ensureDeferred
async def test_observed_reports_start_and_outcome_and_keeps_the_exception():
    runs = []
    observed = Observed(FailOnce(), runs.append)
    with pytest.raises(RetryLater):
        await observed({"id": 3, "taskClass": "C", "priority": 2000, "failureCount": 0}, None)
    await observed({"id": 3, "taskClass": "C", "priority": 2000, "failureCount": 1}, None)
    assert [(r.task_id, r.failure_count, r.outcome) for r in runs] == [
        (3, 0, ""),
        (3, 0, "retry"),
        (3, 1, ""),
        (3, 1, "ok"),
    ]


# -- judging and the summary -----------------------------------------------


def test_nothing_counts_as_done_before_anything_happened():
    state = DemoState(sink=SmtpSink(reject=frozenset(), on_event=lambda e: None))
    checks = state.checks()
    assert len(checks) == len(REQUESTS) + len(TASKS) + len(MAILS)
    assert not any(check.ok for check in checks)
    assert not state.done()


def test_seeded_properties_are_what_phorge_writes():
    document = json.loads(request_properties(REQUESTS[0]))
    assert list(document) == [
        "retry",
        "transactionPHIDs",
        "triggerPHIDs",
        "silent",
        "secure",
        "test",
    ]
    assert document["retry"] in ("forever", "never")


def test_summary_table_has_a_row_per_check_and_marks_the_missing():
    table = summary_table(
        [
            Check("task", "#1 a", "archived success", "active", False),
            Check("mail", "welcome", "200", "HTTP 200", True),
        ]
    )
    lines = table.splitlines()
    assert lines[0].split() == ["area", "item", "expected", "observed"]
    assert lines[2].endswith("MISSING") and lines[3].endswith("ok")


def _read_until(proc: subprocess.Popen, marker: str, bound: float) -> str:
    """stdout up to and including the line holding ``marker``; bounded by ``bound`` seconds."""
    seen = b""
    deadline = time.monotonic() + bound
    # Raw reads: a buffered reader could hold the marker while select() waits.
    while marker.encode() not in seen:
        remaining = deadline - time.monotonic()
        assert remaining > 0, seen.decode()
        ready, _, _ = select.select([proc.stdout], [], [], remaining)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536)
            assert chunk, seen.decode()  # EOF: the demo ended early
            seen += chunk
    return seen.decode()


@pytest.mark.slow
def test_serve_keeps_the_four_services_answering_until_interrupted(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gorge.cli", "demo", "--serve", "--workdir", str(tmp_path)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        bufsize=0,
    )
    try:
        out = _read_until(proc, "/hooks/<name>", DEMO_BOUND)
        urls = [
            line.split()[1]
            for line in out.splitlines()
            if line.startswith("  gorge-") and "/readyz" in line
        ]
        assert len(urls) == 4
        for url in urls:
            with urllib.request.urlopen(url, timeout=10) as response:
                assert (response.status, json.load(response)) == (200, {"status": "ok"})
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()


# -- the SMTP sink -----------------------------------------------------------


def _smtp_session(sink: SmtpSink, lines: list[bytes]) -> list[bytes]:
    """Feed one client conversation to a sink protocol; the server's reply lines."""
    protocol = SinkFactory(sink, Clock()).buildProtocol(("127.0.0.1", 0))
    transport = StringTransport()
    protocol.makeConnection(transport)
    for line in lines:
        protocol.dataReceived(line + b"\r\n")
    protocol.connectionLost(None)
    return transport.value().splitlines()


def test_sink_records_one_message_for_two_recipients():
    sink = SmtpSink(reject=frozenset(), on_event=lambda e: None)
    replies = _smtp_session(
        sink,
        [
            b"EHLO client.test",
            b"MAIL FROM:<noreply@phorge.test>",
            b"RCPT TO:<bob@demo.test>",
            b"RCPT TO:<carol@demo.test>",
            b"DATA",
            b"Subject: hello",
            b"",
            b"body",
            b".",
            b"QUIT",
        ],
    )
    assert [r[:3] for r in replies if r[:1].isdigit() and r[3:4] == b" "][-3:] == [
        b"354",
        b"250",
        b"221",
    ]
    assert [(e.recipients, e.subject) for e in sink.accepted] == [
        (("bob@demo.test", "carol@demo.test"), "hello")
    ]


def test_sink_refuses_a_listed_recipient_with_a_permanent_mailbox_error():
    events = []
    sink = SmtpSink(reject=frozenset({"nobody@bounce.demo.test"}), on_event=events.append)
    replies = _smtp_session(
        sink,
        [
            b"EHLO client.test",
            b"MAIL FROM:<noreply@phorge.test>",
            b"RCPT TO:<nobody@bounce.demo.test>",
            b"QUIT",
        ],
    )
    assert b"550 5.1.1 <nobody@bounce.demo.test>: mailbox unavailable" in replies
    assert sink.rejected == ["nobody@bounce.demo.test"] and sink.accepted == []
    assert [e.kind for e in events] == ["rejected"]
