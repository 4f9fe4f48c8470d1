"""Service-tree plumbing shared by the four daemons.

The one way to build a daemon's tree (:class:`ServiceTree`: named children
started in order and stopped in reverse, parts reachable by name), a poll
loop that never overlaps itself, tracking of in-flight work for bounded
drains, the HTTP listener, the ``makeService`` boundary (configuration
errors, log output under twistd), and systemd's notify protocol.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, overload

from twisted.application.service import IService, Service
from twisted.internet.defer import Deferred, DeferredList, maybeDeferred, succeed
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import ILogObserver, LogLevel
from twisted.python.components import Componentized
from twisted.python.failure import Failure

from gorge.config import ConfigError
from gorge.logger import Logger
from gorge.logging import forward_stdlib_logging, make_observer

__all__ = [
    "DaemonRoot",
    "OrderedService",
    "ServiceTree",
    "Poller",
    "InFlight",
    "FunctionService",
    "HTTPListener",
    "StopBudget",
    "HTTP_DRAIN_TIMEOUT",
    "listener",
    "run_make_service",
    "SystemdNotifier",
    "watchdog_heartbeat",
]

log = Logger()

T = TypeVar("T")


class DaemonRoot(Service):
    """The top of a daemon's tree: what its ``makeService`` hands to twistd.

    twistd adds it to a new Application, and an ``ILogObserver`` component
    on that Application is twistd's own way for an application to choose its
    log observer (an explicit ``--logger`` still takes precedence). Setting
    :attr:`log_observer` makes a plain ``twistd -n gorge-X`` print gorge's
    lines at ``GORGE_LOG_LEVEL`` in ``GORGE_LOG_FORMAT``, through the one
    observer twistd starts, so no line is printed twice.
    """

    log_observer: ILogObserver | None = None

    def setServiceParent(self, parent: Any) -> None:
        if (
            self.log_observer is not None
            and isinstance(parent, Componentized)
            and parent.getComponent(ILogObserver) is None
        ):
            parent.setComponent(ILogObserver, self.log_observer)
            forward_stdlib_logging()
        super().setServiceParent(parent)


class OrderedService(Service):
    """Start children in order; stop them in reverse order, one at a time.

    Twisted's MultiService stops its children concurrently, which would close
    a database pool while a delivery is still writing its result.
    """

    def __init__(self, *children: IService, name: str | None = None) -> None:
        self._children = list(children)
        if name is not None:
            self.setName(name)

    def add(self, child: IService) -> None:
        self._children.append(child)

    def privilegedStartService(self) -> None:
        super().privilegedStartService()
        for child in self._children:  # binds ports before twistd drops privileges
            child.privilegedStartService()

    def startService(self) -> None:
        super().startService()
        for child in self._children:
            if not child.running:
                child.startService()

    def stopService(self) -> Deferred:
        super().stopService()
        return Deferred.fromCoroutine(self._stop_in_order())

    async def _stop_in_order(self) -> None:
        for child in reversed(self._children):
            if not child.running:
                continue
            try:
                await maybeDeferred(child.stopService)
            except Exception:
                log.failure("STOP_FAILED child={child}", level=LogLevel.error, child=repr(child))


class ServiceTree(DaemonRoot, OrderedService):
    """A daemon's service tree, built one named child at a time.

    Children start in the order they were added and stop in reverse, one at
    a time (:class:`OrderedService`). So a tree lists what must outlive the
    rest first (pools, stores) and what must stop first last (the loop that
    takes new work, the listener). Each child, and each part that is no
    child (the site, a metrics registry), is reachable by name through
    :meth:`part`.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self._parts: dict[str, Any] = {}

    def add(  # type: ignore[override]  # named children, unlike OrderedService.add
        self,
        name: str,
        child: IService | None = None,
        *,
        start: Callable[[], object] | None = None,
        stop: Callable[[], object] | None = None,
        part: Any = None,
    ) -> IService:
        """Add the child ``name``: ``child`` itself, or a step made of a
        ``start`` and a ``stop`` callable (``stop`` may return a Deferred or
        be a coroutine function; the tree waits for it). :meth:`part` then
        returns ``part``, or the child when there is none."""
        if child is None:
            child = FunctionService(start=start, stop=stop)
        elif start is not None or stop is not None:
            raise TypeError(f"{name}: give a child service or start/stop callables, not both")
        child.setName(name)
        self.keep(name, child if part is None else part)
        OrderedService.add(self, child)
        return child

    def keep(self, name: str, part: Any) -> None:
        """Make ``part`` reachable as :meth:`part` ``(name)`` without it being a child."""
        if name in self._parts:
            raise ValueError(f"{self.name} already has a part named {name!r}")
        self._parts[name] = part

    @overload
    def part(self, name: str) -> Any: ...

    @overload
    def part(self, name: str, kind: type[T]) -> T: ...

    def part(self, name: str, kind: type | None = None) -> Any:
        """The part called ``name``; with ``kind``, checked to be one."""
        try:
            found = self._parts[name]
        except KeyError:
            raise KeyError(
                f"{self.name} has no part {name!r} (it has: {', '.join(sorted(self._parts))})"
            ) from None
        if kind is not None and not isinstance(found, kind):
            raise TypeError(
                f"{self.name} part {name!r} is a {type(found).__name__}, not a {kind.__name__}"
            )
        return found

    def has_part(self, name: str) -> bool:
        return name in self._parts

    def __repr__(self) -> str:
        return f"<ServiceTree {self.name}>"


