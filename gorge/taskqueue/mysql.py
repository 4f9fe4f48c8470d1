"""The MySQL backend: Phorge's own ``{namespace}_worker`` tables."""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime

from gorge.config import MySQLSettings
from gorge.db import Engine, MySQLEngine
from gorge.db.clock import DatabaseClock, StoreTime
from gorge.taskqueue.sqlstore import SqlTaskStore


class MySQLTaskStore(SqlTaskStore):
    @staticmethod
    def new_engine(clock: IReactorTime | None = None) -> Engine:
        return MySQLEngine(clock=clock)

    def default_time(self, clock: IReactorTime, db_clock: IReactorTime | None) -> StoreTime:
        # The database's clock, as Phorge's UNIX_TIMESTAMP(): every host
        # sharing the tables (replicas, Phorge's bin/worker) agrees on which
        # lease has expired, whatever its own clock says. Sampled, not read
        # per statement, so no call pays a round trip for it (gorge/db/clock.py).
        if db_clock is None:
            return DatabaseClock(self.db)
        return DatabaseClock(self.db, elapsed=db_clock.seconds)

    @classmethod
    def from_settings(
        cls,
        settings: MySQLSettings,
        reactor,
        clock: IReactorTime | None = None,
        *,
        db_clock: IReactorTime | None = None,
    ):
        return cls(
            MySQLEngine().make_pool(settings, reactor),
            clock if clock is not None else reactor,
            reactor=reactor,
            db_clock=db_clock,
        )
