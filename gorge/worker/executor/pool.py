"""The pool of local PHP executors gorge-worker runs PHP tasks in.

Each executor is a long-lived PHP process that loaded Phorge once, as a
taskmaster does, and runs one task at a time. The pool keeps ``size`` of
them: a task waits for an idle one; an executor is recycled (its input
closed, a fresh one started) after ``max_tasks`` tasks or once its memory
passes ``max_memory``; one that dies is replaced, with a growing pause while
they keep dying before they are ready (a broken Phorge must not become a
fork loop). A task whose executor dies under it fails with
:class:`ExecutorFailed`; cancelling a task (its lease lost at a heartbeat,
or its deadline passed) ends its process, which the pool replaces at once
(``WORKER_EXECUTOR_REPLACED``).
"""

from __future__ import annotations

import json
import subprocess
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IDelayedCall

from gorge.config import ConfigError
from gorge.log.logger import Logger
from gorge.worker.executor.process import ExecutorFailed, ExecutorProcess, spawn

log = Logger()

#: The first pause before replacing an executor that died before it was
#: ready; doubled on each further such death, up to RESTART_MAX.
RESTART_FIRST = 1.0
RESTART_MAX = 60.0
#: How long stop() lets executors finish and exit before it kills them.
STOP_GRACE = 10.0
#: How long the start-up check may take to load Phorge.
CHECK_TIMEOUT = 120.0


@dataclass(frozen=True)
class PoolSettings:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    size: int
    max_tasks: int
    max_memory: int  # bytes


class ExecutorGate:
    """Delegated classes wait while no executor can load Phorge (the
    consumer's DelegationGate): the worker then leases only native classes
    and hands back a PHP task it gets anyway, without charging it, instead
    of holding PHP tasks until their lease ends. Not while the pool is only
    starting: that takes a fraction of a second."""

    def __init__(self, pool: ExecutorPool, delegated: Callable[[str], bool]) -> None:
        self._pool = pool
        self._delegated = delegated

    @property
    def paused(self) -> bool:
        return self._pool.broken

    def delegated(self, task_class: str) -> bool:
        return self._delegated(task_class)

    def not_reached(self, reason: str) -> None:
        """Only Conduit calls can fail to reach PHP; an executor's death is
        the task's temporary failure."""


