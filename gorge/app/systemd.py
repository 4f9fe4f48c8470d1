"""systemd's notify protocol: READY, WATCHDOG pings while the main loop
turns, STOPPING."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from twisted.application.service import IService
from twisted.internet.interfaces import IReactorTime

from gorge.app.poller import Poller
from gorge.app.tree import FunctionService
from gorge.log.logger import Logger

log = Logger()


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
