"""A daemon account without READ ONLY ADMIN (or SUPER) on the session's MariaDB,
and the switch a failover flips: ``SET GLOBAL read_only``. With it, writes
fail with error 1290 as they do on a demoted master."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pymysql

from gorge.config import MySQLSettings

USER, PASSWORD = "gorge_plain", "plain-password"


def root(mariadb) -> pymysql.connections.Connection:
    return pymysql.connect(unix_socket=str(mariadb.socket_path), user="root", autocommit=True)


def set_read_only(mariadb, on: bool) -> None:
    conn = root(mariadb)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SET GLOBAL read_only = {1 if on else 0}")
    finally:
        conn.close()


@contextmanager
def plain_user(mariadb, database: str) -> Iterator[MySQLSettings]:
    """Settings of a user with every privilege on ``database`` and none global,
    as a daemon's account should be; read_only is off again afterwards."""
    conn = root(mariadb)
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"CREATE OR REPLACE USER '{USER}'@'127.0.0.1' IDENTIFIED BY %s", (PASSWORD,)
            )
            cur.execute(f"GRANT ALL PRIVILEGES ON {database}.* TO '{USER}'@'127.0.0.1'")
        yield MySQLSettings(
            host=mariadb.host, port=mariadb.port, user=USER, password=PASSWORD, database=database
        )
    finally:
        set_read_only(mariadb, False)
        with conn.cursor() as cur:
            cur.execute(f"DROP USER IF EXISTS '{USER}'@'127.0.0.1'")
        conn.close()
