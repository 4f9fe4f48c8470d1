"""SIGTERM never cuts a request that has already arrived (real twistd processes).

A slow client sends the head and the first part of a 1.5 MB body, SIGTERM
reaches the daemon, and only then does the client send the rest: the request
is read to its end, handled and answered normally before the process exits,
while a new connection is refused.
"""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.error import ConnectionRefusedError

from tests.mailer.conftest import valid_message
from tests.support.slowclient import connect, parse_response, post
from tests.support.twistd import TwistdProcess, daemon_environ, healthz

pytestmark = pytest.mark.slow

BODY_SIZE = 1_500_000
FIRST_PART = 64 * 1024


async def sigterm_mid_body(daemon: TwistdProcess, path: str, body: bytes):
    """The slow request around a SIGTERM; its parsed answer."""
    port = await daemon.serving()
    client = await connect(reactor, port)
    head, body = post(path, body)
    client.send(head + body[:FIRST_PART])
    # The head was already in the socket when this second connection was
    # made; the reactor has read it by the time it answers the probe.
    await healthz(reactor, port)

    daemon.signal("TERM")
    # Logged once the listening socket is closed (twistd's "Port N Closed"
    # line comes just before the close).
    await daemon.wait_for("HTTP_LISTENER_CLOSED", timeout=30)
    with pytest.raises(ConnectionRefusedError):
        await connect(reactor, port)

    client.send(body[FIRST_PART:])
    raw = await client.closed.addTimeout(30, reactor)
    await daemon.wait_ended(timeout=60)
    status, headers, answer = parse_response(raw)
    assert int(headers["content-length"]) == len(answer)
    assert headers.get("connection") == "close"
    return status, json.loads(answer)


def environ(**extra: str) -> dict[str, str]:
    return daemon_environ(
        {"GORGE_LISTEN_ADDR": "127.0.0.1:0", **extra}, drop=("GORGE_", "SMTP_", "MAILER_")
    )


@pytest_twisted.ensureDeferred
async def test_taskqueue_answers_an_enqueue_still_arriving_at_sigterm(tmp_path):
    env = environ(
        GORGE_TASKQUEUE_BACKEND="sqlite",
        GORGE_TASKQUEUE_SQLITE_PATH=str(tmp_path / "queue.sqlite3"),
    )
    daemon = TwistdProcess(reactor, "gorge-taskqueue", env)
    body = json.dumps({"taskClass": "PhabricatorSearchWorker", "data": "d" * BODY_SIZE})
    try:
        status, doc = await sigterm_mid_body(daemon, "/api/queue/enqueue", body.encode())
    finally:
        daemon.kill()
    assert status == 200, doc
    assert doc["data"]["taskClass"] == "PhabricatorSearchWorker" and doc["data"]["id"] >= 1
    assert "TASKQUEUE_STOPPED" in daemon.text()


@pytest_twisted.ensureDeferred
async def test_mailer_sends_a_message_still_arriving_at_sigterm(tmp_path):
    daemon = TwistdProcess(
        reactor, "gorge-mailer", environ(GORGE_MAILER_CONFIG='[{"key":"t","type":"test"}]')
    )
    body = json.dumps({"message": valid_message(textBody="x" * BODY_SIZE)})
    try:
        status, doc = await sigterm_mid_body(daemon, "/api/mailer/send", body.encode())
    finally:
        daemon.kill()
    assert status == 200 and doc["data"]["mailerKey"] == "t", doc
    assert "MAILER_BODY_TRUNCATED" in daemon.text()  # more than the first part was read
