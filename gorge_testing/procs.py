"""Running a throwaway server process for the duration of a test session."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

# Debian puts the server daemons in /usr/sbin, which is not on every PATH.
_EXTRA_BIN_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")

INSTALL_HINT = "run ./scripts/test.sh once (as root it installs mariadb-server and redis-server)"


class ServerUnavailable(RuntimeError):
    """A throwaway server could not be found or started; the message says why."""


def find_binary(*names: str) -> str:
    """Absolute path of the first of ``names`` found on PATH or in the sbin dirs."""
    search = os.pathsep.join([os.environ.get("PATH", ""), *_EXTRA_BIN_DIRS])
    for name in names:
        found = shutil.which(name, path=search)
        if found:
            return found
    raise ServerUnavailable(
        f"none of {', '.join(names)} found on PATH or in /usr/sbin; {INSTALL_HINT}"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago; callers retry if someone takes it first."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _pdeathsig_prefix() -> list[str]:
    # If pytest is killed before its session teardown runs, the kernel sends
    # SIGTERM to the server so it does not outlive the run. setpriv does this
    # without a preexec_fn (which is unsafe once adbapi threads exist).
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return []
    probe = subprocess.run([setpriv, "--pdeathsig", "TERM", "true"], capture_output=True)
    return [setpriv, "--pdeathsig", "TERM"] if probe.returncode == 0 else []


class ManagedProcess:
    """A child process whose output goes to a log file, stopped on demand."""

    def __init__(self, argv: Sequence[str], log_path: Path, name: str) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self._proc = subprocess.Popen(
            [*_pdeathsig_prefix(), *argv],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C meant for pytest must not hit the server first
        )

    @property
    def pid(self) -> int:
        return self._proc.pid

    def exited(self) -> int | None:
        return self._proc.poll()

    def wait_exit(self, seconds: float) -> int | None:
        """Wait up to ``seconds`` for the process to exit; its status, or None."""
        try:
            return self._proc.wait(seconds)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 30.0) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout)
        self._log.close()


def wait_until_ready(
    proc: ManagedProcess,
    probe: Callable[[], bool],
    deadline_seconds: float,
    poll_seconds: float = 0.05,
) -> None:
    """Poll ``probe`` until it returns True, the process dies, or the deadline passes."""
    deadline = time.monotonic() + deadline_seconds
    while True:
        if proc.exited() is not None:
            raise ServerUnavailable(
                f"{proc.name} exited with status {proc.exited()} before it was ready:\n"
                f"{proc.log_tail()}"
            )
        if probe():
            return
        if time.monotonic() > deadline:
            raise ServerUnavailable(
                f"{proc.name} not ready after {deadline_seconds:.0f}s:\n{proc.log_tail()}"
            )
        # Between probes, wait on the process itself: a server that dies
        # while starting is reported at once instead of after the deadline.
        proc.wait_exit(poll_seconds)


class ThrowawayServer:
    """A server process in its own temporary directory on a free loopback port.

    Subclasses say how to run it (``_argv``), how to tell that it answers
    (``_answers``), and may prepare its directory before the first start
    (``_prepare``) or set it up once it answers (``_after_start``).
    """

    host = "127.0.0.1"
    #: The process name in messages and its log files' stem.
    process_name: str
    ready_deadline_seconds: float
    start_attempts = 3

    def __init__(self, dir_prefix: str) -> None:
        self.port = 0
        self._dir = Path(tempfile.mkdtemp(prefix=dir_prefix))
        self._proc: ManagedProcess | None = None

    def start(self) -> None:
        try:
            self._prepare()
            self._start_with_retries()
            self._after_start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None
        shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _prepare(self) -> None:
        pass

    def _after_start(self) -> None:
        pass

    def _argv(self, log_path: Path) -> list[str]:
        raise NotImplementedError

    def _answers(self) -> bool:
        raise NotImplementedError

    def _start_with_retries(self) -> None:
        # The free port can be taken between probing and binding; try another.
        last_error: ServerUnavailable | None = None
        for attempt in range(self.start_attempts):
            self.port = free_port(self.host)
            log_path = self._dir / f"{self.process_name}-{attempt}.log"
            proc = ManagedProcess(self._argv(log_path), log_path, self.process_name)
            try:
                wait_until_ready(proc, self._answers, self.ready_deadline_seconds)
            except ServerUnavailable as e:
                proc.stop()
                last_error = e
                continue
            self._proc = proc
            return
        assert last_error is not None
        raise last_error
