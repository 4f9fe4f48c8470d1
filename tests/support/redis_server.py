"""A throwaway redis-server on a loopback port, nothing persisted."""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path

from .procs import (
    ManagedProcess,
    ServerUnavailable,
    find_binary,
    free_port,
    wait_until_ready,
)
from .resp import RespClient

HOST = "127.0.0.1"

_START_ATTEMPTS = 3
_READY_DEADLINE_SECONDS = 30.0


class RedisServer:
    host = HOST

    def __init__(self) -> None:
        self.port = 0
        self._binary = find_binary("redis-server")
        self._dir = Path(tempfile.mkdtemp(prefix="gorge-redis-"))
        self._proc: ManagedProcess | None = None
        self._serial = itertools.count(1)

    def start(self) -> None:
        try:
            self._start_with_retries()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def _start_with_retries(self) -> None:
        # The free port can be taken between probing and binding; try another.
        last_error: ServerUnavailable | None = None
        for attempt in range(_START_ATTEMPTS):
            self.port = free_port(HOST)
            argv = [
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
            proc = ManagedProcess(
                argv, self._dir / f"redis-{attempt}.log", "redis-server"
            )
            try:
                wait_until_ready(proc, self._answers, _READY_DEADLINE_SECONDS)
            except ServerUnavailable as e:
                proc.stop()
                last_error = e
                continue
            self._proc = proc
            return
        assert last_error is not None
        raise last_error

    def _answers(self) -> bool:
        try:
            with RespClient(self.host, self.port, timeout=2) as client:
                return client.execute("PING") == "PONG"
        except OSError:
            return False

    # -- what tests use ------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def client(self, db: int = 0) -> RespClient:
        """A synchronous client for test set-up and assertions (close it, or use ``with``)."""
        return RespClient(self.host, self.port, db=db)

    def settings(self, db: int = 0):
        """``gorge.redis.RedisSettings`` for this server."""
        from gorge.redis import RedisSettings

        return RedisSettings(host=self.host, port=self.port, db=db)

    def unique_prefix(self, label: str = "t") -> str:
        """A key prefix no other test in this session gets, e.g. ``t7:``."""
        return f"{label}{next(self._serial)}:"
