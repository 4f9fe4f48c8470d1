"""Three real ``twistd -n gorge-webhook`` replicas on one MariaDB: per hook, one
POST in flight at a time and the requests in id order, under a slow receiver
and when a replica is SIGKILLed mid-delivery (docs/webhook.md, "Order and
replicas"). Phorge's per-hook lock, taken from a test connection, keeps every
replica off the hook."""

from __future__ import annotations

import os
import re
import signal
from collections import Counter

import pytest
import treq
from twisted.internet import reactor
from twisted.internet.task import deferLater

from gorge.webhook.hooklock import lock_name
from tests.webhook.test_processes import Daemon, _object_of, namespace_db, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

__all__ = ["namespace_db"]  # the fixture, used by name

HOOKS = 3


def _serial(body: bytes) -> int:
    return int(_object_of(body).rsplit("-", 1)[1])


def _fill(herald, receiver, per_hook: int) -> list[str]:
    """``per_hook`` requests for each of HOOKS hooks, interleaved; the object
    PHID of request n carries n, so a POST says which request it is."""
    hooks = [herald.insert_hook(uri=f"{receiver.base}/hook{i}") for i in range(HOOKS)]
    for n in range(HOOKS * per_hook):
        herald.insert_request(hook=hooks[n % HOOKS], object_phid=f"PHID-TASK-{n:020d}")
    return hooks


def _per_hook_order(receiver) -> dict[str, list[int]]:
    """Each hook's POSTs in arrival order, a repeat of the same request right
    after itself (the row of a replica that died mid-POST) counted once."""
    order: dict[str, list[int]] = {}
    for got in receiver.requests:
        line = order.setdefault(got.path, [])
        serial = _serial(got.body)
        if not line or line[-1] != serial:
            line.append(serial)
    return order


