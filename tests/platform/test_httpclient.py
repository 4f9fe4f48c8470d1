"""gorge.httpclient: one quiet, bounded pool per service."""

from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.protocols.tls import TLSMemoryBIOProtocol

from gorge.httpclient import OneShotBody, make_http_client, make_pool


def test_pool_settings_and_quiet_factory():
    reactor = MemoryReactorClock()
    client, pool = make_http_client(reactor, max_per_host=7, connect_timeout=3)
    assert pool.maxPersistentPerHost == 7
    assert pool.persistent is True
    assert pool.retryAutomatically is False  # callers own their retries
    assert pool._factory.noisy is False
    assert client._agent._pool is pool


def test_bare_pool_has_the_same_settings():
    pool = make_pool(MemoryReactorClock(), max_per_host=3)
    assert (pool.maxPersistentPerHost, pool.persistent, pool.retryAutomatically) == (3, True, False)
    assert pool._factory.noisy is False
    assert make_pool(MemoryReactorClock(), max_per_host=3,
                     retry_automatically=True).retryAutomatically is True


def test_one_shot_body_writes_everything_at_once_and_says_so():
    body = OneShotBody(b"payload")
    assert body.length == 7 and body.handed_over is False
    consumer = StringTransport()
    body.startProducing(consumer)
    assert consumer.value() == b"payload"
    assert body.handed_over is True


def test_one_shot_body_over_tls_is_not_handed_over_before_the_handshake():
    class _Tls(TLSMemoryBIOProtocol):
        def __init__(self, done: bool) -> None:
            self._handshakeDone = done
            self.written: list[bytes] = []

        def write(self, data: bytes) -> None:
            self.written.append(data)

    for done in (False, True):
        tls = _Tls(done)
        body = OneShotBody(b"x")
        body.startProducing(tls)
        assert tls.written == [b"x"]
        assert body.handed_over is done
