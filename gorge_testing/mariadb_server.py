"""A throwaway MariaDB server on a loopback port, with Phorge schemas on demand."""

from __future__ import annotations

import itertools
import os
import subprocess
from pathlib import Path

import pymysql

from gorge_testing.phorge_schema import create_statements
from gorge_testing.procs import ServerUnavailable, ThrowawayServer, find_binary

HOST = "127.0.0.1"
USER = "gorge"
# A real password, so code under test has to pass credentials through.
PASSWORD = "gorge-test-password"

_READY_DEADLINE_SECONDS = 90.0

# Speed over durability: the data directory is deleted at the end of the run.
_SERVER_OPTIONS = (
    "--skip-log-bin",
    "--skip-name-resolve",
    "--innodb-flush-log-at-trx-commit=0",
    "--innodb-doublewrite=0",
    "--innodb-buffer-pool-size=64M",
    "--innodb-log-file-size=16M",
    "--innodb-fast-shutdown=2",
    "--sync-binlog=0",
    "--max-connections=500",
    "--character-set-server=utf8mb4",
    "--collation-server=utf8mb4_bin",
    "--performance-schema=OFF",
)


class MariaDBServer(ThrowawayServer):
    """One mariadbd in a temporary directory, reachable at ``host:port`` over TCP."""

    host = HOST
    user = USER
    password = PASSWORD
    process_name = "mariadbd"
    ready_deadline_seconds = _READY_DEADLINE_SECONDS

    def __init__(
        self, extra_options: tuple[str, ...] = (), *, server_id: int | None = None
    ) -> None:
        # ``extra_options``: more mariadbd options, e.g. a certificate to offer TLS.
        # ``server_id``: a binary log and this id, so that the server can be a
        # replication primary or replica (:class:`ReplicatedPair`).
        self._extra_options = tuple(extra_options)
        self.server_id = server_id
        self._mariadbd = find_binary("mariadbd", "mysqld")
        self._install_db = find_binary("mariadb-install-db", "mysql_install_db")
        super().__init__("gorge-mariadb-")
        self._serial = itertools.count(1)

    # -- lifecycle -----------------------------------------------------------

    def _prepare(self) -> None:
        self._install()

    def _after_start(self) -> None:
        self._create_user()

    def _as_root_options(self) -> list[str]:
        # mariadbd refuses to run as root unless told to.
        return ["--user=root"] if os.geteuid() == 0 else []

    def _install(self) -> None:
        log = self._dir / "install.log"
        argv = [
            self._install_db,
            "--no-defaults",
            f"--datadir={self._dir / 'data'}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--skip-name-resolve",
            # The bootstrap must shut down cleanly, so none of the
            # durability shortcuts of _SERVER_OPTIONS apply here.
            "--innodb-buffer-pool-size=64M",
            *self._as_root_options(),
        ]
        with open(log, "wb") as out:
            status: int | str
            try:
                status = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=_READY_DEADLINE_SECONDS,
                ).returncode
            except subprocess.TimeoutExpired:
                status = "timeout"
        if status != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            raise ServerUnavailable(f"mariadb-install-db failed ({status}):\n{tail}")

    def _argv(self, log_path: Path) -> list[str]:
        return [
            self._mariadbd,
            "--no-defaults",
            *self._as_root_options(),
            f"--datadir={self._dir / 'data'}",
            f"--socket={self.socket_path}",
            f"--pid-file={self._dir / 'mariadbd.pid'}",
            f"--tmpdir={self._dir}",
            f"--log-error={log_path}",
            f"--port={self.port}",
            f"--bind-address={HOST}",
            "--skip-networking=0",
            *_SERVER_OPTIONS,
            *self._replication_options(),
            *self._extra_options,
        ]

    def _replication_options(self) -> list[str]:
        if self.server_id is None:
            return []
        # After _SERVER_OPTIONS: the later --log-bin wins over --skip-log-bin.
        return [
            f"--server-id={self.server_id}",
            f"--log-bin={self._dir / 'data' / 'binlog'}",
            "--binlog-format=ROW",
            # A promoted replica writes a binary log of its own.
            "--log-slave-updates",
            f"--relay-log={self._dir / 'data' / 'relay'}",
        ]

    @property
    def socket_path(self) -> Path:
        return self._dir / "mariadbd.sock"

    def _answers(self) -> bool:
        try:
            conn = pymysql.connect(
                unix_socket=str(self.socket_path),
                user="root",
                connect_timeout=2,
                read_timeout=5,
            )
        except pymysql.err.OperationalError:
            return False
        conn.close()
        return True

    def _create_user(self) -> None:
        # Root connects over the socket only; tests use a password-protected
        # account over TCP, like a real deployment.
        conn = pymysql.connect(
            unix_socket=str(self.socket_path),
            user="root",
            autocommit=True,
            connect_timeout=5,
            read_timeout=30,
        )
        try:
            with conn.cursor() as cur:
                # Each server of a replicated pair has the account already: a
                # replica replaying the primary's CREATE USER would stop.
                cur.execute("SET SESSION sql_log_bin = 0")
                cur.execute(f"CREATE USER '{USER}'@'{HOST}' IDENTIFIED BY %s", (PASSWORD,))
                cur.execute(f"GRANT ALL PRIVILEGES ON *.* TO '{USER}'@'{HOST}'")
        finally:
            conn.close()

    # -- what tests use ------------------------------------------------------

    def root(self) -> pymysql.connections.Connection:
        """An autocommit root session over the socket (global variables, replication)."""
        return pymysql.connect(
            unix_socket=str(self.socket_path),
            user="root",
            autocommit=True,
            connect_timeout=5,
            read_timeout=60,
        )

    def root_execute(self, *statements: str) -> list[tuple]:
        """Run ``statements`` as root; the rows of the last one."""
        conn = self.root()
        try:
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
                return list(cur.fetchall())
        finally:
            conn.close()

    def connect(self, database: str | None = None) -> pymysql.connections.Connection:
        """A synchronous autocommit connection for test set-up and assertions."""
        return pymysql.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            database=database,
            charset="utf8mb4",
            autocommit=True,
            connect_timeout=5,
            read_timeout=30,
            write_timeout=30,
        )

    def create_database(self, schema: str, name: str | None = None) -> str:
        """Create a fresh database holding Phorge's ``schema`` tables; return its name."""
        name = name or f"t_{schema}_{next(self._serial)}"
        statements = create_statements(schema, name)
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
        finally:
            conn.close()
        return name

    def settings(self, database: str):
        """``gorge.config.MySQLSettings`` for ``database`` on this server."""
        from gorge.config import MySQLSettings

        return MySQLSettings(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            database=database,
        )


