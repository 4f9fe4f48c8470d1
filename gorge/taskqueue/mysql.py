"""The MySQL backend: Phorge's own ``{namespace}_worker`` tables."""

from __future__ import annotations

from typing import Any

from twisted.enterprise import adbapi
from twisted.internet.interfaces import IReactorTime

from gorge import mysql
from gorge.config import MySQLSettings
from gorge.taskqueue.model import COUNTER_NAME
from gorge.taskqueue.sqlstore import Dialect, SqlTaskStore

# LiskDAO::loadNextCounterValue: both branches publish the value through
# LAST_INSERT_ID(expr), so the insert id is exactly this call's counter value.
NEXT_COUNTER = (
    "INSERT INTO lisk_counter (counterName, counterValue) VALUES (%s, LAST_INSERT_ID(1))"
    " ON DUPLICATE KEY UPDATE counterValue = LAST_INSERT_ID(counterValue + 1)"
)

# The same counter, advanced by a whole batch: the insert id is the last id.
RESERVE_COUNTER = (
    "INSERT INTO lisk_counter (counterName, counterValue) VALUES (%s, LAST_INSERT_ID(%s))"
    " ON DUPLICATE KEY UPDATE counterValue = LAST_INSERT_ID(counterValue + %s)"
)
SET_COUNTER = (
    "INSERT INTO lisk_counter (counterName, counterValue) VALUES (%s, %s)"
    " ON DUPLICATE KEY UPDATE counterValue = %s"
)

# Lease re-selects after losing candidates to a concurrent claimer must see
# that claimer's commit, which REPEATABLE READ's snapshot would hide.
LEASE_ISOLATION = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"

_DEADLOCK = 1213
_LOCK_WAIT_TIMEOUT = 1205


class MySQLDialect(Dialect):
    name = "mysql"
    lock = " FOR UPDATE"

    def begin_lease(self, txn) -> None:
        txn.execute(LEASE_ISOLATION)

    def next_task_id(self, txn) -> int:
        txn.execute(NEXT_COUNTER, (COUNTER_NAME,))
        return int(txn.lastrowid)

    def reserve_task_ids(self, txn, count: int) -> int:
        txn.execute(RESERVE_COUNTER, (COUNTER_NAME, count, count))
        return int(txn.lastrowid) - count + 1

    def set_counter(self, txn, name: str, value: int) -> None:
        txn.execute(SET_COUNTER, (name, value, value))

    def is_retryable(self, exc: BaseException) -> bool:
        args: tuple[Any, ...] = getattr(exc, "args", ())
        return bool(args) and args[0] in (_DEADLOCK, _LOCK_WAIT_TIMEOUT)

    async def ping(self, pool: adbapi.ConnectionPool, clock: IReactorTime) -> str | None:
        reason = await mysql.ping(pool, clock, timeout=5)
        return None if reason is None else f"ping database: {reason}"


class MySQLTaskStore(SqlTaskStore):
    def __init__(self, pool: adbapi.ConnectionPool, clock: IReactorTime) -> None:
        super().__init__(pool, clock, MySQLDialect())

    @classmethod
    def from_settings(cls, settings: MySQLSettings, reactor, clock: IReactorTime | None = None):
        return cls(mysql.make_pool(settings, reactor), clock if clock is not None else reactor)
