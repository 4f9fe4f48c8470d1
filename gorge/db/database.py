"""One database of a service: its engine, its adbapi pool, and how a transaction runs.

Every transaction of a store goes through :meth:`Database.run` with a short
description that names it ("lease", "claim", "poll") in the retry log line
and in the ``gorge_sql_*`` metrics (docs/operations.md, "SQL transactions"):

* it runs in a pool thread and commits when the function returns (rolled
  back if it raises);
* the engine's retryable errors (a MySQL deadlock or lock wait timeout, a
  locked SQLite file) run the whole transaction again at once, up to
  ``ATTEMPTS`` times in all; anything else is the caller's to handle;
* one deadline covers all attempts, waiting for a pool thread included.
  When it passes the caller gets :class:`TransactionTimeout`; the thread
  finishes the statement it is in (the drivers bound each one) and its
  result is dropped. The deadlines share one reactor timer (a transaction
  costs a dictionary entry, not a timer of its own).

A server that refuses writes (a demoted master: ``read_only``, errors
1290/1836) makes the transaction fail with :class:`DatabaseReadOnly` at
once, marks the database not :attr:`Database.writable` and logs
``<NAME>_DB_READ_ONLY`` once; from then on the database is asked every
``HEALTH_INTERVAL`` seconds whether it takes writes again, and the first
yes logs ``<NAME>_DB_WRITABLE`` once and stops asking. ``/readyz``'s ping
asks the same question, so a daemon is unready while its master is
read-only, whoever noticed first."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from twisted.enterprise import adbapi
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.defer import TimeoutError as DeferredTimeoutError
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import LoopingCall

from gorge.config import MySQLSettings
from gorge.db.engine import READ_ONLY_REASON, Engine, MySQLEngine, SQLiteEngine, Txn
from gorge.log.logger import Logger

__all__ = [
    "ATTEMPTS",
    "DEADLINE",
    "HEALTH_INTERVAL",
    "Database",
    "DatabaseReadOnly",
    "TransactionTimeout",
    "Transactions",
]

log = Logger()

# Above pymysql's 30 s read/write timeouts, so a hung statement is normally
# reported by the driver first, with its own error.
DEADLINE = 35.0
ATTEMPTS = 3
PING_TIMEOUT = 5.0
# How often a read-only database is asked whether it takes writes again
# (Phorge's own health checks run every few seconds too).
HEALTH_INTERVAL = 5.0

T = TypeVar("T")


class TransactionTimeout(DeferredTimeoutError):
    """The transaction did not finish within the deadline."""

    def __init__(self, description: str, seconds: float) -> None:
        super().__init__(f"transaction {description!r} did not finish within {seconds:g} s")
        self.description = description


class DatabaseReadOnly(Exception):
    """The database refused a write because it takes none now (a demoted or
    fenced master). Keeps the server's error code and message as its args, so
    the error-code helpers read it as they read the driver's error."""

    def __init__(self, description: str, error: BaseException) -> None:
        super().__init__(*getattr(error, "args", ()))
        self.description = description

    def __str__(self) -> str:
        return f"transaction {self.description!r}: {READ_ONLY_REASON}"


@dataclass
class Transactions:
    """What one description's transactions did, for the metrics."""

    ok: int = 0
    failed: int = 0
    timed_out: int = 0
    retries: int = 0
    seconds: float = 0.0

    @property
    def count(self) -> int:
        return self.ok + self.failed + self.timed_out


def _pinned(engine: Engine, seconds: float, fn: Callable[..., T]) -> Callable[..., T]:
    def interaction(txn: Txn, *args: Any) -> T:
        engine.pin_clock(txn, seconds)
        return fn(txn, *args)

    return interaction


async def _nothing() -> None:
    return None