REPLICATION_USER = "gorge_repl"
REPLICATION_PASSWORD = "gorge-repl-password"


class ReplicatedPair:
    """Two throwaway MariaDB servers, a primary and a replica following it
    through GTID replication, as in a Phorge database cluster. The replica
    starts read-only; :meth:`promote` makes it a writable master the way an
    operator does (``STOP SLAVE``, ``SET GLOBAL read_only=0``).

    What is created on the primary reaches the replica by replication, the
    databases and accounts of a test included; :meth:`caught_up` waits for it.
    """

    def __init__(self) -> None:
        self.primary = MariaDBServer(server_id=1)
        self.replica = MariaDBServer(server_id=2)

    def start(self) -> None:
        self.primary.start()
        try:
            self.replica.start()
            self.primary.root_execute(
                "SET SESSION sql_log_bin = 0",
                f"CREATE USER '{REPLICATION_USER}'@'{HOST}' IDENTIFIED BY '{REPLICATION_PASSWORD}'",
                f"GRANT REPLICATION SLAVE ON *.* TO '{REPLICATION_USER}'@'{HOST}'",
            )
            self.replica.root_execute(
                "SET GLOBAL read_only = 1",
                f"CHANGE MASTER TO MASTER_HOST='{HOST}', MASTER_PORT={self.primary.port},"
                f" MASTER_USER='{REPLICATION_USER}', MASTER_PASSWORD='{REPLICATION_PASSWORD}',"
                " MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1",
                "START SLAVE",
            )
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self.replica.stop()
        self.primary.stop()

    def caught_up(self, seconds: float = 60.0) -> None:
        """Wait (server-side, bounded) until the replica has applied everything
        the primary has written so far."""
        ((position,),) = self.primary.root_execute("SELECT @@global.gtid_binlog_pos")
        ((waited,),) = self.replica.root_execute(
            f"SELECT MASTER_GTID_WAIT('{position}', {seconds})"
        )
        if waited != 0:
            status = self.replica.root_execute("SHOW SLAVE STATUS")
            raise AssertionError(f"replica not at {position} after {seconds} s: {status}")

    def set_read_only(self, server: MariaDBServer, on: bool) -> None:
        server.root_execute(f"SET GLOBAL read_only = {1 if on else 0}")

    def promote(self) -> None:
        """The replica becomes the master: caught up, replication stopped, writable."""
        self.caught_up()
        self.replica.root_execute("STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = 0")
