"""Cluster-readiness of the Redis store: every key one script touches lies in
one hash slot, proven by watching the real server
with MONITOR and computing the slots here (CRC16/XMODEM mod 16384)."""

from __future__ import annotations

import re
import socket
from dataclasses import replace

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet import task

from gorge.config import ConfigError
from gorge.db.clock import HostTime
from gorge.db.redis import RedisSettings, make_redis
from gorge.taskqueue.model import EnqueueRequest
from gorge.taskqueue.redis import RedisTaskStore, make_redis_task_store
from gorge.taskqueue.redis_layout import Keys, hash_tag, key_base

T0 = 1_700_000_000


def crc16(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def slot(key: str) -> int:
    """Redis Cluster's HASH_SLOT, hash tags included."""
    tag = hash_tag(key)
    return crc16((tag if tag is not None else key).encode()) % 16384


def test_slot_function_matches_published_values():
    assert crc16(b"123456789") == 0x31C3
    assert slot("foo") == 12182
    assert slot("{user1000}.following") == slot("{user1000}.followers")
    assert slot("foo{}{bar}") == slot("foo{}{bar}") != slot("bar")  # empty tag: whole key


def test_prefix_is_used_verbatim_like_the_reference():
    assert Keys("gorge:tq:").task(17) == "gorge:tq:task:17"
    assert Keys("gorge:tq:").active == "gorge:tq:idx:active"
    assert Keys("{gorge:tq}:").task(17) == "{gorge:tq}:task:17"
    assert Keys("{gorge:tq}:").active == "{gorge:tq}:idx:active"


@pytest.mark.parametrize("prefix", ["{}:", "a{b:", "x{}y{z}:"])
def test_prefix_with_a_broken_tag_is_a_config_error(prefix):
    with pytest.raises(ValueError):
        key_base(prefix)
    with pytest.raises(ConfigError) as e:
        make_redis_task_store(RedisSettings(), None, key_prefix=prefix)
    assert e.value.setting == "GORGE_TASKQUEUE_REDIS_KEY_PREFIX"


@given(
    prefix=st.text(alphabet=st.sampled_from("ab:{}"), max_size=8),
    ids=st.lists(st.integers(min_value=1, max_value=2**40), min_size=1, max_size=5),
)
def test_every_key_of_one_queue_shares_one_slot(prefix, ids):
    try:
        keys = Keys(prefix)
    except ValueError:
        return
    if hash_tag(prefix) is None:
        return  # an untagged prefix is for a single instance
    names = [
        keys.active,
        keys.unleased,
        keys.leased,
        keys.archived_idx,
        keys.next_task_id,
        keys.next_data_id,
        keys.counter_archived,
        keys.counter_failed,
    ]
    for i in ids:
        names += [keys.task(i), keys.data(i), keys.archived(i)]
    assert all(n.startswith(prefix) for n in names)
    assert len({slot(n) for n in names}) == 1


# Commands the store (or its scripts) may send, and which arguments are keys.
_FIRST_ARG_IS_KEY = {
    "GET",
    "SET",
    "DEL",
    "EXISTS",
    "INCR",
    "DECR",
    "DECRBY",
    "HSET",
    "HGET",
    "HMGET",
    "HGETALL",
    "ZADD",
    "ZREM",
    "ZRANGE",
    "ZRANGEBYSCORE",
    "ZREVRANGE",
    "ZCARD",
    "ZSCORE",
}
_ARG = re.compile(r'"((?:\\.|[^"\\])*)"')


def _unescape(text: str) -> str:
    return re.sub(
        r"\\x([0-9a-f]{2})|\\(.)",
        lambda m: chr(int(m.group(1), 16)) if m.group(1) else m.group(2),
        text,
    )


def _keys_of(args: list[str]) -> list[str]:
    name = args[0].upper()
    if name in ("EVALSHA", "EVAL"):
        return args[3 : 3 + int(args[2])]
    if name in _FIRST_ARG_IS_KEY:
        return [args[1]]
    raise AssertionError(f"unexpected command {name}")


class Monitor:
    """A raw MONITOR connection; the buffered feed is read after the workload."""

    def __init__(self, host: str, port: int) -> None:
        self._sock = socket.create_connection((host, port), timeout=10)
        self._file = self._sock.makefile("rb")
        self._sock.sendall(b"MONITOR\r\n")
        assert self._file.readline() == b"+OK\r\n"

    def commands_until(self, marker: str) -> list[tuple[str, list[str]]]:
        out = []
        while True:
            line = self._file.readline().decode()
            assert line.startswith("+"), line
            source = line.split("[", 1)[1].split("]", 1)[0].split(" ", 1)[1]
            args = [_unescape(a) for a in _ARG.findall(line)]
            if args == ["ECHO", marker]:
                return out
            out.append(("lua" if source == "lua" else "client", args))

    def close(self) -> None:
        self._file.close()
        self._sock.close()


@pytest.mark.integration
@pytest.mark.parametrize("tagged", [False, True], ids=["default-prefix", "tagged-prefix"])
@pytest_twisted.ensureDeferred
async def test_every_key_a_script_touches_hashes_to_one_slot(redis_server, tagged):
    prefix = redis_server.unique_prefix("{tq" if tagged else "tq")
    prefix = prefix.replace(":", "}:") if tagged else prefix
    clock = task.Clock()
    clock.advance(T0)
    conn = make_redis(replace(redis_server.settings(), poolsize=1))
    store = RedisTaskStore(
        conn, clock=clock, time=HostTime(clock), key_prefix=prefix, archive_retention=10
    )
    monitor = Monitor(redis_server.host, redis_server.port)
    try:
        a = await store.enqueue(EnqueueRequest("A", data="x", priority=1000))
        b = await store.enqueue(EnqueueRequest("B", delay_until=T0 + 5))
        c = await store.enqueue(EnqueueRequest("A"))
        await store.lease("w", 1, 60)
        await store.lease("w", 5, 60, task_classes=["A"])
        clock.advance(100)
        await store.lease("w", 5, 60)  # phase 2
        await store.fail(a.id, False, 10)
        await store.yield_(c.id, 30)
        await store.awaken([c.id, a.id, 999])
        await store.stats()
        await store.list_tasks(10, 0)
        await store.get_task(b.id)
        await store.complete(b.id, 5)
        await store.complete(b.id, 5)  # replay
        await store.cancel(c.id)
        clock.advance(20)
        await store.fail(a.id, True, 0)  # prunes the two older archive records
        await store.get_archived(a.id)
        d = await store.enqueue(EnqueueRequest("D", data="d"))
        await store.set_priority(d.id, 7)
        await store.delay(d.id, int(clock.seconds()) - 1)
        await store.lease("w", 1, 60, task_classes=["D"])
        await store.renew("w", [d.id, 999], 30)
        await store.free(d.id)
        await store.fail(d.id, True, 0)
        await store.list_archived(1, "D", 10, 0)
        await store.requeue(d.id)
        await store.retry(d.id, False)
        moved = await store.export_tasks(await store.active_ids())
        await store.import_tasks(moved, "gorge-migrate-from-x", 9)
        await store.migration_mark("gorge-migrate-from-x")
        await store.delete_tasks(moved)
        await store.clear_migration_mark("gorge-migrate-from-x")
        with redis_server.client() as sync:
            sync.execute("ECHO", "end-of-workload")
        seen = monitor.commands_until("end-of-workload")
    finally:
        monitor.close()
        await conn.disconnect()
    scripts = [args for source, args in seen if args[0] in ("EVALSHA", "EVAL")]
    assert len(scripts) >= 16  # EVAL retries after NOSCRIPT come on top
    assert all(int(args[2]) >= 1 for args in scripts)  # a Cluster routes by KEYS
    touched = [
        key
        for source, args in seen
        if source == "lua" or args[0] in ("EVALSHA", "EVAL", "HMGET")
        for key in _keys_of(args)
    ]
    assert any(k.startswith(store.keys.base + "data:") for k in touched)
    assert any(source == "lua" and args[0].upper() == "DECRBY" for source, args in seen)
    assert all(k.startswith(store.keys.base) for k in touched), touched
    if tagged:
        assert {slot(k) for k in touched} == {slot(store.keys.active)}
