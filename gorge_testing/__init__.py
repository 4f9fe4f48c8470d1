"""Throwaway servers for the test suite and the benchmarks.

MariaDB and Redis: each starts a real server on a loopback port in a temporary directory
(:class:`~gorge_testing.mariadb_server.MariaDBServer`,
:class:`~gorge_testing.redis_server.RedisServer`), with Phorge's tables on
demand (:mod:`~gorge_testing.phorge_schema`) and a long webhook delivery
history to fill them with (:mod:`~gorge_testing.herald_history`). A
throwaway Phorge on such a MariaDB (:mod:`~gorge_testing.phorge`, given a
checkout in ``GORGE_PHORGE_ROOT``) and gorge's daemons for it as real
``twistd`` processes (:mod:`~gorge_testing.gorge_stack`,
:mod:`~gorge_testing.twistd`) serve the real-Phorge tests and
``bench/phorge.py``. Nothing here runs in a daemon and nothing starts at
import time.
"""
