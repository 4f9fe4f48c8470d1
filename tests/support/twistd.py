"""Running the daemons as real ``twistd`` processes from the source tree.

:class:`TwistdDaemon` and :func:`daemon_environ` live in gorge_testing (the
benchmarks use them too); :class:`TwistdProcess` is the tests' own.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping

from twisted.internet.defer import Deferred
from twisted.internet.defer import TimeoutError as DeferredTimeout
from twisted.internet.protocol import ProcessProtocol

from gorge_testing.twistd import DAEMON_ARGS, TWISTD, TwistdDaemon, daemon_environ
from tests.support.paths import REPO_ROOT

__all__ = ["DAEMON_ARGS", "TWISTD", "TwistdDaemon", "TwistdProcess", "daemon_environ", "healthz"]


class TwistdProcess(ProcessProtocol):
    """``twistd ARGS tapname`` spawned through the test's reactor.

    Its output is collected as it arrives, so a test can wait (bounded) for a
    line instead of polling; :attr:`ended` fires with the exit reason.
    """

    def __init__(
        self,
        reactor,
        tapname: str,
        env: Mapping[str, str],
        args: tuple[str, ...] = ("--nodaemon", "--pidfile="),
    ) -> None:
        self._reactor = reactor
        self.output = b""
        self.ended: Deferred = Deferred()
        self._waiters: list[tuple[re.Pattern[bytes], Deferred]] = []
        self.transport = reactor.spawnProcess(
            self, sys.executable, [*TWISTD, *args, tapname], env=dict(env), path=str(REPO_ROOT)
        )

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
                d.errback(AssertionError(f"twistd ended before the line:\n{self.text()[-3000:]}"))
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
                f"no {pattern!r} within {timeout} s:\n{self.text()[-3000:]}"
            ) from None

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

    response = await treq.get(
        f"http://127.0.0.1:{port}/healthz", persistent=False, reactor=reactor
    ).addTimeout(timeout, reactor)
    await response.content()
    assert response.code == 200, response.code
