"""``gorge demo``: the four services on SQLite in one reactor, end to end.

A receiver that verifies every webhook signature and an SMTP sink run in the
same process. The demo seeds hooks and webhook requests, tasks and mails,
narrates what happens, and ends with a summary table: exit 0 once every
seeded item reached its expected final state within the bound, 1 otherwise
(the table says which item is missing), 2 when the demo could not start.
``--serve`` keeps everything running afterwards and prints the four URLs.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO, cast

from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.logger import (
    ILogObserver,
    LogLevel,
    globalLogBeginner,
    globalLogPublisher,
    textFileLogObserver,
)
from twisted.web.iweb import IAgent
from twisted.web.server import Site

if TYPE_CHECKING:
    from twisted.web.client import HTTPConnectionPool

from gorge.config import ConfigError
from gorge.demo.progress import Progress, summary_table
from gorge.demo.receiver import ReceiverPath, build_receiver
from gorge.demo.seed import (
    HOOKS,
    MAILS,
    REJECTED_ADDRESSES,
    REQUESTS,
    TASKS,
    DemoHerald,
    Endpoint,
    call_api,
    enqueue_task,
    send_mail,
)
from gorge.demo.services import DemoSettings, DemoStack, build_stack, demo_settings
from gorge.demo.smtp import SinkFactory, SmtpSink
from gorge.demo.state import RESULT_NAMES, DemoState
from gorge.log.logger import Logger

log = Logger()

DEFAULT_TIMEOUT = 60.0
WATCH_INTERVAL = 0.25
STOP_BUDGET = 30.0
STORE_TIMEOUT = 10.0

BREAKER_OPENED = "WEBHOOK_HOOK_IN_ERROR_BACKOFF "


@dataclass(frozen=True)
class DemoOptions:
    serve: bool = False
    timeout: float = DEFAULT_TIMEOUT
    workdir: str = ""


class Demo:
    """One run: listeners, services, seeding, watching, the verdict."""

    def __init__(self, reactor, options: DemoOptions, progress: Progress, out: TextIO) -> None:
        self._reactor = reactor
        self._options = options
        self._progress = progress
        self._out = out
        self.sink = SmtpSink(reject=REJECTED_ADDRESSES, on_event=self._on_sink)
        self.state = DemoState(sink=self.sink)
        self._ports: list = []
        self._client: IAgent | None = None
        self._pool: HTTPConnectionPool | None = None
        self.receiver_url = ""
        self.settings: DemoSettings | None = None
        self.stack: DemoStack | None = None
        self._herald: DemoHerald | None = None
        self._late_requests = [r for r in REQUESTS if r.after_hits]

    # -- events from the demo's own parts ----------------------------------

    def _on_sink(self, event) -> None:
        self._progress.sink(event)

    def _on_receiver(self, event) -> None:
        self.state.record_delivery(event)
        self._progress.receiver(event)

    def _on_task_run(self, run) -> None:
        self.state.record_run(run)
        self._progress.task_run(run)

    def _on_log_event(self, event: dict) -> None:
        """The services' own log events: the breaker's state change is evidence."""
        if event.get("log_format", "").startswith(BREAKER_OPENED) and "threshold" in event:
            self.state.breaker_opened.add(str(event.get("hook", "")))
        self._progress.observe(event)

    # -- the run -----------------------------------------------------------

    def _listen_local(self, factory) -> int:
        port = self._reactor.listenTCP(0, factory, interface="127.0.0.1")
        self._ports.append(port)
        return port.getHost().port

    def start(self) -> None:
        from twisted.web.client import Agent, HTTPConnectionPool

        smtp_port = self._listen_local(SinkFactory(self.sink, self._reactor))
        receiver = build_receiver(
            [ReceiverPath(h.name, h.hmac_key, h.answers) for h in HOOKS], self._on_receiver
        )
        receiver_port = self._listen_local(Site(receiver))
        self.receiver_url = f"http://127.0.0.1:{receiver_port}"
        self.settings = demo_settings(self._options.workdir, smtp_port)
        self.stack = build_stack(self.settings, self._reactor, self._on_task_run)
        self._herald = DemoHerald(self.stack.webhook_store.db)
        globalLogPublisher.addObserver(cast(ILogObserver, self._on_log_event))
        self._pool = HTTPConnectionPool(self._reactor, persistent=True)
        self._client = Agent(self._reactor, pool=self._pool, connectTimeout=5)
        self.stack.root.privilegedStartService()
        self.stack.root.startService()
        self._progress.say(
            "demo", f"receiver on {self.receiver_url}, SMTP sink on 127.0.0.1:{smtp_port}"
        )
        for name, endpoint in self.settings.endpoints().items():
            self._progress.say("demo", f"gorge-{name} on {endpoint.base_url}")

    async def _insert_requests(self, hooks, requests) -> None:
        assert self._herald is not None  # start() built it
        await Deferred.fromCoroutine(
            self._herald.insert(hooks, requests, self.receiver_url, int(self._reactor.seconds()))
        ).addTimeout(STORE_TIMEOUT, self._reactor)

    async def seed(self) -> None:
        assert self.settings is not None and self.stack is not None  # start() built them
        endpoints = self.settings.endpoints()
        first = tuple(r for r in REQUESTS if not r.after_hits)
        await self._insert_requests(HOOKS, first)
        self._progress.say(
            "demo",
            f"inserted {len(HOOKS)} hooks and {len(first)} queued"
            " webhook requests into the herald tables",
        )
        for task in TASKS:
            task_id = await enqueue_task(self._client, self._reactor, endpoints["taskqueue"], task)
            self.state.task_ids[task.label] = task_id
            self._progress.enqueued(task.label, task_id, task.priority)
        self.stack.worker.privilegedStartService()
        self.stack.worker.startService()
        self._progress.say("demo", "worker started: it leases the queued tasks by priority")
        for mail in MAILS:
            status, detail = await send_mail(self._client, self._reactor, endpoints["mailer"], mail)
            self.state.mail_answers[mail.label] = (status, detail)
            self._progress.mail_answer(mail.label, status, detail)

    async def seed_late(self) -> None:
        """Requests that wait for their hook's receiver to have been called enough."""
        due = [r for r in self._late_requests if self.state.hits_on(r.hook) >= r.after_hits]
        if not due:
            return
        self._late_requests = [r for r in self._late_requests if r not in due]
        await self._insert_requests((), tuple(due))
        for request in due:
            self._progress.say(
                "demo",
                f"inserted request {request.phid} to {request.hook}"
                f" after its {request.after_hits} failed attempts",
            )

    async def refresh(self) -> None:
        """Read the final-state evidence the events alone cannot give."""
        assert self.settings is not None and self.stack is not None  # start() built them
        assert self._herald is not None
        rows = await Deferred.fromCoroutine(self._herald.request_states()).addTimeout(
            STORE_TIMEOUT, self._reactor
        )
        self.state.webhook_rows = {
            _text(phid): (_text(status), _text(result)) for phid, status, result in rows
        }
        queue: Endpoint = self.settings.endpoints()["taskqueue"]
        for task_id in self.state.pending_task_ids():
            status, _ = await call_api(
                self._client, self._reactor, queue, "GET", f"/api/queue/tasks/{task_id}"
            )
            if status != 404:
                continue
            archived = await Deferred.fromCoroutine(
                self.stack.task_store.get_archived(task_id)
            ).addTimeout(STORE_TIMEOUT, self._reactor)
            if archived is not None:
                self.state.archived[task_id] = (archived.result, archived.failure_count)
                self._progress.archived(
                    task_id, RESULT_NAMES.get(archived.result, "?"), archived.failure_count
                )

    async def watch(self) -> bool:
        """True once every item is in its expected state, False at the bound."""
        deadline = self._reactor.seconds() + self._options.timeout
        while True:
            try:
                await self.seed_late()
                await self.refresh()
            except Exception:
                log.failure("DEMO_REFRESH_FAILED", level=LogLevel.warn)
            if self.state.done():
                return True
            if self._reactor.seconds() >= deadline:
                return False
            await deferLater(self._reactor, WATCH_INTERVAL)

    async def stop(self) -> None:
        services = [self.stack.worker, self.stack.root] if self.stack is not None else []
        for service in services:
            if not service.running:
                continue
            try:
                await service.stopService().addTimeout(STOP_BUDGET, self._reactor)
            except Exception:
                log.failure("DEMO_STOP_FAILED", level=LogLevel.error)
        globalLogPublisher.removeObserver(cast(ILogObserver, self._on_log_event))
        for port in self._ports:
            await port.stopListening().addTimeout(STORE_TIMEOUT, self._reactor)
        if self._pool is not None:
            await self._pool.closeCachedConnections().addTimeout(STORE_TIMEOUT, self._reactor)

    def print_urls(self) -> None:
        assert self.settings is not None  # start() made them
        self._out.write("\nThe services keep running (Ctrl-C stops them):\n")
        for name, endpoint in self.settings.endpoints().items():
            self._out.write(
                f"  gorge-{name:<10} {endpoint.base_url}/readyz   token: {endpoint.token}\n"
            )
        self._out.write(f"  receiver         {self.receiver_url}/hooks/<name>\n")
        self._out.flush()


