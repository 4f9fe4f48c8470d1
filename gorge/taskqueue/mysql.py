"""The MySQL backend: Phorge's own ``{namespace}_worker`` tables."""

from __future__ import annotations

from twisted.enterprise import adbapi
from twisted.internet.interfaces import IReactorTime

from gorge.config import MySQLSettings
from gorge.sql import Database, MySQLEngine
from gorge.taskqueue.sqlstore import DATABASE_NAME, SqlTaskStore


class MySQLTaskStore(SqlTaskStore):
    """``clock`` gives "now"; ``reactor`` (default: ``clock``) bounds each transaction."""

    def __init__(self, pool: adbapi.ConnectionPool, clock: IReactorTime, *,
                 reactor: IReactorTime | None = None) -> None:
        super().__init__(Database(MySQLEngine(), pool, reactor if reactor is not None else clock,
                                  name=DATABASE_NAME), clock)

    @classmethod
    def from_settings(cls, settings: MySQLSettings, reactor, clock: IReactorTime | None = None):
        return cls(MySQLEngine().make_pool(settings, reactor),
                   clock if clock is not None else reactor, reactor=reactor)