class FunctionService(Service):
    """An IService whose start and stop are plain callables.

    ``stop`` may return a Deferred (or a coroutine's Deferred); the ordered
    parent waits for it before stopping the previous child.
    """

    def __init__(
        self,
        start: Callable[[], object] | None = None,
        stop: Callable[[], object] | None = None,
        name: str | None = None,
    ) -> None:
        self._start = start
        self._stop = stop
        if name is not None:
            self.setName(name)

    def startService(self) -> None:
        super().startService()
        if self._start is not None:
            self._start()

    def stopService(self):
        super().stopService()
        if self._stop is None:
            return succeed(None)
        return maybeDeferred(self._stop)

    def __repr__(self) -> str:
        return f"<FunctionService {self.name}>"


class Poller:
    """Run ``tick`` every ``interval`` seconds; ticks never overlap.

    A failing tick is logged and the loop goes on (a bare LoopingCall dies on
    the first unhandled failure). :meth:`stop` fires once the tick in progress
    has finished; :meth:`wake` runs the next tick now when the loop is idle.
    """

    def __init__(
        self,
        tick: Callable[[], Awaitable[None]],
        interval: float,
        clock: IReactorTime,
        name: str,
        on_progress: Callable[[], None] | None = None,
    ) -> None:
        self._tick = tick
        self._interval = interval
        self._clock = clock
        self._name = name
        self._on_progress = on_progress
        self._loop: LoopingCall | None = None
        self._done: Deferred | None = None
        self._in_tick = False
        self._failing = False

    @property
    def running(self) -> bool:
        return self._loop is not None and self._loop.running

    def start(self, now: bool = True) -> None:
        self._loop = LoopingCall(self._run_once)
        self._loop.clock = self._clock
        self._done = self._loop.start(self._interval, now=now)
        self._done.addErrback(
            lambda f: log.failure(
                "POLL_LOOP_DIED name={name}", f, level=LogLevel.critical, name=self._name
            )
        )

    def _run_once(self) -> Deferred:
        return Deferred.fromCoroutine(self._guarded())

    async def _guarded(self) -> None:
        self._in_tick = True
        try:
            await self._tick()
        except Exception:
            # Log the first failure of a streak only: an unreachable database
            # must not print one traceback per tick.
            if not self._failing:
                log.failure("POLL_FAILED name={name}", level=LogLevel.error, name=self._name)
            self._failing = True
        else:
            if self._failing:
                log.info("POLL_RECOVERED name={name}", name=self._name)
            self._failing = False
            if self._on_progress is not None:
                self._on_progress()
        finally:
            self._in_tick = False

    def wake(self) -> None:
        """Run the next tick now unless one is running (prompt pickup)."""
        loop = self._loop
        if loop is None or not loop.running or self._in_tick:
            return
        call = getattr(loop, "call", None)
        if call is not None and call.active():
            call.reset(0)

    def stop(self) -> Deferred:
        """Stop scheduling ticks; fires once the tick in progress finished."""
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        return self._done if self._done is not None else succeed(None)


