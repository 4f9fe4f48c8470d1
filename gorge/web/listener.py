"""The HTTP listener service: listens on the configured endpoint (plain
HTTP, or HTTPS with :class:`~gorge.web.tls.ServerTLS`) and, on stop, closes
idle connections and lets open ones finish within a budget."""

from __future__ import annotations

from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort, IReactorTime
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.failure import Failure

from gorge.app.hangup import ReloadOnHangup
from gorge.config import ListenerTLS
from gorge.log.logger import Logger
from gorge.web.tls import ServerTLS

HTTP_DRAIN_TIMEOUT = 10.0

log = Logger()


class HTTPListener(Service):
    """The HTTP listener. Stopping it refuses new connections and finishes
    the requests that have already arrived, within ``drain_timeout``.

    A request whose body is still arriving when the stop begins is read to
    its end, handled and answered; idle kept-alive connections close at once.
    That is the site's job (``gorge.web.GorgeSite.drain``); a plain Site
    only stops accepting.

    With ``tls`` the listener speaks HTTPS: the files are loaded here, so a
    bad one stops the build with its setting named, and again on each SIGHUP
    while the listener runs.
    """

    def __init__(
        self,
        endpoint: str,
        site: Any,
        *,
        drain_timeout: float,
        reactor: Any,
        clock: IReactorTime,
        tls: ListenerTLS | None = None,
    ) -> None:
        self.site = site
        self.listening_port: IListeningPort | None = None
        self._endpoint = endpoint
        self._drain_timeout = drain_timeout
        self._reactor = reactor
        self._clock = clock
        self.tls: ServerTLS | None = None
        self._hangup: ReloadOnHangup | None = None
        if tls is not None:
            self.tls = ServerTLS(tls)
            self._hangup = ReloadOnHangup(self.tls.reload, reactor, name="http-tls-reload")

    def _factory(self) -> Any:
        if self.tls is None:
            return self.site
        # The site's channels run inside TLS unchanged: the hot channel's
        # writes go through the TLS transport (write_now sees no TCP socket).
        factory = TLSMemoryBIOFactory(self.tls, False, self.site)
        factory.noisy = False
        return factory

    def privilegedStartService(self) -> None:
        super().privilegedStartService()
        if self.listening_port is not None:
            return
        listening = serverFromString(self._reactor, self._endpoint).listen(self._factory())
        outcome: list = []
        listening.addBoth(outcome.append)
        # TCP listens synchronously: a bind failure raises here and aborts start-up.
        if isinstance(outcome[0], Failure):
            outcome[0].raiseException()
        self.listening_port = outcome[0]

    def startService(self) -> None:
        super().startService()
        self.privilegedStartService()  # when started without the privileged step
        if self.tls is not None and self._hangup is not None:
            self._hangup.startService()
            log.info(
                "HTTP_TLS_SERVING subject={subject} not_after={not_after} client_ca={client_ca}",
                **self.tls.describe(),
            )

    def stopService(self) -> Deferred:
        super().stopService()
        if self._hangup is not None and self._hangup.running:
            self._hangup.stopService()
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
    tls: ListenerTLS | None = None,
) -> HTTPListener:
    """The HTTP listener for ``site`` on the strports ``endpoint``; HTTPS with
    ``tls`` (the settings' ``http.tls``).

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
        tls=tls,
    )