def check_phorge_loads(settings: PoolSettings) -> None:
    """Load Phorge once the way an executor does (``--check``), blocking: for
    start-up only, where a Phorge that does not load must stop the daemon
    with one line naming the setting."""
    php, script, root = settings.argv[0], settings.argv[1], settings.argv[-1]
    try:
        done = subprocess.run(
            [php, script, "--check", root],
            env=dict(settings.env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=CHECK_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(
            "GORGE_WORKER_PHORGE_ROOT", f"Phorge at {root} did not load: {exc}"
        ) from None
    lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        hello = json.loads(lines[-1]) if lines else {}
    except ValueError:
        hello = {}
    if done.returncode == 0 and isinstance(hello, dict) and hello.get("type") == "ready":
        return
    error = hello.get("error") if isinstance(hello, dict) else None
    if not isinstance(error, str):
        error = (done.stderr or done.stdout).decode("utf-8", "replace").strip()[-500:]
    error = " ".join(error.split())  # one line
    raise ConfigError("GORGE_WORKER_PHORGE_ROOT", f"Phorge at {root} did not load: {error}")


class ExecutorPool:
    def __init__(self, settings: PoolSettings, reactor: Any, metrics: Any = None) -> None:
        self._settings = settings
        self._reactor = reactor
        self._metrics = metrics
        self._idle: deque[ExecutorProcess] = deque()
        self._waiting: deque[Deferred[ExecutorProcess]] = deque()
        self._live: set[ExecutorProcess] = set()
        self._retiring: set[ExecutorProcess] = set()
        self._restarts: list[IDelayedCall] = []
        self._failures_in_a_row = 0
        self._serial = 0
        self._running = False
        self._ever_ready = False
        self.last_error: str | None = None
        self.started = 0
        self.recycled = 0
        self.died = 0
        self.replaced = 0

    # -- life -----------------------------------------------------------------

    def start(self) -> None:
        self._running = True
        for _ in range(self._settings.size):
            self._spawn()

    async def stop(self) -> None:
        """Close every executor's input, wait for them to exit, kill the rest."""
        self._running = False
        for call in self._restarts:
            if call.active():
                call.cancel()
        self._restarts.clear()
        for waiter in list(self._waiting):
            waiter.cancel()
        live = list(self._live)
        for process in live:
            process.close()
        if not live:
            return
        ended = DeferredList([p.ended for p in live], consumeErrors=True)

        def kill_the_rest() -> None:
            for process in live:
                process.kill()

        timer = self._reactor.callLater(STOP_GRACE, kill_the_rest)
        try:
            await ended
        finally:
            if timer.active():
                timer.cancel()

    @property
    def broken(self) -> bool:
        """No executor is ready because they die before Phorge is loaded."""
        return self.last_error is not None and not any(
            p.is_ready and p not in self._retiring for p in self._live
        )

    def readiness_reason(self) -> str | None:
        """None while some executor can take a task (or is running one)."""
        if any(p.is_ready and p not in self._retiring for p in self._live):
            return None
        if self.last_error is not None:
            return f"php executors: none ready ({self.last_error})"
        return "php executors: starting"

    @property
    def size(self) -> int:
        return self._settings.size

    @property
    def idle(self) -> int:
        return len(self._idle)

    @property
    def busy(self) -> int:
        return sum(1 for process in self._live if process.busy)

    def _publish(self) -> None:
        """The executors gauge, after every change of state."""
        if self._metrics is None:
            return
        busy = self.busy
        ready = sum(1 for p in self._live if p.is_ready and not p.ended.called)
        gauge = self._metrics.executors
        gauge.labels(state="busy").set(busy)
        gauge.labels(state="idle").set(max(0, ready - busy))
        gauge.labels(state="starting").set(len(self._live) - ready)

    # -- tasks ----------------------------------------------------------------

    async def run(self, request: Mapping[str, Any]) -> dict:
        """Run one task in the next idle executor: the executor's answer."""
        process = await self._acquire()
        # A death, a broken wire or a cancel (which kills the process) raise
        # here; the process is replaced when its end is seen.
        answer_d = process.run(request)
        self._publish()  # now that the process counts as busy
        try:
            answer = await answer_d
        finally:
            self._publish()
        self._release(process)
        return answer

    def _acquire(self) -> Deferred[ExecutorProcess]:
        while self._idle:
            process = self._idle.popleft()
            if process in self._live and not process.ended.called:
                return _succeed(process)

        def withdraw(d: Deferred[ExecutorProcess]) -> None:
            if d in self._waiting:
                self._waiting.remove(d)

        waiter: Deferred[ExecutorProcess] = Deferred(withdraw)
        self._waiting.append(waiter)
        return waiter

    def _release(self, process: ExecutorProcess) -> None:
        limits = self._settings
        if process.tasks >= limits.max_tasks or process.memory >= limits.max_memory:
            self._retire(process)
            return
        self._offer(process)

    def _offer(self, process: ExecutorProcess) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.called:
                waiter.callback(process)
                return
        self._idle.append(process)

    # -- supervision ----------------------------------------------------------

    def _spawn(self) -> None:
        if not self._running:
            return
        self._serial += 1
        process = spawn(
            self._reactor,
            self._settings.argv,
            self._settings.env,
            f"executor-{self._serial}",
            self._ended,
        )
        self._live.add(process)
        self.started += 1
        self._publish()
        process.ready.addCallbacks(lambda hello: self._ready(process, hello), lambda failure: None)

    def _ready(self, process: ExecutorProcess, hello: dict) -> None:
        self._failures_in_a_row = 0
        self.last_error = None
        if not self._ever_ready:
            self._ever_ready = True
            log.info(
                "WORKER_EXECUTORS_READY size={size} pid={pid} php={php}",
                size=self._settings.size,
                pid=process.pid,
                php=hello.get("php"),
            )
        if process.ended.called:
            return
        self._offer(process)
        self._publish()

    def _retire(self, process: ExecutorProcess) -> None:
        self._retiring.add(process)
        self.recycled += 1
        log.info(
            "WORKER_EXECUTOR_RECYCLED pid={pid} tasks={tasks} memory={memory}",
            pid=process.pid,
            tasks=process.tasks,
            memory=process.memory,
        )
        process.close()
        # The replacement loads Phorge while the old one exits.
        self._spawn()

    def _ended(self, process: ExecutorProcess, how: str) -> None:
        self._live.discard(process)
        self._publish()
        if process in self._idle:
            self._idle.remove(process)
        if process in self._retiring:
            self._retiring.discard(process)
            return
        if not self._running:
            return
        if process.cancelled_task is not None:
            # Ended because its task was cancelled (a lost lease, a passed
            # deadline): not a death, and no back-off. Its replacement keeps
            # the pool at its size.
            self.replaced += 1
            task_id, task_class = process.cancelled_task
            log.info(
                "WORKER_EXECUTOR_REPLACED pid={pid} task_id={task_id} task_class={task_class} "
                "reason={reason}",
                pid=process.pid,
                task_id=task_id,
                task_class=task_class,
                reason="its task was cancelled",
            )
            self._spawn()
            return
        self.died += 1
        if not process.is_ready:
            # Died before Phorge was loaded: back off, Phorge may be broken.
            self._failures_in_a_row += 1
            self.last_error = how
            delay = min(RESTART_MAX, RESTART_FIRST * 2 ** (self._failures_in_a_row - 1))
            log.error(
                "WORKER_EXECUTOR_START_FAILED pid={pid} error={error} retry_in={retry_in}",
                pid=process.pid,
                error=how,
                retry_in=delay,
            )
            self._restarts = [c for c in self._restarts if c.active()]
            self._restarts.append(self._reactor.callLater(delay, self._spawn))
            return
        log.warn("WORKER_EXECUTOR_EXITED pid={pid} how={how}", pid=process.pid, how=how)
        self._spawn()


def _succeed(value: ExecutorProcess) -> Deferred[ExecutorProcess]:
    d: Deferred[ExecutorProcess] = Deferred()
    d.callback(value)
    return d


__all__ = ["ExecutorFailed", "ExecutorPool", "PoolSettings"]
