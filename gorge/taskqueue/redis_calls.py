"""How the Redis store calls its server: every call bounded in time, every
script given the queue's key base."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure

from gorge.app.inflight import InFlight
from gorge.db import DatabaseReadOnly
from gorge.db import redis as gredis
from gorge.db.clock import RedisClock, StoreTime
from gorge.log.logger import Logger
from gorge.taskqueue.redis_layout import DEFAULT_KEY_PREFIX, Keys, pack
from gorge.taskqueue.redis_scripts import load_scripts

log = Logger()

DEFAULT_OP_TIMEOUT = 10.0

READ_ONLY = "TASKQUEUE_DB_READ_ONLY reason={reason} txn={txn}"
WRITABLE = "TASKQUEUE_DB_WRITABLE after={after}"


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
        # Since when (clock seconds) the server refuses writes (a demoted
        # master, a replica named by mistake); None while it takes them.
        self.read_only_since: float | None = None
        self._asking_role = False

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
        d.addTimeout(self._op_timeout, self._clock)
        if self.read_only_since is not None:
            d.addCallback(self._answered_while_read_only)
        return d.addErrback(self._refused_write)

    def _refused_write(self, failure: Failure) -> Failure:
        """A write refused with READONLY becomes DatabaseReadOnly: the API
        answers a retryable 503, not the opaque 500. Logged once per turn."""
        error = failure.value
        if error is None or not gredis.is_read_only(error):
            return failure
        self.went_read_only("call")
        return Failure(DatabaseReadOnly("redis call", error))

    def went_read_only(self, description: str) -> None:
        if self.read_only_since is None:
            self.read_only_since = self._clock.seconds()
            log.warn(READ_ONLY, reason=gredis.READ_ONLY_REASON, txn=description)

    def went_writable(self) -> None:
        since = self.read_only_since
        if since is not None:
            self.read_only_since = None
            log.info(WRITABLE, after=round(self._clock.seconds() - since, 3))

    def _answered_while_read_only(self, answer: Any) -> Any:
        # A replica answers reads too, so an answer does not say writes are
        # taken again: the server's role does, asked once at a time.
        if not self._asking_role:
            self._asking_role = True
            self._bounded(self._conn.role()).addCallbacks(
                self._role_answered, lambda _: None
            ).addBoth(self._role_asked)
        return answer

    def _role_answered(self, role: Any) -> None:
        if gredis.role_takes_writes(role):
            self.went_writable()

    def _role_asked(self, _: object) -> None:
        self._asking_role = False

    async def ping(self) -> str | None:
        """None when the server answers in time and takes writes, else a short
        reason for ``/readyz``."""
        reason = await gredis.ping(self._conn, self._clock, self._ping_timeout)
        if reason is not None:
            return reason
        try:
            role = await self._bounded(self._conn.role())
        except Exception:
            return "redis unreachable"
        if gredis.role_takes_writes(role):
            self.went_writable()
            return None
        self.went_read_only("ping")
        return gredis.READ_ONLY_REASON

    def _run(self, script: gredis.LuaScript, keys: Sequence[str], args: Sequence[Any]) -> Deferred:
        return self._bounded(script.run(self._conn, keys=keys, args=[self.keys.base, *args]))

    def _run_packed(
        self, script: gredis.LuaScript, key: str, fields: Sequence[Any], *extra: str
    ) -> Deferred:
        """Run a script that reads its small arguments from one JSON array."""
        packed = pack([self.keys.base, *(f if isinstance(f, str) else str(f) for f in fields)])
        return self._bounded(script.run(self._conn, keys=[key], args=[packed, *extra]))