class _Deadlines:
    """Attempts in flight and when each must be answered, with one timer for the
    earliest; an attempt past its deadline is cancelled."""

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self._waiting: dict[Deferred, float] = {}
        self._timer: IDelayedCall | None = None

    def watch(self, d: Deferred, at: float) -> None:
        self._waiting[d] = at
        if self._timer is None:
            self._timer = self._clock.callLater(at - self._clock.seconds(), self._expire)
        elif at < self._timer.getTime():  # never later than the earliest deadline
            self._timer.reset(at - self._clock.seconds())

    def forget(self, d: Deferred) -> None:
        self._waiting.pop(d, None)

    def _expire(self) -> None:
        self._timer = None
        now = self._clock.seconds()
        for d, at in list(self._waiting.items()):
            if at <= now:
                del self._waiting[d]
                d.cancel()
        if self._waiting:
            earliest = min(self._waiting.values())
            self._timer = self._clock.callLater(earliest - now, self._expire)

    def stop(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None


class Database:
    """``name`` prefixes the retry log event (``TASKQUEUE_TXN_RETRY``).

    ``reactor`` bounds every transaction; the engine's ``clock``, when set,
    is what the database's own clock follows (:attr:`clock`).
    """

    def __init__(
        self,
        engine: Engine,
        pool: adbapi.ConnectionPool,
        reactor: IReactorTime,
        *,
        name: str,
        deadline: float = DEADLINE,
        attempts: int = ATTEMPTS,
        health_interval: float = HEALTH_INTERVAL,
    ) -> None:
        self.engine = engine
        self.pool = pool
        self.name = name
        self._reactor = reactor
        self._deadline = deadline
        self._deadlines = _Deadlines(reactor)
        self._attempts = attempts
        self._retry_event = name.upper() + "_TXN_RETRY txn={txn} attempt={attempt} error={error}"
        self._read_only_event = name.upper() + "_DB_READ_ONLY reason={reason} txn={txn}"
        self._writable_event = name.upper() + "_DB_WRITABLE after={after}"
        self._health_failed_event = name.upper() + "_DB_HEALTH_CHECK_FAILED"
        self.transactions: dict[str, Transactions] = {}
        self._health_interval = health_interval
        self._health: LoopingCall | None = None
        # Since when (reactor seconds) writes are refused; None while writable.
        self._read_only_since: float | None = None
        self._writable_waiters: list[Deferred[None]] = []
        self.connections_opened = 0
        opened: Callable[[Any], None] | None = getattr(pool, "openfun", None)

        def counted_open(connection: Any) -> None:
            # Counted for the database clock (gorge/db/clock.py): a new
            # connection, a reconnect above all, may reach another server.
            self.connections_opened += 1
            if opened is not None:
                opened(connection)

        pool.openfun = counted_open  # type: ignore[assignment]

    @classmethod
    def mysql(
        cls,
        settings: MySQLSettings,
        reactor: Any,
        *,
        name: str,
        autocommit: bool = False,
        db_clock: IReactorTime | None = None,
    ) -> Database:
        engine = MySQLEngine(autocommit=autocommit, clock=db_clock)
        return cls(engine, engine.make_pool(settings, reactor), reactor, name=name)

    @classmethod
    def sqlite(
        cls,
        path: str,
        reactor: Any,
        *,
        name: str,
        schema: str = "",
        prepare: Callable[[sqlite3.Connection], None] | None = None,
        db_clock: IReactorTime | None = None,
    ) -> Database:
        engine = SQLiteEngine(schema=schema, prepare=prepare, clock=db_clock)
        return cls(engine, engine.make_pool(path, reactor), reactor, name=name)

    @property
    def clock(self) -> IReactorTime:
        """The clock the database's ``UNIX_TIMESTAMP()`` follows."""
        return self.engine.clock if self.engine.clock is not None else self._reactor

    async def run(
        self, description: str, fn: Callable[..., T], *args: Any, bounded: bool = True
    ) -> T:
        """``fn(txn, *args)`` as one transaction; see the module doc.

        ``bounded=False`` leaves out the deadline, for the rare transaction
        whose length grows with a table (each statement is still bounded by
        the driver).
        """
        if not isinstance(description, str):
            raise TypeError(f"run() takes a description first, not {description!r}")
        reactor = self._reactor
        started = reactor.seconds()
        pin = self.engine.clock_pin()
        work = fn if pin is None else _pinned(self.engine, pin, fn)
        stats = self.transactions.get(description)
        if stats is None:
            stats = self.transactions[description] = Transactions()
        deadline = started + self._deadline
        attempt = 1
        try:
            while True:
                if bounded and reactor.seconds() >= deadline:
                    raise TransactionTimeout(description, self._deadline)
                d = self.pool.runInteraction(work, *args)
                if bounded:
                    self._deadlines.watch(d, deadline)
                try:
                    result = await d
                except CancelledError:
                    if bounded and reactor.seconds() >= deadline:
                        raise TransactionTimeout(description, self._deadline) from None
                    raise
                except Exception as e:
                    if self.engine.read_only(e):
                        self._went_read_only(description)
                        raise DatabaseReadOnly(description, e) from e
                    if attempt >= self._attempts or not self.engine.retryable(e):
                        raise
                    log.info(
                        self._retry_event, txn=description, attempt=attempt, error=type(e).__name__
                    )
                    stats.retries += 1
                    attempt += 1
                    continue
                finally:
                    if bounded:
                        self._deadlines.forget(d)
                stats.ok += 1
                return result
        except TransactionTimeout:
            stats.timed_out += 1
            raise
        except BaseException:
            stats.failed += 1
            raise
        finally:
            stats.seconds += reactor.seconds() - started

    def execute(self, txn: Txn, statement: str, params: Sequence[Any] = ()) -> None:
        """Run one statement written in MySQL's spelling (in a pool thread)."""
        self.engine.execute(txn, statement, params)

    @property
    def writable(self) -> bool:
        """False from a refused write (or a ping that found the server read-only)
        until the database is seen taking writes again. Loops that only write
        (claims, leases) skip their turn while it is False."""
        return self._read_only_since is None

    def when_writable(self) -> Deferred[None]:
        """Fires once the database is seen taking writes (at once if it is);
        bound the wait with ``addTimeout``, which also withdraws it."""
        if self.writable:
            return Deferred.fromCoroutine(_nothing())
        waiters = self._writable_waiters
        waiter: Deferred[None] = Deferred(lambda d: waiters.remove(d))
        waiters.append(waiter)
        return waiter

    async def ping(self, within: float = PING_TIMEOUT) -> str | None:
        """None when the database answers in time and takes writes, else a
        short reason for ``/readyz`` (``database read-only`` for a server that
        answers but refuses writes)."""
        reason = await self.engine.ping(self.pool, self._reactor, within)
        if reason is None:
            self._went_writable()
        elif reason == READ_ONLY_REASON:
            self._went_read_only("ping")
        return reason

    def _went_read_only(self, description: str) -> None:
        if self._read_only_since is not None:
            return
        self._read_only_since = self._reactor.seconds()
        log.warn(self._read_only_event, reason=READ_ONLY_REASON, txn=description)
        health = self._health = LoopingCall(self._check_health)
        health.clock = self._reactor
        health.start(self._health_interval, now=False).addErrback(
            lambda f: log.failure(self._health_failed_event, f)
        )

    def _went_writable(self) -> None:
        since = self._read_only_since
        if since is None:
            return
        self._read_only_since = None
        self._stop_health()
        log.info(self._writable_event, after=round(self._reactor.seconds() - since, 3))
        waiters, self._writable_waiters = self._writable_waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def _check_health(self) -> Deferred:
        # A failing ping (server unreachable) keeps the state: still not writable.
        return Deferred.fromCoroutine(self.ping())

    def _stop_health(self) -> None:
        health, self._health = self._health, None
        if health is not None and health.running:
            health.stop()

    def close(self) -> None:
        self._stop_health()
        self._deadlines.stop()
        self.pool.close()
