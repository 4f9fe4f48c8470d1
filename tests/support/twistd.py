"""Running the daemons as real ``twistd`` processes from the source tree."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from twisted.internet.defer import Deferred, TimeoutError as DeferredTimeout
from twisted.internet.protocol import ProcessProtocol

from .paths import REPO_ROOT

# Exactly what the twistd console script runs.
TWISTD = [sys.executable, "-c", "from twisted.scripts.twistd import run; run()"]
# How the units run a daemon.
DAEMON_ARGS = ["--nodaemon", "--pidfile=", "--logger=gorge.logging.observer_from_env"]


def daemon_environ(extra: Mapping[str, str] = {}, *, drop: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment without the variables whose names start with
    one of ``drop``, with the repository first on ``PYTHONPATH`` (so twistd
    finds the plugins of this tree), then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
    )
    env.update(extra)
    return env


class TwistdDaemon:
    """``twistd`` running ``tapname`` the way the units run it, its output in
    ``log_path``. :meth:`kill` is the caller's clean-up."""

    def __init__(self, tapname: str, env: Mapping[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [*TWISTD, *DAEMON_ARGS, tapname],
            cwd=REPO_ROOT,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C meant for pytest must not hit it first
        )

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if not self._log.closed:
            self._log.close()


class TwistdProcess(ProcessProtocol):
    """``twistd ARGS tapname`` spawned through the test's reactor.

    Its output is collected as it arrives, so a test can wait (bounded) for a
    line instead of polling; :attr:`ended` fires with the exit reason.
    """

    def __init__(self, reactor, tapname: str, env: Mapping[str, str],
                 args: tuple[str, ...] = ("--nodaemon", "--pidfile=")) -> None:
        self._reactor = reactor
        self.output = b""
        self.ended: Deferred = Deferred()
        self._waiters: list[tuple[re.Pattern[bytes], Deferred]] = []
        self.transport = reactor.spawnProcess(
            self, sys.executable, [*TWISTD, *args, tapname], env=dict(env), path=str(REPO_ROOT))

    def outReceived(self, data: bytes) -> None:
        self.output += data
        for waiter in list(self._waiters):
            pattern, d = waiter
            match = pattern.search(self.output)
            if match is not None:
                self._waiters.remove(waiter)
                if not d.called:  # else it timed out already
                    d.callback(match)

    errReceived = outReceived

    def processEnded(self, reason) -> None:
        for _, d in self._waiters:
            if not d.called:
                d.errback(AssertionError(
                    f"twistd ended before the line:\n{self.text()[-3000:]}"))
        self._waiters = []
        self.ended.callback(reason.value)

    def text(self) -> str:
        return self.output.decode("utf-8", "replace")

    def lines(self) -> list[str]:
        return self.text().splitlines()

    async def wait_for(self, pattern: str | bytes, timeout: float = 60.0) -> re.Match[bytes]:
        """The first match of the regular expression ``pattern`` in the output."""
        regex = re.compile(pattern.encode() if isinstance(pattern, str) else pattern)
        match = regex.search(self.output)
        if match is not None:
            return match
        if self.ended.called:
            raise AssertionError(f"twistd ended before {pattern!r}:\n{self.text()[-3000:]}")
        d: Deferred = Deferred()
        self._waiters.append((regex, d))
        try:
            return await d.addTimeout(timeout, self._reactor)
        except DeferredTimeout:
            raise AssertionError(
                f"no {pattern!r} within {timeout} s:\n{self.text()[-3000:]}") from None

    async def listening_port(self, timeout: float = 60.0) -> int:
        """The port of the service's listener, from twistd's 'starting on' line."""
        match = await self.wait_for(rb"starting on (\d+)", timeout)
        return int(match.group(1))

    async def serving(self, timeout: float = 60.0) -> int:
        """The listener's port, once the daemon has answered ``GET /healthz``.

        twistd binds the port and starts the services before its reactor
        runs and installs the signal handlers; an answer proves both.
        """
        port = await self.listening_port(timeout)
        await healthz(self._reactor, port, timeout)
        return port

    def signal(self, name: str) -> None:
        self.transport.signalProcess(name)

    async def stop(self, timeout: float = 60.0):
        """SIGTERM, then the exit reason once the process has ended."""
        if not self.ended.called:
            self.signal("TERM")
        return await self.wait_ended(timeout)

    async def wait_ended(self, timeout: float = 60.0):
        """The exit reason (``ProcessDone`` or ``ProcessTerminated``)."""
        waiter: Deferred = Deferred()

        def passthrough(reason):
            if not waiter.called:
                waiter.callback(reason)
            return reason

        self.ended.addCallback(passthrough)
        try:
            return await waiter.addTimeout(timeout, self._reactor)
        except DeferredTimeout:
            raise AssertionError(f"twistd still running after {timeout} s") from None

    def kill(self) -> None:
        if not self.ended.called:
            self.signal("KILL")


async def healthz(reactor, port: int, timeout: float = 60.0) -> None:
    """``GET /healthz`` on a connection of its own, closed after the answer."""
    import treq

    response = await treq.get(f"http://127.0.0.1:{port}/healthz", persistent=False,
                              reactor=reactor).addTimeout(timeout, reactor)
    await response.content()
    assert response.code == 200, response.code
