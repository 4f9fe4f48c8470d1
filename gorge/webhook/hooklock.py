"""The per-hook lock Phorge's ``HeraldWebhookWorker`` takes, taken by us too.

Phorge never calls one hook from two workers at once: before its POST the
worker takes ``PhabricatorGlobalLock::newLock('webhook(<hook PHID>)')``, a
MySQL ``GET_LOCK`` with a wait of 0 (a try-lock) on a connection of its own,
and yields for 15 s when the hook is busy. The lock's name is
``ph:<namespace digest>:<name digest>``, made by
``PhabricatorHash::digestToLength`` (:func:`lock_name` spells it out).

gorge-webhook takes the same lock, with the same name, from before a row's
claim until its hook is idle in this process again (the result of its last
row written), so neither another replica nor a Phorge worker still running
during a switch-over posts to the hook meanwhile (docs/webhook.md, "Order
and replicas"). A named lock belongs to a session, so each lock held has a
connection of its own; released connections are kept for the next lock, as
Phorge keeps its own.

A hook that goes idle keeps its lock "parked" until the next poll begins,
or one poll interval at most if that poll is late (at most
``PARKED_PER_SLOT`` per slot, the oldest let go first): with many
busy hooks a slot moves on after each row and comes back to the hook a
moment later, and taking and releasing the lock for every row cost a
third of the deliveries (bench/webhook.py). Holding a lock longer than
needed only makes another replica or a Phorge worker wait up to one poll
interval for that hook; it never lets two post at once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

from gorge.config import MySQLSettings
from gorge.db import mysql as platform_mysql
from gorge.log.logger import Logger

log = Logger()

# PhabricatorHash::digestForIndex's alphabet and length.
_INDEX_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ._"
INDEX_DIGEST_LENGTH = 12
LOCK_NAME_PART = 20  # PhabricatorGlobalLock: digestToLength(..., 20)
# Released sessions kept open for the next lock: a slot moves from hook to hook
# after each row when many hooks are busy, and a new session per lock (TCP,
# authentication) cost more than the lock itself.
IDLE_PER_SLOT = 2
PARKED_PER_SLOT = 4

SQL_GET_LOCK = "SELECT GET_LOCK(%s, 0)"
SQL_SESSION_TIMEOUT = "SET SESSION wait_timeout = %s"
# How long the server keeps a lock's session that says nothing; a session
# holding or parking a lock says something every third of it.
LOCK_SESSION_TIMEOUT = 60
SQL_RELEASE_LOCK = "SELECT RELEASE_LOCK(%s)"


def digest_for_index(text: str) -> str:
    """PhabricatorHash::digestForIndex: 12 characters of SHA-1, 6 bits each."""
    raw = hashlib.sha1(text.encode("utf-8")).digest()
    return "".join(_INDEX_ALPHABET[byte & 0x3F] for byte in raw[:INDEX_DIGEST_LENGTH])


def digest_to_length(text: str, length: int) -> str:
    """PhabricatorHash::digestToLength: a prefix of the text, "-", its digest."""
    prefix = text[: length - (INDEX_DIGEST_LENGTH + 1)]
    return f"{prefix}-{digest_for_index(text)}"


def lock_name(namespace: str, hook_phid: str) -> str:
    """The name of HeraldWebhookWorker's lock for ``hook_phid`` on a site whose
    ``storage.default-namespace`` is ``namespace`` (no lock parameters: ``()``)."""
    local = digest_to_length(f"webhook({hook_phid})()", LOCK_NAME_PART)
    return f"ph:{digest_to_length(namespace, LOCK_NAME_PART)}:{local}"


class HookLocks:
    """This process's hold on hooks: :meth:`acquire` before a claim, :meth:`release`
    once the hook is idle. Every call for one hook is made one after the other."""

    def __init__(
        self,
        settings: MySQLSettings,
        namespace: str,
        reactor: Any,
        *,
        threadpool: ThreadPool | None = None,
        connect: Callable[[MySQLSettings], Any] = platform_mysql.connect,
        slots: int = 8,
        clock: IReactorTime | None = None,
        park_for: float = 1.0,
        session_timeout: int | None = None,
    ) -> None:
        """``park_for`` (the poll interval, on ``clock``): the longest an idle
        hook's lock is kept when no poll lets it go first. ``session_timeout``
        (seconds; None: the server's ``wait_timeout``): how long the server
        keeps a lock's session that says nothing. A host that vanishes
        without closing its connections (power, network) would otherwise
        hold its hooks' locks until the server's default, 8 hours, and every
        other replica and Phorge worker would skip those hooks meanwhile."""
        self._settings = settings
        self._namespace = namespace
        self._reactor = reactor
        self._threadpool = threadpool if threadpool is not None else reactor.getThreadPool()
        self._connect = connect
        self._held: dict[str, Any] = {}  # hook -> the session holding its lock
        self._parked: dict[str, Any] = {}  # idle hooks whose lock is kept, oldest first
        self._max_parked = PARKED_PER_SLOT * slots
        self._clock: IReactorTime = clock if clock is not None else reactor
        self._park_for = park_for
        self._session_timeout = session_timeout
        self._keepalive: LoopingCall | None = None
        self._pings: dict[int, Deferred[None]] = {}  # id(session) -> its ping under way
        self._park_timer: IDelayedCall | None = None
        self._releasing: dict[str, Deferred[None]] = {}
        self._idle: list[Any] = []
        self._max_idle = IDLE_PER_SLOT * slots
        self._closed = False
        # Sessions on a master the topology no longer names (repoint): closed
        # once their lock is let go, never kept for the next lock.
        self._stale: set[int] = set()

    def holds(self, hook_phid: str) -> bool:
        return hook_phid in self._held or hook_phid in self._parked

    async def acquire(self, hook_phid: str) -> bool:
        """True when this process holds the hook's lock (already or now); False
        when someone else does, or the lock could not be asked for."""
        if hook_phid in self._held:
            return True
        parked = self._parked.pop(hook_phid, None)
        if parked is not None:
            self._held[hook_phid] = parked
            return True
        releasing = self._releasing.get(hook_phid)
        if releasing is not None:
            await releasing
        name = lock_name(self._namespace, hook_phid)
        connection = self._idle.pop() if self._idle else None
        try:
            connection, got = await self._in_thread(self._get_lock, connection, name)
        except Exception as e:
            log.error(
                "WEBHOOK_HOOK_LOCK_FAILED hook={hook} lock={lock} error={error}",
                hook=hook_phid,
                lock=name,
                error=platform_mysql.error_reason(e),
            )
            return False
        if not got:
            self._keep(connection)
            return False
        if self._closed:
            await self._in_thread(self._release_lock, connection, name)
            return False
        self._held[hook_phid] = connection
        self._start_keepalive()
        return True

    # -- keeping the lock's sessions alive ------------------------------------

    def _start_keepalive(self) -> None:
        if self._session_timeout is None or self._keepalive is not None:
            return
        keepalive = self._keepalive = LoopingCall(self._ping_holders)
        keepalive.clock = self._clock
        keepalive.start(self._session_timeout / 3, now=False).addErrback(
            lambda f: log.failure("WEBHOOK_HOOK_LOCK_KEEPALIVE_FAILED", f)
        )

    def settled(self) -> Deferred[Any]:
        """Fires once no session's ping is under way: for a caller that moves
        the clock itself (tests)."""
        return gatherResults(list(self._pings.values()))

    def _ping_holders(self) -> Deferred[Any]:
        """Each session holding or parking a lock says something, so the server
        keeps it (``session_timeout``). One the server has closed (killed, or
        the database restarted) has lost its lock: the hook is no longer held,
        and the next row of it asks for the lock again."""
        holders = [*self._held.items(), *self._parked.items()]
        return gatherResults([self._ping(hook, connection) for hook, connection in holders])

    def _ping(self, hook_phid: str, connection: Any) -> Deferred[None]:
        key = id(connection)
        if key in self._pings:
            return self._pings[key]

        def lost(failure: Any) -> None:
            if self._held.get(hook_phid) is connection:
                del self._held[hook_phid]
            elif self._parked.get(hook_phid) is connection:
                del self._parked[hook_phid]
            else:
                return  # let go meanwhile
            log.warn(
                "WEBHOOK_HOOK_LOCK_LOST hook={hook} lock={lock} error={error}",
                hook=hook_phid,
                lock=lock_name(self._namespace, hook_phid),
                error=platform_mysql.error_reason(failure.value),
            )
            self._stale.discard(key)
            _close(connection)

        def done(result: object) -> object:
            self._pings.pop(key, None)
            return result

        d = self._in_thread(_say_something, connection)
        self._pings[key] = d
        d.addBoth(done).addErrback(lost)
        return d

    def release(self, hook_phid: str) -> Deferred[None] | None:
        """The hook is idle: its lock is parked until :meth:`release_parked`
        (None), or, beyond the parked bound, the oldest parked lock goes (the
        Deferred fires when it has)."""
        connection = self._held.pop(hook_phid, None)
        if connection is None:
            return None
        self._parked[hook_phid] = connection
        if self._park_timer is None or not self._park_timer.active():
            self._park_timer = self._clock.callLater(self._park_for, self._parked_too_long)
        if len(self._parked) <= self._max_parked:
            return None
        oldest = next(iter(self._parked))
        return self._let_go(oldest, self._parked.pop(oldest))

    def release_parked(self) -> list[Deferred[None]]:
        """A poll begins: every parked lock goes; one Deferred per lock."""
        parked, self._parked = self._parked, {}
        return [self._let_go(hook, connection) for hook, connection in parked.items()]

    def _parked_too_long(self) -> None:
        self._park_timer = None
        for released in self.release_parked():
            released.addErrback(lambda f: log.failure("WEBHOOK_HOOK_UNLOCK_FAILED", f))

    def _let_go(self, hook_phid: str, connection: Any) -> Deferred[None]:
        name = lock_name(self._namespace, hook_phid)
        d = Deferred.fromCoroutine(self._release(hook_phid, connection, name))
        self._releasing[hook_phid] = d
        return d

    async def _release(self, hook_phid: str, connection: Any, name: str) -> None:
        ping = self._pings.get(id(connection))
        if ping is not None:
            await ping  # one statement at a time on a session
        try:
            await self._in_thread(self._release_lock, connection, name)
            self._keep(connection)
        except Exception as e:
            # The session is closed: the server lets the lock go with it.
            log.warn(
                "WEBHOOK_HOOK_UNLOCK_FAILED hook={hook} lock={lock} error={error}",
                hook=hook_phid,
                lock=name,
                error=platform_mysql.error_reason(e),
            )
            self._stale.discard(id(connection))
            _close(connection)
        finally:
            self._releasing.pop(hook_phid, None)

    def close(self) -> None:
        """Shutdown: every session closes (and with it every lock still held)."""
        self._closed = True
        if self._park_timer is not None and self._park_timer.active():
            self._park_timer.cancel()
        if self._keepalive is not None and self._keepalive.running:
            self._keepalive.stop()
        for connection in [*self._held.values(), *self._parked.values(), *self._idle]:
            _close(connection)
        self._held.clear()
        self._parked.clear()
        self._idle.clear()

    def repoint(self, settings: MySQLSettings) -> Deferred[Any]:
        """The site's master moved: new locks are taken there. Idle sessions
        close now; a lock parked or held on the old master is let go as
        usual, its session then closed. Fires once the parked ones are."""
        self._settings = settings
        idle, self._idle = self._idle, []
        for connection in idle:
            _close(connection)
        self._stale.update(id(connection) for connection in self._held.values())
        self._stale.update(id(connection) for connection in self._parked.values())
        return gatherResults(self.release_parked())

    def _keep(self, connection: Any) -> None:
        if id(connection) in self._stale:
            self._stale.discard(id(connection))
            _close(connection)
        elif self._closed or len(self._idle) >= self._max_idle:
            _close(connection)
        else:
            self._idle.append(connection)

    def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Deferred[Any]:
        return deferToThreadPool(self._reactor, self._threadpool, fn, *args)

    # -- in a pool thread ------------------------------------------------------

    def _get_lock(self, connection: Any, name: str) -> tuple[Any, bool]:
        if connection is not None:
            try:
                return connection, self._try_lock(connection, name)
            except Exception:
                # A kept session the server has closed meanwhile: a new one.
                _close(connection)
        connection = self._connect(self._settings)
        try:
            if self._session_timeout is not None:
                with connection.cursor() as cursor:
                    cursor.execute(SQL_SESSION_TIMEOUT, (self._session_timeout,))
            return connection, self._try_lock(connection, name)
        except Exception:
            _close(connection)
            raise

    @staticmethod
    def _try_lock(connection: Any, name: str) -> bool:
        with connection.cursor() as cursor:
            cursor.execute(SQL_GET_LOCK, (name,))
            (got,) = cursor.fetchone()
        return got == 1

    @staticmethod
    def _release_lock(connection: Any, name: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(SQL_RELEASE_LOCK, (name,))
            cursor.fetchone()


def _say_something(connection: Any) -> None:
    # ping(reconnect=False): a new session would hold no lock.
    connection.ping(reconnect=False)


def _close(connection: Any) -> None:
    try:
        connection.close()
    except Exception:  # already gone: its locks went with it
        pass
