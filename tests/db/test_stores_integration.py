"""gorge.db.mysql (through the SQL layer's MySQL engine) and gorge.db.redis against the
throwaway servers."""

import pytest
import pytest_twisted
from twisted.internet import reactor

from gorge.config import MySQLSettings
from gorge.db import MySQLEngine
from gorge.db.mysql import is_transient, make_pool
from gorge.db.redis import LuaScript, RedisSettings, make_redis
from gorge.db.redis import ping as redis_ping

pytestmark = pytest.mark.integration


async def mysql_ping(pool, clock) -> str | None:
    return await MySQLEngine().ping(pool, clock, 5)


@pytest_twisted.ensureDeferred
async def test_pool_is_lazy_and_readiness_follows_database_creation(mariadb):
    name = "t_platform_late_db"
    settings = MySQLSettings(
        host=mariadb.host,
        port=mariadb.port,
        user=mariadb.user,
        password=mariadb.password,
        database=name,
    )
    pool = make_pool(settings, reactor)  # connects nowhere yet
    try:
        assert await mysql_ping(pool, reactor) == "ping database: unknown database"
        mariadb.create_database("worker", name=name)
        assert await mysql_ping(pool, reactor) is None  # same pool, no restart
    finally:
        pool.close()


@pytest_twisted.ensureDeferred
async def test_ping_reports_unreachable_server_without_secrets():
    settings = MySQLSettings(
        host="127.0.0.1", port=1, user="u", password="hunter2", database="d", connect_timeout=2
    )
    pool = make_pool(settings, reactor)
    try:
        reason = await mysql_ping(pool, reactor)
    finally:
        pool.close()
    assert reason == "ping database: unreachable"
    assert "hunter2" not in reason


def test_transient_classification():
    import pymysql

    assert is_transient(pymysql.err.OperationalError(2013, "Lost connection"))
    assert is_transient(pymysql.err.OperationalError(2006, "gone away"))
    assert not is_transient(pymysql.err.ProgrammingError(1146, "no such table"))


@pytest_twisted.ensureDeferred
async def test_lua_script_survives_script_flush(redis_server, redis_prefix):
    conn = make_redis(RedisSettings(host=redis_server.host, port=redis_server.port))
    try:
        script = LuaScript("redis.call('SET', KEYS[1], ARGV[1]); return redis.call('GET', KEYS[1])")
        key = redis_prefix + "k"
        assert await script.run(conn, keys=[key], args=["0012"]) == "0012"  # no number conversion
        await conn.execute_command("SCRIPT", "FLUSH")
        assert await script.run(conn, keys=[key], args=["v2"]) == "v2"
        assert await redis_ping(conn, reactor) is None
    finally:
        await conn.disconnect()


@pytest_twisted.ensureDeferred
async def test_redis_ping_to_dead_server_is_bounded():
    conn = make_redis(RedisSettings(host="127.0.0.1", port=1, connect_timeout=1))
    try:
        reason = await redis_ping(conn, reactor, timeout=2)
    finally:
        await conn.disconnect()
    assert reason in ("redis unreachable", "redis ping timed out")
