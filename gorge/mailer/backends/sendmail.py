"""The ``sendmail`` backend: one child process per attempt,
``<path> -oi -f <from> -- <rcpt...>``, the MIME message on stdin, classified
by its exit status (sysexits). The binary is looked at when the backend is
built and again on SIGHUP, not before every send."""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessExitedAlready
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure

from gorge.log.logger import Logger
from gorge.mailer.backends.base import BackendEntry
from gorge.mailer.message import Message
from gorge.mailer.mime import build_mime
from gorge.mailer.outcome import Outcome

OUTPUT_LIMIT = 64 * 1024
PIPE_GRACE = 1.0
DEFAULT_PATH = "/usr/sbin/sendmail"

log = Logger()

_EXITS = {
    65: ("EX_DATAERR", Outcome.rejected_message),
    67: ("EX_NOUSER", Outcome.rejected_message),
    68: ("EX_NOHOST", Outcome.rejected_message),
    64: ("EX_USAGE", Outcome.rejected_unscoped),
    66: ("EX_NOINPUT", Outcome.rejected_unscoped),
    77: ("EX_NOPERM", Outcome.rejected_backend),
    78: ("EX_CONFIG", Outcome.rejected_backend),
    75: ("EX_TEMPFAIL", Outcome.transient),
}


def classify_exit(code: int | None, signal: int | None, output: str = "") -> Outcome:
    """Outcome for an exit status (or a terminating signal)."""
    detail = f": {output.strip()[:200]}" if output.strip() else ""
    if signal is not None or code is None:
        return Outcome.unknown(f"sendmail: killed by signal {signal}{detail}")
    if code == 0:
        return Outcome.accepted("")
    if code in _EXITS:
        name, make = _EXITS[code]
        return make(f"sendmail: exit {code} ({name}){detail}")
    return Outcome.unknown(f"sendmail: exit {code}{detail}")


class _Child(ProcessProtocol):
    def __init__(self, clock: Any, content: bytes) -> None:
        self.clock = clock
        self.content = content
        self.output = bytearray()
        self.done: Deferred = Deferred(lambda _: self.kill("cancelled"))
        self.exit: tuple[int | None, int | None] | None = None
        self._grace: Any = None
        self.killed: str | None = None

    def connectionMade(self) -> None:
        assert self.transport is not None
        self.transport.write(self.content)
        self.transport.closeStdin()

    def outReceived(self, data: bytes) -> None:
        room = OUTPUT_LIMIT - len(self.output)
        if room > 0:
            self.output += data[:room]

    errReceived = outReceived

    def processExited(self, reason: Failure) -> None:
        value = reason.value
        self.exit = (getattr(value, "exitCode", None), getattr(value, "signal", None))
        # A forked helper may keep our pipes open; do not wait for it long.
        self._grace = self.clock.callLater(PIPE_GRACE, self._finish)

    def processEnded(self, reason: Failure) -> None:
        if self.exit is None:
            self.processExited(reason)
        self._finish()

    def _finish(self) -> None:
        if self._grace is not None and self._grace.active():
            self._grace.cancel()
        if self.done.called:
            return
        code, signal = self.exit if self.exit is not None else (None, None)
        output = self.output.decode("utf-8", "replace")
        if self.killed is not None:
            outcome = Outcome.unknown(f"sendmail: killed ({self.killed})")
        else:
            outcome = classify_exit(code, signal, output)
        self.done.callback(outcome)

    def kill(self, why: str) -> None:
        if self.done.called:
            return
        if self.exit is not None:
            # The process already ended on its own; only the pipe grace was
            # left. Its exit status is the verdict (exit 0 stays accepted).
            self._finish()
            return
        self.killed = why
        assert self.transport is not None  # spawnProcess connects before it returns
        try:
            self.transport.signalProcess("KILL")
        except (ProcessExitedAlready, OSError):
            pass
        # The kill is reported through processExited; classify now so a
        # cancel always yields an answer at once.
        self.done.callback(Outcome.unknown(f"sendmail: killed ({why})"))


class SendmailBackend:
    type = "sendmail"

    def __init__(self, key: str, priority: int, path: str, *, reactor: Any) -> None:
        self.key = key
        self.priority = priority
        self.path = path
        self._reactor = reactor
        self._unusable: str | None = None
        self.reload()

    def reload(self) -> None:
        """Look at the binary: when built and on SIGHUP, never per send."""
        was = self._unusable
        if os.path.isfile(self.path) and os.access(self.path, os.X_OK):
            self._unusable = None
        else:
            self._unusable = f"sendmail: {self.path} is missing or not executable"
        if self._unusable is not None and self._unusable != was:
            log.warn(
                "MAILER_SENDMAIL_UNUSABLE mailer={key} path={path}", key=self.key, path=self.path
            )
        elif self._unusable is None and was is not None:
            log.info(
                "MAILER_SENDMAIL_USABLE mailer={key} path={path}", key=self.key, path=self.path
            )

    def argv(self, message: Message) -> list[str]:
        return [self.path, "-oi", "-f", message.from_.address, "--", *message.recipients()]

    async def send(self, message: Message, *, deadline: float) -> Outcome:
        clock = self._reactor
        now = clock.seconds()
        if deadline - now <= 0:
            return Outcome.transient("sendmail: deadline reached before start")
        if self._unusable is not None:
            return Outcome.rejected_backend(self._unusable)
        child = _Child(clock, build_mime(message, now=now))
        try:
            # The child inherits the service's environment; an explicit
            # copy because Twisted's fork path does not accept env=None.
            self._reactor.spawnProcess(child, self.path, self.argv(message), env=dict(os.environ))
        except OSError as e:
            return Outcome.rejected_backend(f"sendmail: cannot start {self.path}: {e.strerror}")
        timer = clock.callLater(deadline - now, child.kill, "deadline")
        try:
            return await child.done
        finally:
            if timer.active():
                timer.cancel()


#: The option keys this backend reads; others are ignored (logged at debug).
OPTIONS = frozenset(("path",))


def build(entry: BackendEntry, *, reactor: Any, http_client: Any = None) -> SendmailBackend:
    return SendmailBackend(
        entry.key, entry.priority, entry.str("path", DEFAULT_PATH), reactor=reactor
    )
