"""The per-hook lock's sessions on a real MariaDB: a holder that goes silent
(a host lost without closing its connections) lets its locks go after the
session timeout instead of the server's 8 hours; a live holder keeps its
sessions alive; a session the server closed is a lost lock, said once, and
taken again by the hook's next row."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock, deferLater

from gorge.webhook.hooklock import HookLocks, lock_name
from tests.support.logcapture import logged_events

pytestmark = pytest.mark.integration

HOOK = "PHID-HWBH-sessions000000000001"


def _one(mariadb, sql: str, params: tuple = ()):
    conn = mariadb.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            row = cur.fetchone()
        return None if row is None else row[0]
    finally:
        conn.close()


def holder_id(mariadb, name: str) -> int | None:
    return _one(mariadb, "SELECT IS_USED_LOCK(%s)", (name,))


def idle_ms(mariadb, session: int) -> float:
    return float(
        _one(
            mariadb, "SELECT TIME_MS FROM information_schema.PROCESSLIST WHERE ID = %s", (session,)
        )
    )


async def until(condition, what: str, bound: float = 20.0) -> None:
    for _ in range(int(bound * 20)):
        if condition():
            return
        await deferLater(reactor, 0.05)
    raise AssertionError(f"{what} within {bound} s")


@pytest_twisted.ensureDeferred
async def test_a_silent_holder_lets_its_lock_go_after_the_session_timeout(mariadb, herald_db):
    # The keepalive runs on a clock nobody moves: the holder says nothing, as
    # a host that lost its power or network.
    locks = HookLocks(mariadb.settings(herald_db), "ns", reactor, clock=Clock(), session_timeout=1)
    try:
        assert await locks.acquire(HOOK)
        name = lock_name("ns", HOOK)
        assert holder_id(mariadb, name) is not None
        await until(lambda: holder_id(mariadb, name) is None, "the server freed the lock")
    finally:
        locks.close()


@pytest_twisted.ensureDeferred
async def test_a_live_holder_keeps_its_session_and_a_closed_one_is_a_lost_lock(mariadb, herald_db):
    clock = Clock()
    locks = HookLocks(mariadb.settings(herald_db), "ns", reactor, clock=clock, session_timeout=30)
    try:
        assert await locks.acquire(HOOK)
        name = lock_name("ns", HOOK)
        session = holder_id(mariadb, name)
        await until(lambda: idle_ms(mariadb, session) >= 300, "the session idle a while")
        clock.advance(10)  # a third of the timeout: each holder says something
        await locks.settled()
        await until(lambda: idle_ms(mariadb, session) < 300, "the holder's session said something")
        assert holder_id(mariadb, name) == session and locks.holds(HOOK)

        _one(mariadb, f"KILL {int(session)}")  # the server closes the session
        with logged_events() as events:
            clock.advance(10)
            await locks.settled()
            assert not locks.holds(HOOK)
            clock.advance(10)  # the next ping has nothing to say of it
            await locks.settled()
        names = [str(e.get("log_format", "")).split(" ")[0] for e in events]
        assert names.count("WEBHOOK_HOOK_LOCK_LOST") == 1

        assert await locks.acquire(HOOK)  # the hook's next row: a new session
        assert holder_id(mariadb, name) not in (None, session)
    finally:
        locks.close()