class InFlight:
    """Work that shutdown has to wait for."""

    def __init__(self) -> None:
        self._pending: set[Deferred] = set()

    def __len__(self) -> int:
        return len(self._pending)

    def track(self, d: Deferred) -> Deferred:
        self._pending.add(d)

        def forget(result):
            self._pending.discard(d)
            return result

        d.addBoth(forget)
        return d

    def begin(self) -> Deferred:
        """Track work that has no Deferred of its own (a coroutine awaited
        in place): fire the Deferred returned when the work ends."""
        return self.track(Deferred())

    def drain(self, timeout: float, clock: IReactorTime) -> Deferred:
        """Fires True when everything tracked has finished, False on timeout.

        The tracked Deferreds are not cancelled: abandoning work is the
        caller's decision, and its result writes must not be cut off.
        """
        if not self._pending:
            return succeed(True)
        waiter = DeferredList([_observe(d) for d in list(self._pending)], consumeErrors=True)
        result: Deferred = Deferred()

        def expire() -> None:
            if not result.called:
                result.callback(False)

        timer = clock.callLater(timeout, expire)

        def finished(_):
            if timer.active():
                timer.cancel()
            if not result.called:
                result.callback(True)

        waiter.addBoth(finished)
        return result


def _observe(d: Deferred) -> Deferred:
    """A Deferred that fires when ``d`` does, without touching ``d``'s chain."""
    observer: Deferred = Deferred()

    def passthrough(result):
        observer.callback(None)
        return result

    d.addBoth(passthrough)
    return observer


HTTP_DRAIN_TIMEOUT = 10.0


class StopBudget:
    """One drain budget for every step of a stop, counted from its start."""

    def __init__(self, seconds: float, clock: IReactorTime) -> None:
        self.seconds = seconds
        self._clock = clock
        self._started: float | None = None

    def start(self) -> None:
        self._started = self._clock.seconds()

    def remaining(self) -> float:
        if self._started is None:
            return self.seconds
        return max(self.seconds - (self._clock.seconds() - self._started), 0.0)


class HTTPListener(Service):
    """The HTTP listener. Stopping it refuses new connections and finishes
    the requests that have already arrived, within ``drain_timeout``.

    A request whose body is still arriving when the stop begins is read to
    its end, handled and answered; idle kept-alive connections close at once.
    That is the site's job (``gorge.web.GorgeSite.drain``); a plain Site
    only stops accepting.
    """

    def __init__(
        self, endpoint: str, site, *, drain_timeout: float, reactor: Any, clock: IReactorTime
    ) -> None:
        self.site = site
        self.listening_port: IListeningPort | None = None
        self._endpoint = endpoint
        self._drain_timeout = drain_timeout
        self._reactor = reactor
        self._clock = clock

    def privilegedStartService(self) -> None:
        super().privilegedStartService()
        if self.listening_port is not None:
            return
        listening = serverFromString(self._reactor, self._endpoint).listen(self.site)
        outcome: list = []
        listening.addBoth(outcome.append)
        # TCP listens synchronously: a bind failure raises here and aborts start-up.
        if isinstance(outcome[0], Failure):
            outcome[0].raiseException()
        self.listening_port = outcome[0]

    def startService(self) -> None:
        super().startService()
        self.privilegedStartService()  # when started without the privileged step

    def stopService(self) -> Deferred:
        super().stopService()
        return Deferred.fromCoroutine(self._stop())

    async def _stop(self) -> None:
        port, self.listening_port = self.listening_port, None
        if port is not None:
            await maybeDeferred(port.stopListening)
        drain = getattr(self.site, "drain", None)
        if drain is None:  # a plain Site keeps no connections
            return
        log.info(
            "HTTP_LISTENER_CLOSED open_connections={open_connections} budget={budget}",
            open_connections=self.site.open_connections,
            budget=self._drain_timeout,
        )
        if not await drain(self._drain_timeout, self._clock):
            log.warn(
                "HTTP_DRAIN_ABANDONED open_connections={open_connections}",
                open_connections=self.site.open_connections,
            )


def listener(
    endpoint: str,
    site,
    *,
    drain_timeout: float = HTTP_DRAIN_TIMEOUT,
    reactor: Any = None,
    clock: IReactorTime | None = None,
) -> HTTPListener:
    """The HTTP listener for ``site`` on the strports ``endpoint``.

    ``reactor`` (default: the global one) runs the port; ``clock`` (default:
    ``reactor``) times the drain of the requests already received when it
    stops. Services pass their clock only: tests build them with a fake
    clock and still serve on real sockets.
    """
    if reactor is None:
        from twisted.internet import reactor
    return HTTPListener(
        endpoint,
        site,
        drain_timeout=drain_timeout,
        reactor=reactor,
        clock=clock if clock is not None else reactor,
    )


