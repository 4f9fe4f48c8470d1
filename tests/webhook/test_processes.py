"""Real ``twistd -n gorge-webhook`` processes: three on one database, and SIGTERM mid-delivery."""

from __future__ import annotations

import os
import re
import signal
from collections import Counter
from pathlib import Path

import pytest
from twisted.internet import reactor
from twisted.internet.task import deferLater

from tests.support.twistd import TwistdDaemon, daemon_environ
from tests.webhook.conftest import daemon_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]

_namespaces = iter(range(1, 10_000))


class Daemon(TwistdDaemon):
    """One gorge-webhook process; waits are asynchronous so the in-test receiver keeps serving."""

    def __init__(self, mariadb, namespace: str, log_path: Path, **env: str) -> None:
        environ = daemon_environ(
            {
                **daemon_env(mariadb, namespace),
                "GORGE_WEBHOOK_OUTBOUND_BLACKLIST": "none",
                "GORGE_LOG_LEVEL": "info",
                **env,
            }
        )
        super().__init__("gorge-webhook", environ, log_path)

    async def terminate(self, timeout: float = 40.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        waited = 0.0
        while self.proc.poll() is None:
            if waited > timeout:
                self.proc.kill()
                raise AssertionError(f"no exit after SIGTERM:\n{self.log_text()[-3000:]}")
            await deferLater(reactor, 0.05)
            waited += 0.05
        self._log.close()
        return self.proc.returncode


async def wait_for(predicate, timeout: float, step: float = 0.1, daemons=()) -> None:
    waited = 0.0
    while not predicate():
        for daemon in daemons:
            assert daemon.proc.poll() is None, f"daemon exited:\n{daemon.log_text()[-3000:]}"
        assert waited < timeout, "condition not reached in time"
        await deferLater(reactor, step)
        waited += step


@pytest.fixture
def namespace_db(mariadb):
    from tests.webhook.conftest import HeraldDB

    namespace = f"mp{os.getpid()}x{next(_namespaces)}"
    db = HeraldDB(mariadb, mariadb.create_database("herald", f"{namespace}_herald"))
    yield namespace, db
    db.close()


def _object_of(body: bytes) -> str:
    return (
        re.search(rb'"object": \{\s+"type": "[^"]*",\s+"phid": "([^"]+)"', body).group(1).decode()
    )


async def test_three_daemons_deliver_each_of_300_rows_exactly_once(
    mariadb, namespace_db, receiver, tmp_path
):
    namespace, herald = namespace_db
    receiver.delay = 0.15  # slower than the 100 ms poll interval
    hooks = [herald.insert_hook(uri=f"{receiver.base}/hook{i}") for i in range(10)]
    for n in range(300):
        herald.insert_request(hook=hooks[n % 10], object_phid=f"PHID-TASK-{n:020d}")
    # Three slots each for ten hooks: a replica holds a hook (its lock) while it
    # works it, so no one replica can take every hook.
    daemons = [
        Daemon(mariadb, namespace, tmp_path / f"d{i}.log", GORGE_WEBHOOK_MAX_CONCURRENT="3")
        for i in range(3)
    ]
    try:
        await wait_for(lambda: herald.status_counts() == {"sent": 300}, 120, daemons=daemons)
        await deferLater(reactor, 0.5)  # a few more ticks: nothing may be sent again
        codes = [await daemon.terminate() for daemon in daemons]
    finally:
        for daemon in daemons:
            daemon.kill()
    per_object = Counter(_object_of(r.body) for r in receiver.requests)
    assert len(receiver.requests) == 300
    assert set(per_object.values()) == {1}
    assert set(per_object) == {f"PHID-TASK-{n:020d}" for n in range(300)}
    assert all(code in (0, -signal.SIGTERM) for code in codes), codes
    logs = [daemon.log_text() for daemon in daemons]
    # The work was shared, not done by one process.
    assert sum(1 for text in logs if "WEBHOOK_DELIVERED" in text) >= 2


async def test_sigterm_mid_delivery_finishes_and_writes_then_restart_sends_nothing(
    mariadb, namespace_db, receiver, tmp_path
):
    namespace, herald = namespace_db
    receiver.delay = 2.0
    hook = herald.insert_hook(uri=f"{receiver.base}/slow")
    request_id = herald.insert_request(hook=hook, properties={"retry": "forever"})
    daemon = Daemon(mariadb, namespace, tmp_path / "first.log")
    try:
        await wait_for(lambda: receiver.count() == 1, 60, daemons=[daemon])
        code = await daemon.terminate()
    finally:
        daemon.kill()
    assert code in (0, -signal.SIGTERM)
    row = herald.request(request_id)
    assert (row["status"], row["lastRequestResult"]) == ("sent", "okay")
    assert '"errorCode":200' in row["properties"]
    text = daemon.log_text()
    assert text.index("WEBHOOK_DELIVERED") < text.index("WEBHOOK_STOPPED")

    receiver.delay = 0.0
    again = Daemon(mariadb, namespace, tmp_path / "second.log")
    try:
        await wait_for(lambda: "WEBHOOK_CONFIG" in again.log_text(), 60, daemons=[again])
        await deferLater(reactor, 1.0)  # ten poll intervals
        await again.terminate()
    finally:
        again.kill()
    assert receiver.count() == 1
    assert herald.request(request_id) == row


async def test_three_daemons_deliver_replayed_requests_exactly_once_more(
    mariadb, namespace_db, receiver, tmp_path
):
    import json

    import treq
    from twisted.internet.error import ConnectionRefusedError

    from gorge_testing.procs import free_port

    namespace, herald = namespace_db
    token = "replay-token"
    hooks = [herald.insert_hook(uri=f"{receiver.base}/hook{i}") for i in range(3)]
    for n in range(30):
        herald.insert_request(hook=hooks[n % 3], object_phid=f"PHID-TASK-{n:020d}")
    ports = [free_port() for _ in range(3)]
    daemons = [
        Daemon(
            mariadb,
            namespace,
            tmp_path / f"d{i}.log",
            GORGE_LISTEN_ADDR=f"127.0.0.1:{port}",
            GORGE_SERVICE_TOKEN=token,
        )
        for i, port in enumerate(ports)
    ]

    async def post(port: int, path: str, body: dict | None = None) -> tuple[int, dict]:
        response = await treq.post(
            f"http://127.0.0.1:{port}/api/webhook/{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"X-Service-Token": token},
            persistent=False,
        )
        return response.code, json.loads(await response.content())

    async def listening(port: int, bound: float = 60.0) -> None:
        # The rows may all be sent before a slower replica has bound its port.
        deadline = reactor.seconds() + bound
        while True:
            try:
                await treq.get(f"http://127.0.0.1:{port}/healthz", persistent=False)
                return
            except ConnectionRefusedError:
                if reactor.seconds() > deadline:
                    raise
                await deferLater(reactor, 0.1)

    try:
        await wait_for(lambda: herald.status_counts() == {"sent": 30}, 120, daemons=daemons)
        first = {_object_of(r.body): r for r in receiver.requests}
        assert len(first) == 30 == receiver.count()
        for port in ports:
            await listening(port)
        # Each replica is asked for a part: a range for one hook, single requests too.
        code, answer = await post(
            ports[0], "requests/retry", {"hookPHID": hooks[0], "since": 0, "status": "sent"}
        )
        assert code == 200 and len(answer["data"]["retried"]) == 10
        code, answer = await post(
            ports[1], "requests/retry", {"hookPHID": hooks[1], "since": 0, "status": "any"}
        )
        assert code == 200 and len(answer["data"]["retried"]) == 10
        for (request_id,) in herald.query(
            "SELECT id FROM herald_webhookrequest WHERE webhookPHID = %s", (hooks[2],)
        ):
            code, _ = await post(ports[2], f"requests/{request_id}/retry")
            assert code == 200
        await wait_for(
            lambda: receiver.count() >= 60 and herald.status_counts() == {"sent": 30},
            120,
            daemons=daemons,
        )
        await deferLater(reactor, 1.0)  # ten more polls on every replica: nothing more
        codes = [await daemon.terminate() for daemon in daemons]
    finally:
        for daemon in daemons:
            daemon.kill()
    assert receiver.count() == 60
    assert set(Counter(_object_of(r.body) for r in receiver.requests).values()) == {2}
    for got in receiver.requests[30:]:
        original = first[_object_of(got.body)]
        assert got.body == original.body
        assert (
            got.headers["x-phabricator-webhook-signature"]
            == original.headers["x-phabricator-webhook-signature"]
        )
    assert all(code in (0, -signal.SIGTERM) for code in codes), codes
    replayed = sum(daemon.log_text().count("WEBHOOK_REQUEST_REPLAYED") for daemon in daemons)
    assert replayed == 30
