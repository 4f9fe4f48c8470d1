"""A minimal synchronous Redis client for test set-up and assertions.

Test code only (txredisapi is what the services use): one blocking socket,
RESP2 requests and replies, no pipelining.
"""

from __future__ import annotations

import socket


class RedisReplyError(Exception):
    """The server answered with an error reply (``-ERR ...``)."""


class RespClient:
    def __init__(self, host: str, port: int, *, db: int = 0, timeout: float = 10.0) -> None:
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._file = self._sock.makefile("rb")
        if db:
            self.execute("SELECT", db)

    def close(self) -> None:
        self._file.close()
        self._sock.close()

    def __enter__(self) -> RespClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def execute(self, *args: object):
        """Send one command; return the decoded reply (bytes for bulk strings)."""
        self._sock.sendall(encode_command(args))
        return self._read_reply()

    def _read_reply(self):
        line = self._file.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("connection closed by redis")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisReplyError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            data = self._file.read(size + 2)
            return data[:-2]
        if kind == b"*":
            count = int(rest)
            return None if count < 0 else [self._read_reply() for _ in range(count)]
        raise ConnectionError(f"unexpected reply from redis: {line[:40]!r}")


def encode_command(args) -> bytes:
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)
