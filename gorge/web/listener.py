"""The HTTP listener service: listens on the configured endpoint and, on
stop, closes idle connections and lets open ones finish within a budget."""

from __future__ import annotations

from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort, IReactorTime
from twisted.python.failure import Failure

from gorge.log.logger import Logger

HTTP_DRAIN_TIMEOUT = 10.0

log = Logger()


class HTTPListener(Service):
    """The HTTP listener. Stopping it refuses new connections and finishes
    the requests that have already arrived, within ``drain_timeout``.

    A request whose body is still arriving when the stop begins is read to
    its end, handled and answered; idle kept-alive connections close at once.
    That is the site's job (``gorge.web.GorgeSite.drain``); a plain Site
    only stops accepting.
    """

    def __init__(
        self, endpoint: str, site: Any, *, drain_timeout: float, reactor: Any, clock: IReactorTime
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
    site: Any,
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