def _text(value) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return "" if value is None else str(value)


async def run_demo(reactor, options: DemoOptions, progress: Progress, out: TextIO) -> int:
    demo = Demo(reactor, options, progress, out)
    try:
        demo.start()
    except Exception as e:  # a bad setting, a listener that cannot bind
        if not isinstance(e, ConfigError):
            log.failure("DEMO_START_FAILED", level=LogLevel.error)
        out.write(f"gorge demo: could not start: {e}\n")
        await demo.stop()
        return 2
    started = reactor.seconds()
    try:
        await demo.seed()
        reached = await demo.watch()
    except Exception as e:
        log.failure("DEMO_FAILED", level=LogLevel.error)
        out.write(f"gorge demo: seeding failed: {e}\n")
        reached = False
    checks = demo.state.checks()
    out.write("\n" + summary_table(checks))
    elapsed = reactor.seconds() - started
    missing = [c for c in checks if not c.ok]
    if reached:
        out.write(
            f"\nAll {len(checks)} seeded items reached their expected state in {elapsed:.1f}s.\n"
        )
    else:
        out.write(
            f"\nFAILED: {len(missing)} of {len(checks)} items did not reach their"
            f" expected state within {options.timeout:g}s:"
            f" {', '.join(c.area + ' ' + c.item for c in missing)}\n"
        )
    out.flush()
    if options.serve and reached:
        demo.print_urls()
        await _until_shutdown(reactor, demo)
        return 0
    await demo.stop()
    return 0 if reached else 1


