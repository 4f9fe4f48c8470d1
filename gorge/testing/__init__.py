"""Throwaway MariaDB and Redis servers for the test suite and the benchmarks.

Both start a real server on a loopback port in a temporary directory
(:class:`~gorge.testing.mariadb_server.MariaDBServer`,
:class:`~gorge.testing.redis_server.RedisServer`), with Phorge's tables on
demand (:mod:`~gorge.testing.phorge_schema`) and a long webhook delivery
history to fill them with (:mod:`~gorge.testing.herald_history`). Nothing
here runs in a daemon and nothing starts at import time.
"""
