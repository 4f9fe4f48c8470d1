"""Where a store's "now" comes from (docs/taskqueue.md, Clocks).

Phorge computes every lease, yield and retry time with the database's
``UNIX_TIMESTAMP()``, so every host that shares the tables agrees on which
leases have expired whatever its own clock says. :class:`DatabaseClock` gives
a store that same time without a round trip per call: it reads the server's
clock once (``SELECT UNIX_TIMESTAMP(NOW(6))``) and counts on from there with
the host's monotonic clock, which wall-clock steps (NTP, an operator's
``date``) never move. It reads the server again every ``resample`` seconds,
so the drift between the two clocks stays well below a second, and after the
pool opened a connection (a reconnect may have reached another server, with
a clock of its own); only the very first call waits for a read, later reads
run beside the calls, which count from the last one meanwhile. Error bound:
half the sample's round trip, plus the rate difference of the two clocks
over ``resample`` seconds (milliseconds).

:class:`HostTime` is "now" from an injected clock, for a store only one
process uses (SQLite, memory) where the host's clock is everyone's.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime

from gorge.app.shared import SharedRun
from gorge.db.database import Database
from gorge.db.engine import Txn

__all__ = ["RESAMPLE", "DatabaseClock", "HostTime", "RedisClock", "ServerClock", "StoreTime"]

# Seconds between two reads of the server's clock.
RESAMPLE = 30.0
SAMPLE = "SELECT UNIX_TIMESTAMP(NOW(6))"


class StoreTime(Protocol):
    """What a store asks for "now": epoch seconds."""

    async def now(self) -> float: ...


class HostTime:
    """``clock.seconds()``: the host's clock (or a test's)."""

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock

    async def now(self) -> float:
        return self._clock.seconds()


class ServerClock:
    """A server's clock, read every ``resample`` seconds and counted on
    between reads by ``elapsed`` (the host's monotonic clock; in tests an
    injected clock, the server's own pinned to the same one). A subclass
    reads the server."""

    def __init__(
        self, *, elapsed: Callable[[], float] = time.monotonic, resample: float = RESAMPLE
    ) -> None:
        self._elapsed = elapsed
        self._resample = resample
        # server seconds - elapsed(), as of the last read; None before it.
        self._offset: float | None = None
        self._sampled_at = 0.0
        self._generation_read = -1
        # The read under way, shared by the callers arriving meanwhile.
        self._sample: SharedRun[None] = SharedRun(self._store_read)

    @property
    def offset(self) -> float | None:
        """Server clock minus ``elapsed``, as last read (None: not read yet)."""
        return self._offset

    def settled(self) -> Deferred[None]:
        """Fires once no read of the server's clock is under way (at once if
        none is): for a caller that moves the clocks itself (tests)."""
        if not self._sample.running:
            return succeed(None)
        return self._sample()

    async def _read(self) -> tuple[float, float]:
        """The server's seconds minus ``elapsed()``, and when (``elapsed``) it
        was read: the middle of the round trip."""
        raise NotImplementedError

    def _generation(self) -> int:
        """Changes when the server may be another one (a new connection)."""
        return 0

    def _fresh(self) -> bool:
        return (
            self._elapsed() - self._sampled_at < self._resample
            and self._generation() == self._generation_read
        )

    async def now(self) -> float:
        offset = self._offset
        if offset is None:
            # Nothing to count from yet: the first call waits for the read.
            await self._sample()
            offset = self._offset
            assert offset is not None
        elif not self._sample.running and not self._fresh():
            # Read again in the background and answer from the last read
            # meanwhile: off by milliseconds of drift at most (or, for the
            # few calls after a reconnect to another server, by what the old
            # server's clock was off), and no call waits on the read.
            self._sample().addErrback(lambda _: None)
        return offset + self._elapsed()

    async def _store_read(self) -> None:
        offset, at = await self._read()
        # Counted after the read: a connection the read itself had to open
        # (the first one of a pool) is no reason to read again.
        generation = self._generation()
        self._offset, self._sampled_at, self._generation_read = offset, at, generation


class DatabaseClock(ServerClock):
    """A SQL database server's clock (MySQL/MariaDB: ``UNIX_TIMESTAMP(NOW(6))``),
    read again after the pool opened a connection as well."""

    def __init__(
        self,
        db: Database,
        *,
        elapsed: Callable[[], float] = time.monotonic,
        resample: float = RESAMPLE,
    ) -> None:
        super().__init__(elapsed=elapsed, resample=resample)
        self._db = db

    def _generation(self) -> int:
        return self._db.connections_opened

    async def _read(self) -> tuple[float, float]:
        if self._db.engine.clock is None:
            return await self._db.run("clock", self._read_txn)
        # A pinned server clock (tests, the demo): the transaction reads the
        # pin taken as it is queued, here in the reactor thread, so the
        # moment is read here too. Read in the pool thread, it could fall
        # after the test moved the clock on, and every later "now" would be
        # behind by that step.
        at = self._elapsed()
        offset, middle = await self._db.run("clock", self._read_txn)
        return offset + middle - at, at

    def _read_txn(self, txn: Txn) -> tuple[float, float]:
        # Timed in the pool thread, around the statement alone: the wait for
        # a thread is not part of the round trip the error bound counts.
        before = self._elapsed()
        txn.execute(SAMPLE)
        (server,) = txn.fetchone()
        after = self._elapsed()
        middle = (before + after) / 2
        return float(server) - middle, middle


class RedisClock(ServerClock):
    """A Redis server's clock: ``TIME``, through ``time`` (the connection's
    ``time()``, bounded as every call of the store)."""

    def __init__(
        self,
        time_of: Callable[[], Awaitable[Sequence[Any]]],
        *,
        elapsed: Callable[[], float] = time.monotonic,
        resample: float = RESAMPLE,
    ) -> None:
        super().__init__(elapsed=elapsed, resample=resample)
        self._time_of = time_of

    async def _read(self) -> tuple[float, float]:
        before = self._elapsed()
        seconds, micros = await self._time_of()
        after = self._elapsed()
        middle = (before + after) / 2
        return int(seconds) + int(micros) / 1_000_000 - middle, middle
