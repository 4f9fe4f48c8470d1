"""How the Redis store calls its server: every call bounded in time, every
script given the queue's key base."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from gorge.app.inflight import InFlight
from gorge.db import redis as gredis
from gorge.db.clock import RedisClock, StoreTime
from gorge.taskqueue.redis_layout import DEFAULT_KEY_PREFIX, Keys, pack
from gorge.taskqueue.redis_scripts import load_scripts

DEFAULT_OP_TIMEOUT = 10.0


class RedisCalls:
    """The connection, clock, keys and scripts the Redis store's parts share.

    ``conn`` is a txredisapi connection (normally the lazy pool from
    :func:`gorge.db.redis.make_redis`); every call is bounded by ``op_timeout``
    seconds on ``clock`` because a lazy pool waits while the server is down.
    ``archive_retention`` (seconds, None = forever, the reference behaviour)
    bounds how long archive records, and so complete replays, are kept.
    "Now", for every time the scripts write or compare, is the server's
    clock (``TIME``, sampled: :class:`gorge.db.clock.RedisClock`), so
    replicas on hosts whose clocks differ agree on which leases have
    expired; ``time`` replaces it (a test's clock: Redis' cannot be set).
    """

    def __init__(
        self,
        conn: Any,
        *,
        clock: IReactorTime,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        op_timeout: float = DEFAULT_OP_TIMEOUT,
        ping_timeout: float = 5.0,
        archive_retention: int | None = None,
        time: StoreTime | None = None,
    ) -> None:
        self._conn = conn
        self._clock = clock
        # Read once per period, not once per call: a script's TIME would
        # do as well, but every script would then compute its expiries
        # itself, and a sample costs no call a round trip.
        self.time = time if time is not None else RedisClock(self._server_time)
        self._op_timeout = op_timeout
        self._ping_timeout = ping_timeout
        self._archive_retention = archive_retention
        self.keys = Keys(key_prefix)
        self.scripts = load_scripts()
        self._giving_back = InFlight()

    async def _now(self) -> int:
        # Whole seconds, as the scores and fields hold them.
        return int(await self.time.now())

    def _server_time(self) -> Deferred:
        return self._bounded(self._conn.time())

    def _cutoff(self, now: int) -> int | str:
        """The archive time before which records are pruned ('' = never)."""
        return "" if self._archive_retention is None else now - self._archive_retention

    # Plain functions answering Deferreds, not coroutines: every queue call
    # goes through them, and each coroutine layer costs a Deferred of its own.

    def _bounded(self, d: Any) -> Deferred:
        """A Deferred or coroutine, bounded to ``op_timeout`` seconds."""
        if not isinstance(d, Deferred):
            d = Deferred.fromCoroutine(d)
        return d.addTimeout(self._op_timeout, self._clock)

    def _run(self, script: gredis.LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Deferred:
        return self._bounded(script.run(self._conn, keys=keys, args=[self.keys.base, *args]))

    def _run_packed(
        self, script: gredis.LuaScript, key: str, fields: Sequence[Any], *extra: str
    ) -> Deferred:
        """Run a script that reads its small arguments from one JSON array."""
        packed = pack([self.keys.base, *(f if isinstance(f, str) else str(f) for f in fields)])
        return self._bounded(script.run(self._conn, keys=[key], args=[packed, *extra]))
