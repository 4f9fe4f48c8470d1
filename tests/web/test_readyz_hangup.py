"""A /readyz client that hangs up before the check ends gets no late answer,
and the late answer is not an error."""

import pytest_twisted
from prometheus_client import CollectorRegistry
from twisted.internet.defer import Deferred
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.web.resource import Resource

from gorge.web.site import build_site
from tests.support.logcapture import logged_events


@pytest_twisted.ensureDeferred
async def test_an_answer_after_the_client_hung_up_is_dropped_quietly():
    from twisted.internet import reactor

    verdict: Deferred = Deferred()
    asked: Deferred = Deferred()

    async def readiness():
        asked.callback(None)
        return await verdict

    site = build_site(
        api_resource=Resource(),
        prefix="/api/x/",
        token="t",
        body_limit=1024,
        readiness=readiness,
        registry=CollectorRegistry(),
        clock=reactor,
    )
    server_side_gone: Deferred = Deferred()
    build = site.buildProtocol

    def buildProtocol(addr):
        channel = build(addr)
        lost = channel.connectionLost

        def connectionLost(reason):
            lost(reason)
            server_side_gone.callback(None)

        channel.connectionLost = connectionLost
        return channel

    site.buildProtocol = buildProtocol
    port = reactor.listenTCP(0, site, interface="127.0.0.1")
    closed: Deferred = Deferred()

    class AskThenHangUp(Protocol):
        def connectionMade(self):
            self.transport.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")

        def connectionLost(self, reason):
            closed.callback(None)

    factory = ClientFactory.forProtocol(AskThenHangUp)
    try:
        with logged_events() as events:
            connector = reactor.connectTCP("127.0.0.1", port.getHost().port, factory)
            await asked.addTimeout(10, reactor)
            connector.disconnect()
            await closed.addTimeout(10, reactor)
            await server_side_gone.addTimeout(10, reactor)
            verdict.callback(None)
    finally:
        await port.stopListening()
    failures = [e for e in events if "log_failure" in e]
    assert failures == []
    assert [e for e in events if str(e.get("log_format", "")).startswith("READYZ_FAILED")] == []
