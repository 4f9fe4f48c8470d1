"""The MySQL backend: Phorge's own ``{namespace}_worker`` tables."""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime

from gorge.config import MySQLSettings
from gorge.db import Engine, MySQLEngine
from gorge.taskqueue.sqlstore import SqlTaskStore


class MySQLTaskStore(SqlTaskStore):
    @staticmethod
    def new_engine() -> Engine:
        return MySQLEngine()

    @classmethod
    def from_settings(cls, settings: MySQLSettings, reactor, clock: IReactorTime | None = None):
        return cls(
            MySQLEngine().make_pool(settings, reactor),
            clock if clock is not None else reactor,
            reactor=reactor,
        )