def _twistd_prints_to_stdout(server_options: Mapping[str, Any] | None) -> bool:
    """Whether twistd would print its own default lines to stdout: not
    daemonized, and no ``--logger``, ``--logfile`` or ``--syslog`` chosen."""
    if server_options is None:
        return False
    return (
        bool(server_options.get("nodaemon"))
        and not server_options.get("logger")
        and not server_options.get("syslog")
        and server_options.get("logfile") in (None, "", "-")
    )


def run_make_service(
    service_name: str,
    build: Callable[[], IService],
    environ: Mapping[str, str] | None = None,
    options: Any = None,
) -> IService:
    """Call ``build``; a :class:`ConfigError` becomes one stderr line and exit 2.

    ``options`` are the plugin's parsed twistd options: when twistd would
    print its default lines to stdout, the service's log observer is
    installed instead (see :class:`DaemonRoot`). The log settings are
    checked in every case.
    """
    try:
        observer = make_observer(os.environ if environ is None else environ, sys.stdout)
        service = build()
    except ConfigError as e:
        sys.stderr.write(f"{service_name}: {e}\n")
        sys.stderr.flush()
        raise SystemExit(2) from None
    if isinstance(service, DaemonRoot) and _twistd_prints_to_stdout(
        getattr(options, "parent", None)
    ):
        service.log_observer = observer
    return service


class SystemdNotifier:
    """systemd's notify protocol: one datagram per state to ``$NOTIFY_SOCKET``.

    Without ``NOTIFY_SOCKET`` every call is a no-op. The watchdog ping is sent
    from :meth:`progress`, which the service's main loop calls after each tick
    that completed, at most every ``WATCHDOG_USEC / 2``: a wedged loop stops
    the pings and systemd restarts the unit.
    """

    def __init__(self, environ: Mapping[str, str], clock: IReactorTime) -> None:
        address = environ.get("NOTIFY_SOCKET") or ""
        if address.startswith("@"):
            address = "\0" + address[1:]
        self._address = address
        self._clock = clock
        self._ready = False
        self._last_ping: float | None = None
        usec = environ.get("WATCHDOG_USEC") or ""
        watchdog_pid = environ.get("WATCHDOG_PID") or ""
        self._watchdog_interval: float | None = None
        if (
            usec.isdigit()
            and int(usec) > 0
            and (not watchdog_pid or watchdog_pid == str(os.getpid()))
        ):
            self._watchdog_interval = int(usec) / 1e6 / 2

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    @property
    def watchdog_interval(self) -> float | None:
        return self._watchdog_interval

    def _send(self, message: str) -> None:
        if not self._address:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto(message.encode("utf-8"), self._address)
        except OSError as e:
            log.warn(
                "SYSTEMD_NOTIFY_FAILED message={message} error={error}",
                message=message.split("=")[0],
                error=str(e),
            )

    def ready(self) -> None:
        if self._ready:
            return
        self._ready = True
        self._send("READY=1")
        self._last_ping = self._clock.seconds()
        if self._watchdog_interval is not None:
            self._send("WATCHDOG=1")

    def progress(self) -> None:
        """The main loop made progress: ping the watchdog if one is due."""
        if self._watchdog_interval is None or not self._ready:
            return
        now = self._clock.seconds()
        if self._last_ping is None or now - self._last_ping >= self._watchdog_interval:
            self._last_ping = now
            self._send("WATCHDOG=1")

    def stopping(self) -> None:
        self._send("STOPPING=1")

    def status(self, text: str) -> None:
        self._send(f"STATUS={text}")


def watchdog_heartbeat(
    notifier: SystemdNotifier, clock: IReactorTime, name: str = "watchdog"
) -> IService:
    """Feed the watchdog from a reactor timer, for request-driven daemons.

    A service without a poll loop (the mailer) is alive when its reactor
    turns: a timer that fires proves it; a reactor blocked by a stuck call
    stops the pings. Loop-driven daemons call ``notifier.progress()`` from
    their loop instead, which says more.
    """
    interval = notifier.watchdog_interval or 1.0

    async def beat() -> None:
        notifier.progress()

    poller = Poller(beat, interval, clock, name)
    return FunctionService(start=lambda: poller.start(now=False), stop=poller.stop, name=name)
