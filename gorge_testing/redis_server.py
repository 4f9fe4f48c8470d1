"""A throwaway redis-server on a loopback port, nothing persisted."""

from __future__ import annotations

import itertools
from pathlib import Path

from gorge_testing.procs import ThrowawayServer, find_binary
from gorge_testing.resp import RespClient

HOST = "127.0.0.1"

_READY_DEADLINE_SECONDS = 30.0


class RedisServer(ThrowawayServer):
    host = HOST
    process_name = "redis-server"
    ready_deadline_seconds = _READY_DEADLINE_SECONDS

    def __init__(self) -> None:
        self._binary = find_binary("redis-server")
        super().__init__("gorge-redis-")
        self._serial = itertools.count(1)

    def _argv(self, log_path: Path) -> list[str]:
        # An empty --logfile sends the log to stdout, which goes to log_path.
        return [
            self._binary,
            "--port",
            str(self.port),
            "--bind",
            HOST,
            "--dir",
            str(self._dir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--logfile",
            "",
        ]

    def _answers(self) -> bool:
        try:
            with RespClient(self.host, self.port, timeout=2) as client:
                return client.execute("PING") == "PONG"
        except OSError:
            return False

    # -- what tests use ------------------------------------------------------

    def client(self, db: int = 0) -> RespClient:
        """A synchronous client for test set-up and assertions (close it, or use ``with``)."""
        return RespClient(self.host, self.port, db=db)

    def settings(self, db: int = 0):
        """``gorge.redis.RedisSettings`` for this server."""
        from gorge.db.redis import RedisSettings

        return RedisSettings(host=self.host, port=self.port, db=db)

    def unique_prefix(self, label: str = "t") -> str:
        """A key prefix no other test in this session gets, e.g. ``t7:``."""
        return f"{label}{next(self._serial)}:"
