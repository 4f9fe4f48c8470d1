"""Running the daemons as real ``twistd`` processes from this source tree."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

# The folder that holds the ``gorge`` package (and, in a checkout, ``twisted/plugins``).
SOURCE_ROOT = Path(__file__).resolve().parents[1]
# Exactly what the twistd console script runs.
TWISTD = [sys.executable, "-c", "from twisted.scripts.twistd import run; run()"]
# How the systemd units run a daemon.
DAEMON_ARGS = ["--nodaemon", "--pidfile=", "--logger=gorge.log.output.observer_from_env"]


def daemon_environ(extra: Mapping[str, str] = {}, *, drop: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment without the variables whose names start with
    one of ``drop``, with this source tree first on ``PYTHONPATH`` (so twistd
    finds its plugins), then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(SOURCE_ROOT), os.environ.get("PYTHONPATH")])
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
            cwd=SOURCE_ROOT,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C meant for the caller must not hit it first
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if not self._log.closed:
            self._log.close()
