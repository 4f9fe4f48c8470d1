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
        environ = daemon_environ({
            **daemon_env(mariadb, namespace),
            "GORGE_WEBHOOK_OUTBOUND_BLACKLIST": "none",
            "GORGE_LOG_LEVEL": "info",
            **env,
        })
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
    return re.search(rb'"object": \{\s+"type": "[^"]*",\s+"phid": "([^"]+)"', body).group(1).decode()


async def test_three_daemons_deliver_each_of_300_rows_exactly_once(
        mariadb, namespace_db, receiver, tmp_path):
    namespace, herald = namespace_db
    receiver.delay = 0.15  # slower than the 100 ms poll interval
    hooks = [herald.insert_hook(uri=f"{receiver.base}/hook{i}") for i in range(10)]
    for n in range(300):
        herald.insert_request(hook=hooks[n % 10], object_phid=f"PHID-TASK-{n:020d}")
    daemons = [Daemon(mariadb, namespace, tmp_path / f"d{i}.log") for i in range(3)]
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
        mariadb, namespace_db, receiver, tmp_path):
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
