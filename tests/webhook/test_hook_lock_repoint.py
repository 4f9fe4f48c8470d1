"""The per-hook lock sessions follow a master change (HookLocks.repoint): a
lock parked on the old master is let go, idle sessions close, and the next
lock is taken with the new settings. The "new master" here is the same
MariaDB reached as another account, which the lock's session shows."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import reactor

from gorge.webhook.hooklock import HookLocks, lock_name
from tests.db.readonly import USER, plain_user

pytestmark = pytest.mark.integration


def holder(mariadb, name: str) -> str | None:
    """The account of the session holding lock ``name``, or None."""
    conn = mariadb.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT USER FROM information_schema.PROCESSLIST WHERE ID = IS_USED_LOCK(%s)",
                (name,),
            )
            row = cur.fetchone()
        return None if row is None else row[0]
    finally:
        conn.close()


@pytest_twisted.ensureDeferred
async def test_locks_move_to_the_new_master(mariadb, herald_db):
    old = mariadb.settings(herald_db)
    with plain_user(mariadb, herald_db) as new:
        locks = HookLocks(old, "ns", reactor, park_for=60.0)
        try:
            first, second = "PHID-HWBH-repoint00000000001", "PHID-HWBH-repoint00000000002"
            assert await locks.acquire(first)
            assert holder(mariadb, lock_name("ns", first)) == mariadb.user
            assert locks.release(first) is None  # parked, still held
            assert holder(mariadb, lock_name("ns", first)) == mariadb.user

            await locks.repoint(new)
            assert holder(mariadb, lock_name("ns", first)) is None
            assert not locks.holds(first)

            assert await locks.acquire(second)
            assert holder(mariadb, lock_name("ns", second)) == USER
        finally:
            locks.close()