def _pid_with_local_port(port: int, pids: list[int]) -> int | None:
    """Which of ``pids`` owns the TCP socket bound to 127.0.0.1:``port``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        for fd in os.listdir(fd_dir):
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return pid
    return None


def _assert_one_at_a_time_in_order(receiver, per_hook: int) -> None:
    assert receiver.peak_per_path == 1, "two POSTs to one hook were in flight at once"
    order = _per_hook_order(receiver)
    assert len(order) == HOOKS
    for hook, serials in order.items():
        expected = sorted(n for n in range(HOOKS * per_hook) if f"/hook{n % HOOKS}" == hook)
        assert serials == expected, f"{hook}: {serials}"


async def test_three_replicas_post_one_at_a_time_per_hook_in_id_order_to_a_slow_receiver(
    mariadb, namespace_db, receiver, tmp_path
):
    namespace, herald = namespace_db
    receiver.delay = 0.1  # each POST spans a poll interval of every replica
    per_hook = 20
    _fill(herald, receiver, per_hook)
    # One slot each: a replica holds one hook at a time, so all three take turns.
    daemons = [
        Daemon(mariadb, namespace, tmp_path / f"d{i}.log", GORGE_WEBHOOK_MAX_CONCURRENT="1")
        for i in range(3)
    ]
    try:
        await wait_for(
            lambda: herald.status_counts() == {"sent": HOOKS * per_hook}, 120, daemons=daemons
        )
        await deferLater(reactor, 0.5)  # a few more polls: nothing may be sent again
        for daemon in daemons:
            await daemon.terminate()
    finally:
        for daemon in daemons:
            daemon.kill()
    assert receiver.count() == HOOKS * per_hook
    _assert_one_at_a_time_in_order(receiver, per_hook)
    # More than one replica did the work.
    assert sum(1 for d in daemons if "WEBHOOK_DELIVERED" in d.log_text()) >= 2


async def test_a_replica_killed_mid_post_holds_its_hook_back_until_its_row_goes_again(
    mariadb, namespace_db, receiver, tmp_path
):
    namespace, herald = namespace_db
    receiver.delay = 0.3
    per_hook = 12
    _fill(herald, receiver, per_hook)
    short_lease = {"GORGE_WEBHOOK_DELIVERY_TIMEOUT": "2", "GORGE_WEBHOOK_CLAIM_LEASE_SEC": "4"}
    daemons = [Daemon(mariadb, namespace, tmp_path / f"d{i}.log", **short_lease) for i in range(3)]
    try:
        await wait_for(
            lambda: receiver.count() >= 4 and any(not r.answered for r in receiver.requests),
            60,
            daemons=daemons,
        )
        in_flight = next(r for r in receiver.requests if not r.answered)
        pids = [d.proc.pid for d in daemons]
        sender = _pid_with_local_port(in_flight.peer_port, pids)
        assert sender is not None, "no replica owns the connection of the POST in flight"
        victim = next(d for d in daemons if d.proc.pid == sender)
        # Every POST the victim has in flight (one per hook at most) is cut off.
        cut_off = {
            _serial(r.body)
            for r in receiver.requests
            if not r.answered and _pid_with_local_port(r.peer_port, pids) == sender
        }
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        alive = [d for d in daemons if d is not victim]
        await wait_for(
            lambda: herald.status_counts() == {"sent": HOOKS * per_hook}, 120, daemons=alive
        )
        await deferLater(reactor, 0.5)
        for daemon in alive:
            await daemon.terminate()
    finally:
        for daemon in daemons:
            daemon.kill()
    _assert_one_at_a_time_in_order(receiver, per_hook)
    posts = Counter(_serial(r.body) for r in receiver.requests)
    # The killed replica's requests went again after their lease, every other one once.
    assert in_flight and _serial(in_flight.body) in cut_off
    assert posts == {n: 2 if n in cut_off else 1 for n in range(HOOKS * per_hook)}


async def test_phorges_lock_on_a_hook_keeps_every_replica_off_it(
    mariadb, namespace_db, receiver, tmp_path
):
    """A Phorge worker posting to a hook holds GET_LOCK under the name Phorge
    derives; while it does, no replica posts to that hook (the others go on)."""
    namespace, herald = namespace_db
    busy, free = (herald.insert_hook(uri=f"{receiver.base}/{name}") for name in ("busy", "free"))
    worker = mariadb.connect(herald.name)  # the Phorge worker's own lock session
    try:
        with worker.cursor() as cur:
            cur.execute("SELECT GET_LOCK(%s, 0)", (lock_name(namespace, busy),))
            assert cur.fetchone() == (1,)
        held = herald.insert_request(hook=busy, object_phid="PHID-TASK-00000000000000000000")
        herald.insert_request(hook=free, object_phid="PHID-TASK-00000000000000000001")
        daemons = [Daemon(mariadb, namespace, tmp_path / f"d{i}.log") for i in range(3)]
        try:
            await wait_for(lambda: receiver.count("/free") == 1, 60, daemons=daemons)
            await deferLater(reactor, 1.0)  # ten polls of every replica
            assert receiver.count("/busy") == 0
            assert herald.request(held)["status"] == "queued"
            with worker.cursor() as cur:
                cur.execute("SELECT RELEASE_LOCK(%s)", (lock_name(namespace, busy),))
            await wait_for(lambda: receiver.count("/busy") == 1, 60, daemons=daemons)
            await wait_for(lambda: herald.request(held)["status"] == "sent", 60, daemons=daemons)
            for daemon in daemons:
                await daemon.terminate()
        finally:
            for daemon in daemons:
                daemon.kill()
    finally:
        worker.close()


def _follow_writes(daemon) -> float:
    """How many results this replica wrote with the hook's next row waiting on
    them (the few-hooks cycle: the result and the next row's claim)."""
    match = re.search(
        rb'gorge_webhook_write_seconds_count\{next_waits="yes"\} ([0-9.e+]+)', daemon.metrics
    )
    assert match, "no gorge_webhook_write_seconds series on /metrics"
    return float(match.group(1))


async def test_three_replicas_on_two_hot_hooks_keep_one_post_per_hook_in_id_order(
    mariadb, namespace_db, receiver, tmp_path
):
    # More slots than hooks on every replica: each keeps to a hook, claiming
    # its next row while the current POST runs and writing the result and the
    # next claim in one go (docs/webhook.md, "Claiming and writing back").
    namespace, herald = namespace_db
    receiver.delay = 0.005  # long enough for two POSTs to one hook to overlap
    hooks = [herald.insert_hook(uri=f"{receiver.base}/hook{i}") for i in range(2)]
    per_hook = 60
    for n in range(2 * per_hook):
        herald.insert_request(hook=hooks[n % 2], object_phid=f"PHID-TASK-{n:020d}")
    daemons = [Daemon(mariadb, namespace, tmp_path / f"d{i}.log") for i in range(3)]
    try:
        await wait_for(
            lambda: herald.status_counts() == {"sent": 2 * per_hook}, 120, daemons=daemons
        )
        for daemon in daemons:
            port = int(re.search(r"starting on (\d+)", daemon.log_text()).group(1))
            response = await treq.get(f"http://127.0.0.1:{port}/metrics", persistent=False)
            daemon.metrics = await response.content()
        for daemon in daemons:
            await daemon.terminate()
    finally:
        for daemon in daemons:
            daemon.kill()
    assert receiver.peak_per_path == 1, "two POSTs to one hook were in flight at once"
    order = _per_hook_order(receiver)
    for i in range(2):
        assert order[f"/hook{i}"] == list(range(i, 2 * per_hook, 2))
    assert receiver.count() == 2 * per_hook  # none twice
    assert sum(_follow_writes(d) for d in daemons) > 0, "the hot-hook cycle never ran"
