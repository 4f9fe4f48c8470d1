"""gorge.httpclient: one quiet, bounded pool per service."""

from twisted.internet.testing import MemoryReactorClock

from gorge.httpclient import make_http_client


def test_pool_settings_and_quiet_factory():
    reactor = MemoryReactorClock()
    client, pool = make_http_client(reactor, max_per_host=7, connect_timeout=3)
    assert pool.maxPersistentPerHost == 7
    assert pool.persistent is True
    assert pool.retryAutomatically is False  # callers own their retries
    assert pool._factory.noisy is False
    assert client._agent._pool is pool
