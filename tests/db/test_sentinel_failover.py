"""gorge.db.redis through Redis Sentinel, against real servers: a master, its
replica and one sentinel (redis-server in sentinel mode), all throwaway.
A forced failover (SENTINEL FAILOVER) while writes go on: the pool follows
the new master, and nothing acknowledged before the switch is lost."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater

from gorge.db.redis import RedisSettings, make_redis, ping
from gorge_testing.redis_server import RedisServer

pytestmark = pytest.mark.integration

SERVICE = "gorgeq"


class ReplicaServer(RedisServer):
    def __init__(self, master: RedisServer) -> None:
        super().__init__()
        self._master = master

    def _argv(self, log_path: Path) -> list[str]:
        return [*super()._argv(log_path), "--replicaof", self._master.host, str(self._master.port)]


class SentinelServer(RedisServer):
    def __init__(self, master: RedisServer) -> None:
        super().__init__()
        self._master = master

    def _argv(self, log_path: Path) -> list[str]:
        # Sentinel rewrites its configuration file: one of its own per start.
        config = self._dir / f"sentinel-{log_path.stem}.conf"
        config.write_text(
            f"port {self.port}\nbind {self.host}\ndir {self._dir}\n"
            f"sentinel monitor {SERVICE} {self._master.host} {self._master.port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
        )
        return [self._binary, str(config), "--sentinel"]


@pytest.fixture
def sentinel_set() -> Iterator[tuple[RedisServer, RedisServer, SentinelServer]]:
    started: list[RedisServer] = []
    try:
        master = RedisServer()
        master.start()
        started.append(master)
        replica = ReplicaServer(master)
        replica.start()
        started.append(replica)
        sentinel = SentinelServer(master)
        sentinel.start()
        started.append(sentinel)
        yield master, replica, sentinel
    finally:
        for server in reversed(started):
            server.stop()


def _master_port(sentinel: SentinelServer) -> int:
    with sentinel.client() as client:
        return int(client.execute("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)[1])


async def _until(condition, what: str, bound: float = 30.0) -> None:
    """A condition checked every 0.1 s, failing the test after ``bound`` seconds."""
    for _ in range(int(bound * 10)):
        if condition():
            return
        await deferLater(reactor, 0.1)
    raise AssertionError(f"{what} within {bound} s")


def _role(server: RedisServer) -> bytes:
    with server.client() as client:
        return client.execute("ROLE")[0]


def _replica_knows_sentinel(replica: RedisServer, sentinel: SentinelServer) -> bool:
    with sentinel.client() as client:
        replicas = client.execute("SENTINEL", "REPLICAS", SERVICE)
    with replica.client() as client:
        synced = b"master_link_status:up" in client.execute("INFO", "replication")
    return synced and bool(replicas)


@pytest_twisted.ensureDeferred
async def test_pool_follows_the_new_master_and_keeps_acknowledged_writes(sentinel_set):
    master, replica, sentinel = sentinel_set
    await _until(lambda: _replica_knows_sentinel(replica, sentinel), "replica seen by sentinel")
    settings = RedisSettings(
        sentinels=((sentinel.host, sentinel.port),), sentinel_service=SERVICE, poolsize=2
    )
    conn = make_redis(settings, reactor)
    try:
        assert await ping(conn, reactor, 10) is None
        for n in range(20):
            await conn.rpush("gorge:acked", str(n))
        # Acknowledged by the replica too (what min-replicas-to-write asks for).
        assert await conn.execute_command("WAIT", 1, 5000) == 1

        with sentinel.client() as client:
            assert client.execute("SENTINEL", "FAILOVER", SERVICE) == "OK"
        await _until(lambda: _master_port(sentinel) == replica.port, "failover")
        # Writes acknowledged by the old master in the instant before Sentinel
        # turns it into a replica are lost (Redis replicates asynchronously):
        # the test writes once it has been turned.
        await _until(lambda: _role(master) == b"slave", "old master reconfigured")

        # Writes go on: the first ones may meet the old master, then the new one.
        written = []
        for n in range(20, 60):
            for _ in range(100):
                try:
                    await conn.rpush("gorge:acked", str(n))
                except Exception:
                    await deferLater(reactor, 0.1)
                    continue
                written.append(n)
                break
        assert written == list(range(20, 60))
        with replica.client() as client:
            assert b"role:master" in client.execute("INFO", "replication")
            stored = client.execute("LRANGE", "gorge:acked", 0, -1)
        assert stored == [str(n).encode() for n in range(60)]
    finally:
        await conn.disconnect()
