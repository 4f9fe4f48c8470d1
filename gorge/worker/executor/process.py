"""One local PHP executor process and the wire to it.

The executor (``phorge/scripts/gorge-executor.php``) reads requests on its
file descriptor 3 and writes answers on its descriptor 4, one JSON object
per line; its stdout and stderr are only logged. Keeping the wire off stdout
means a task that prints something can never forge or break an answer.

The first line the process writes is ``{"type":"ready",...}`` once Phorge is
loaded, or ``{"type":"fatal","error":...}`` before it exits. After that, one
answer per request, in order: ``{"id":N,"answer":{...},"memory":bytes}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.error import ProcessDone
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure

from gorge.log.logger import Logger

log = Logger()

REQUEST_FD = 3
ANSWER_FD = 4
#: An answer carries the task's follow-ups, whose data may be large; a line
#: longer than this without its newline means the process is broken.
ANSWER_LINE_LIMIT = 64 * 1024 * 1024
#: Output a task prints is logged a line at a time, each cut to this much.
OUTPUT_LINE_CHARS = 2000
#: A partial output line longer than this is logged as it stands.
OUTPUT_BUFFER_LIMIT = 64 * 1024


class ExecutorFailed(Exception):
    """The process could not start, or ended, or broke the wire."""


class ExecutorProcess(ProcessProtocol):
    """A PHP process that runs one task at a time (the pool sees to that)."""

    def __init__(self, name: str, on_ended: Callable[[ExecutorProcess, str], None]) -> None:
        self.name = name
        self.pid: int | None = None
        self.ready: Deferred[dict] = Deferred()
        self.ended: Deferred[str] = Deferred()
        self.tasks = 0
        self.memory = 0
        self._on_ended = on_ended
        self._buffers: dict[int, bytes] = {ANSWER_FD: b"", 1: b"", 2: b""}
        self._pending: Deferred[dict] | None = None
        self._pending_id: int | None = None
        self._serial = 0
        self._closing = False
        self.is_ready = False
        self._fatal: str | None = None
        # The task of the request under way, and, once the worker cancelled
        # that request (the task's lease was lost or ran out) and so ended
        # the process, which task it was: the pool then replaces the process
        # as its own doing, not as a death.
        self.task: tuple[object, object] | None = None
        self.cancelled_task: tuple[object, object] | None = None

    # -- twisted hooks --------------------------------------------------------

    def connectionMade(self) -> None:
        self.pid = self.transport.pid  # type: ignore[union-attr]
        # Nothing is ever said on stdin: a task reading it gets end of file.
        self.transport.closeStdin()  # type: ignore[union-attr]

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        if childFD == ANSWER_FD:
            self._answer_bytes(data)
        elif childFD in (1, 2):
            self._output_bytes(childFD, data)

    def childConnectionLost(self, childFD: int) -> None:
        if childFD in (1, 2) and self._buffers.get(childFD):
            self._log_output(childFD, self._buffers[childFD])
            self._buffers[childFD] = b""

    def processEnded(self, reason: Failure) -> None:
        how = describe_end(reason)
        if self._fatal is not None:
            how = f"{how}: {self._fatal}"
        if not self.is_ready and not self.ready.called:
            self.ready.errback(Failure(ExecutorFailed(how)))
        self._fail_pending(ExecutorFailed(f"the PHP executor {how}"))
        self._on_ended(self, how)
        self.ended.callback(how)

    # -- requests -------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._pending is not None

    def run(self, request: Mapping[str, Any]) -> Deferred[dict]:
        """Send one request; the Deferred fires with the answer's ``answer``
        and ``memory``. Cancelling it ends the process (its task cannot be
        taken back from PHP any other way)."""
        assert self._pending is None, "one task at a time"
        self._serial += 1
        self._pending_id = self._serial
        self.task = (request.get("taskID"), request.get("taskClass"))
        line = json.dumps(
            {"id": self._serial, **request}, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8", "surrogatepass")
        self._pending = Deferred(self._cancel)
        self.transport.writeToChild(REQUEST_FD, line + b"\n")  # type: ignore[union-attr]
        return self._pending

    def _cancel(self, pending: Deferred[dict]) -> None:
        """The worker gave the task up: PHP cannot be stopped mid-task other
        than by ending its process."""
        if self.cancelled_task is None:
            self.cancelled_task = self.task
        self.kill()

    def close(self) -> None:
        """Let the process exit after the task under way: end of its input."""
        if not self._closing:
            self._closing = True
            try:
                self.transport.closeChildFD(REQUEST_FD)  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001 - already gone
                pass

    def kill(self) -> None:
        self._closing = True
        try:
            self.transport.signalProcess("KILL")  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - already gone (ProcessExitedAlready)
            pass

    # -- the wire -------------------------------------------------------------

    def _answer_bytes(self, data: bytes) -> None:
        buffer = self._buffers[ANSWER_FD] + data
        *lines, rest = buffer.split(b"\n")
        self._buffers[ANSWER_FD] = rest
        for line in lines:
            self._answer_line(line)
        if len(rest) > ANSWER_LINE_LIMIT:
            self._broken(f"an answer line longer than {ANSWER_LINE_LIMIT} bytes")

    def _answer_line(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            self._broken(f"an unreadable line on the wire: {line[:200]!r}")
            return
        if not isinstance(message, dict):
            self._broken(f"a line that is no object: {line[:200]!r}")
            return
        kind = message.get("type")
        if kind == "ready" and not self.is_ready:
            self.is_ready = True
            self.ready.callback(message)
        elif kind == "fatal":
            error = message.get("error")
            self._fatal = error if isinstance(error, str) else repr(error)
        elif "id" in message and self._pending is not None and message["id"] == self._pending_id:
            pending, self._pending, self._pending_id = self._pending, None, None
            self.task = None
            memory = message.get("memory")
            if isinstance(memory, int) and not isinstance(memory, bool):
                self.memory = memory
            self.tasks += 1
            answer = message.get("answer")
            pending.callback(answer if isinstance(answer, dict) else {"answer": answer})
        else:
            self._broken(f"an answer nobody asked for: {line[:200]!r}")

    def _broken(self, what: str) -> None:
        log.error(
            "WORKER_EXECUTOR_WIRE_BROKEN pid={pid} problem={problem}", pid=self.pid, problem=what
        )
        self._fail_pending(ExecutorFailed(f"the PHP executor sent {what}"))
        self.kill()

    def _fail_pending(self, error: Exception) -> None:
        pending, self._pending, self._pending_id = self._pending, None, None
        if pending is not None and not pending.called:
            pending.errback(Failure(error))

    def _output_bytes(self, fd: int, data: bytes) -> None:
        buffer = self._buffers[fd] + data
        *lines, rest = buffer.split(b"\n")
        for line in lines:
            self._log_output(fd, line)
        if len(rest) > OUTPUT_BUFFER_LIMIT:
            self._log_output(fd, rest)
            rest = b""
        self._buffers[fd] = rest

    def _log_output(self, fd: int, line: bytes) -> None:
        text = line.decode("utf-8", "replace").rstrip()
        if not text:
            return
        log.warn(
            "WORKER_EXECUTOR_OUTPUT pid={pid} stream={stream} line={line}",
            pid=self.pid,
            stream="stdout" if fd == 1 else "stderr",
            line=text[:OUTPUT_LINE_CHARS],
        )


def describe_end(reason: Failure) -> str:
    """How a process ended, in the words a log line wants."""
    if reason.check(ProcessDone):
        return "exited with status 0"
    value = reason.value
    signal = getattr(value, "signal", None)
    if signal is not None:
        return f"was killed by signal {signal}"
    status = getattr(value, "exitCode", None)
    if status is not None:
        return f"exited with status {status}"
    return str(value).rstrip(".")


def spawn(
    reactor: Any,
    argv: Sequence[str],
    env: Mapping[str, str],
    name: str,
    on_ended: Callable[[ExecutorProcess, str], None],
) -> ExecutorProcess:
    """Start one executor; its ``ready`` fires once Phorge is loaded."""
    process = ExecutorProcess(name, on_ended)
    reactor.spawnProcess(
        process,
        argv[0],
        list(argv),
        env=dict(env),
        childFDs={0: "w", 1: "r", 2: "r", REQUEST_FD: "w", ANSWER_FD: "r"},
    )
    return process