def _until_shutdown(reactor, demo: Demo) -> Deferred:
    """Fires once a signal stopped the reactor and the services have stopped in order.

    Deliberately unbounded: ``--serve`` runs until the user interrupts it.
    """
    stopped: Deferred = Deferred()

    async def stop() -> None:
        try:
            await demo.stop()
        finally:
            stopped.callback(None)

    reactor.addSystemEventTrigger("before", "shutdown", lambda: Deferred.fromCoroutine(stop()))
    return stopped


def main(options: DemoOptions, out: TextIO = sys.stdout) -> None:
    """Run the demo in the global reactor and exit with its status."""
    from twisted.internet import task

    workdir = options.workdir or tempfile.mkdtemp(prefix="gorge-demo-")
    options = DemoOptions(serve=options.serve, timeout=options.timeout, workdir=workdir)
    log_path = os.path.join(workdir, "services.log")

    def react_main(reactor) -> Deferred:
        progress = Progress(out, reactor)
        log_file = open(log_path, "a", encoding="utf-8")
        globalLogBeginner.beginLoggingTo([textFileLogObserver(log_file)], redirectStandardIO=False)
        progress.say("demo", f"working directory {workdir} (service log: {log_path})")
        return Deferred.fromCoroutine(_exit_status(run_demo(reactor, options, progress, out)))

    task.react(react_main)


async def _exit_status(coro) -> None:
    status = await coro
    if status:
        raise SystemExit(status)
