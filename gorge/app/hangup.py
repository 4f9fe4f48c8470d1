"""SIGHUP: read again the local files a daemon read when it started.

A daemon reads the files it consults while running (the worker's feed
policy, the mailer's sendmail binary) once at start-up, never on the reactor
thread for each task or send; ``kill -HUP`` makes it read them again."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from twisted.application.service import Service

from gorge.log.logger import Logger

log = Logger()


class ReloadOnHangup(Service):
    """While running, call ``reload`` in the reactor thread on each SIGHUP.

    The handler installed before this one still runs (the demo puts several
    daemons in one process, each with its own service), and is put back when
    this service stops; the ordered parent stops children in reverse, so the
    handlers come off in the order they went on.
    """

    def __init__(self, reload: Callable[[], object], reactor: Any, name: str) -> None:
        self._reload = reload
        self._reactor = reactor
        self._previous: Any = None
        self.setName(name)

    def startService(self) -> None:
        super().startService()
        self._previous = signal.signal(signal.SIGHUP, self._hangup)

    def stopService(self) -> None:
        super().stopService()
        previous, self._previous = self._previous, None
        signal.signal(signal.SIGHUP, previous if previous is not None else signal.SIG_DFL)

    def _hangup(self, signum: int, frame: Any) -> None:
        # A signal handler may interrupt the reactor anywhere; callFromThread
        # is the one reactor call that is safe from here.
        self._reactor.callFromThread(self._reload_now)
        if callable(self._previous):
            self._previous(signum, frame)

    def _reload_now(self) -> None:
        try:
            self._reload()
        except Exception:
            log.failure("RELOAD_FAILED service={service}", service=self.name)
