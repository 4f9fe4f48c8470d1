"""The herald tables in one database, and what this process knows of them.

Three parts share one :class:`~gorge.webhook.queueview.QueueView`:
:mod:`~gorge.webhook.observation` keeps it current and answers the reads of
the breaker and the API, :mod:`~gorge.webhook.claims` runs the statements
that decide who may act on a row (candidates, claims, result writes,
Retry-After holds), :mod:`~gorge.webhook.history` reads the delivery log
back and replays from it.

The SQL is written once, in MySQL's spelling; the engine (gorge/db/engine.py)
adapts it to SQLite for the demo, and every read or write runs through
:meth:`gorge.db.database.Database.run`, named after what it does.
"""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime

from gorge.config import MySQLSettings
from gorge.db import Database
from gorge.webhook.claims import Claims
from gorge.webhook.history import History
from gorge.webhook.observation import Observation
from gorge.webhook.queueview import QueueView

DATABASE_NAME = "webhook"  # prefixes the transactions' log events: WEBHOOK_TXN_RETRY


class WebhookStore:
    """One database, one queue view, and the three parts that work on them."""

    def __init__(self, db: Database, *, view: QueueView | None = None) -> None:
        self.db = db
        self.view = view if view is not None else QueueView()
        self.observation = Observation(db, self.view)
        self.claims = Claims(db, self.observation)
        self.history = History(db, self.observation)

    @classmethod
    def mysql(
        cls, settings: MySQLSettings, reactor, *, db_clock: IReactorTime | None = None
    ) -> WebhookStore:
        # Every statement stands alone: autocommit, no COMMIT round trips.
        return cls(
            Database.mysql(
                settings, reactor, name=DATABASE_NAME, autocommit=True, db_clock=db_clock
            )
        )

    @classmethod
    def sqlite(
        cls, path: str, reactor, *, schema: str, db_clock: IReactorTime | None = None
    ) -> WebhookStore:
        """The embedded store (the demo's). ``schema`` creates the herald tables on
        first use: Phorge's DDL, which the demo brings (gorge/demo/herald_schema.py)."""
        return cls(
            Database.sqlite(path, reactor, name=DATABASE_NAME, schema=schema, db_clock=db_clock)
        )

    async def ping(self) -> str | None:
        """None when the database answers, else a short reason for ``/readyz``."""
        return await self.db.ping()

    def close(self) -> None:
        self.db.close()
