"""gorge.httpclient: one quiet, bounded pool per service."""

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, wrapClientTLS
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.ssl import optionsForClientTLS
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.web import resource, server
from twisted.web.client import Agent, ResponseNeverReceived
from twisted.web.iweb import IAgentEndpointFactory
from zope.interface import implementer

from gorge.httpclient import OneShotBody, QuietEndpoint, make_http_client, make_pool
from tests.mailer.smtpserver import make_certificate
from tests.support.logcapture import logged_events


@pytest.fixture
def reactor():
    from twisted.internet import reactor as global_reactor  # real connections

    return global_reactor


class Hello(resource.Resource):
    isLeaf = True

    def render_POST(self, request):
        return b"hello " + request.content.read()


class Tracked(server.Site):
    """Counts connections that ended, to see the pool close its own."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.closed: list[Deferred] = []

    def buildProtocol(self, addr):
        channel = super().buildProtocol(addr)
        ended = Deferred()
        self.closed.append(ended)
        lost = channel.connectionLost

        def connectionLost(reason):
            lost(reason)
            ended.callback(None)

        channel.connectionLost = connectionLost
        return channel


def test_pool_settings():
    _, pool = make_http_client(MemoryReactorClock(), max_per_host=7, connect_timeout=3)
    assert pool.maxPersistentPerHost == 7
    assert pool.persistent is True
    assert pool.retryAutomatically is False  # callers own their retries


def test_bare_pool_has_the_same_settings():
    pool = make_pool(MemoryReactorClock(), max_per_host=3)
    assert (pool.maxPersistentPerHost, pool.persistent, pool.retryAutomatically) == (3, True, False)
    assert make_pool(MemoryReactorClock(), max_per_host=3,
                     retry_automatically=True).retryAutomatically is True


@pytest_twisted.ensureDeferred
async def test_the_client_keeps_its_connections_in_its_pool_and_logs_no_factory_lines(reactor):
    site = Tracked(Hello())
    site.noisy = False
    port = reactor.listenTCP(0, site, interface="127.0.0.1")
    try:
        client, pool = make_http_client(reactor, max_per_host=2, connect_timeout=5)
        url = f"http://127.0.0.1:{port.getHost().port}/".encode()
        with logged_events() as events:
            for _ in range(2):
                response = await client.post(url, data=b"x").addTimeout(10, reactor)
                assert await response.content() == b"hello x"
        assert len(site.closed) == 1  # the second request reused the connection
        assert not site.closed[0].called
        await pool.closeCachedConnections()
        await site.closed[0].addTimeout(10, reactor)  # the client's pool held it
    finally:
        await port.stopListening()
    factory_lines = [e for e in events if "factory" in str(e.get("log_format", "")).lower()]
    assert factory_lines == []


def test_one_shot_body_writes_everything_at_once_and_says_so():
    body = OneShotBody(b"payload")
    assert body.length == 7 and body.handed_over is False
    consumer = StringTransport()
    body.startProducing(consumer)
    assert consumer.value() == b"payload"
    assert body.handed_over is True


class Recorded(OneShotBody):
    def __init__(self, body: bytes) -> None:
        super().__init__(body)
        self.started: Deferred = Deferred()

    def startProducing(self, consumer):
        result = super().startProducing(consumer)
        self.started.callback(None)
        return result


@implementer(IAgentEndpointFactory)
class TLSTo:
    def __init__(self, reactor, port: int, trust_root) -> None:
        self.reactor, self.port, self.trust_root = reactor, port, trust_root

    def endpointForURI(self, uri):
        plain = TCP4ClientEndpoint(self.reactor, "127.0.0.1", self.port, timeout=5)
        tls = optionsForClientTLS("localhost", trustRoot=self.trust_root)
        return QuietEndpoint(wrapClientTLS(tls, plain))


@pytest_twisted.ensureDeferred
async def test_a_body_written_before_the_tls_handshake_is_not_handed_over(reactor):
    # A server that accepts the connection and never answers the handshake:
    # the Agent writes the request at once, and TLS keeps it in its buffer.
    heard: Deferred = Deferred()

    class Silent(Protocol):
        def dataReceived(self, data):
            if not heard.called:
                heard.callback(None)

    cert = make_certificate()
    port = reactor.listenTCP(0, Factory.forProtocol(Silent), interface="127.0.0.1")
    body = Recorded(b"secret")
    agent = Agent.usingEndpointFactory(reactor, TLSTo(reactor, port.getHost().port,
                                                      cert.trust_root))
    request = agent.request(b"POST", b"https://localhost/", bodyProducer=body)
    try:
        await body.started.addTimeout(10, reactor)
        await heard.addTimeout(10, reactor)  # the ClientHello arrived, nothing more will
        # If this fails after a Twisted upgrade, LengthEnforcingConsumer no
        # longer keeps the transport in _consumer: see gorge.httpclient._transport_under.
        assert body.handed_over is False, "the TLS transport under the Agent's consumer was lost"
    finally:
        request.cancel()
        await port.stopListening()
    with pytest.raises(ResponseNeverReceived):
        await request


@pytest_twisted.ensureDeferred
async def test_a_body_sent_over_an_established_tls_connection_is_handed_over(reactor):
    cert = make_certificate()
    site = server.Site(Hello())
    site.noisy = False
    port = reactor.listenSSL(0, site, cert.server_options, interface="127.0.0.1")
    try:
        body = Recorded(b"x")
        agent = Agent.usingEndpointFactory(reactor, TLSTo(reactor, port.getHost().port,
                                                          cert.trust_root))
        response = await agent.request(b"POST", b"https://localhost/",
                                       bodyProducer=body).addTimeout(10, reactor)
        assert response.code == 200
        assert body.handed_over is True
    finally:
        await port.stopListening()
