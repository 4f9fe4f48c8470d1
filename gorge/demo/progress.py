"""The demo's output: one readable line per event, then the summary table.

Lines come from the demo's own parts (receiver, sink, task handlers, the
seeding calls) and from the services' structured log events, which this
module's :meth:`Progress.observe` translates; everything else the services
log goes to the log file only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TextIO

from twisted.internet.interfaces import IReactorTime

from gorge.demo.handlers import RETRY_WAIT_SECONDS, YIELD_SECONDS, TaskRun
from gorge.demo.receiver import ReceiverEvent
from gorge.demo.smtp import SinkEvent
from gorge.demo.state import HOOK_NAMES, Check


def _event_name(event: dict) -> str:
    text = event.get("log_format") or ""
    return text.split(" ", 1)[0] if text else ""


class Progress:
    def __init__(self, out: TextIO, clock: IReactorTime) -> None:
        self._out = out
        self._clock = clock
        self._started = clock.seconds()
        self._translations: dict[str, Callable[[dict], str | None]] = {
            "WEBHOOK_DELIVERED": self._delivered,
            "WEBHOOK_DELIVERY_REJECTED": self._rejected,
            "WEBHOOK_DELIVERY_FAILED": self._transport_failed,
            "WEBHOOK_HOOK_IN_ERROR_BACKOFF": self._breaker_opened,
            "WEBHOOK_HOOK_BACKOFF_CLEARED": self._breaker_closed,
        }

    def say(self, area: str, text: str) -> None:
        elapsed = self._clock.seconds() - self._started
        self._out.write(f"[{elapsed:5.1f}s] {area:<8} {text}\n")
        self._out.flush()

    # -- the services' log events ------------------------------------------

    def observe(self, event: dict) -> None:
        """A twisted.logger observer: translates the few events the demo narrates."""
        translate = self._translations.get(_event_name(event))
        if translate is None:
            return
        text = translate(event)
        if text is not None:
            self.say("webhook", text)

    @staticmethod
    def _hook(event: dict) -> str:
        phid = str(event.get("hook", ""))
        return HOOK_NAMES.get(phid, phid)

    def _delivered(self, event: dict) -> str:
        return (
            f"request {event.get('request')} to {self._hook(event)} delivered"
            f" (HTTP {event.get('status')}), row sent"
        )

    def _rejected(self, event: dict) -> str:
        if event.get("row_status") == "queued":
            return (
                f"request {event.get('request')} to {self._hook(event)} got HTTP"
                f" {event.get('status')}: retry=forever, will be retried"
            )
        return (
            f"request {event.get('request')} to {self._hook(event)} got HTTP"
            f" {event.get('status')}: retry=never, row failed"
        )

    def _transport_failed(self, event: dict) -> str:
        return (
            f"request {event.get('request')} to {self._hook(event)} failed"
            f" ({event.get('error_type')} {event.get('code')}), row {event.get('row_status')}"
        )

    def _breaker_opened(self, event: dict) -> str | None:
        if "threshold" not in event:
            return None  # the per-row skip note, not the state change
        return (
            f"breaker OPENED for {self._hook(event)}: {event.get('failures')} failures"
            f" >= {event.get('threshold')} within {event.get('window')}s, its rows wait"
        )

    def _breaker_closed(self, event: dict) -> str:
        return f"breaker closed for {self._hook(event)}"

    # -- the demo's own parts ----------------------------------------------

    def receiver(self, event: ReceiverEvent) -> None:
        signature = "signature ok" if event.signature_ok else "signature BAD"
        self.say(
            "receiver",
            f"/hooks/{event.path} got {event.object_phid}: {signature}, answered {event.status}",
        )

    def sink(self, event: SinkEvent) -> None:
        if event.kind == "accepted":
            self.say("smtp", f"sink accepted {event.subject!r} for {', '.join(event.recipients)}")
        else:
            self.say("smtp", f"sink refused RCPT {event.recipients[0]} with 550 5.1.1")

    def task_run(self, run: TaskRun) -> None:
        name = f"task #{run.task_id} {run.task_class} (priority {run.priority})"
        text = {
            "": f"{name} leased, running (failures so far: {run.failure_count})",
            "ok": f"{name} handler finished",
            "retry": f"{name} failed on purpose, retry in {RETRY_WAIT_SECONDS}s",
            "yield": f"{name} yielded for {YIELD_SECONDS}s",
            "error": f"{name} failed permanently",
        }[run.outcome]
        self.say("worker", text)

    def enqueued(self, label: str, task_id: int, priority: int) -> None:
        self.say("queue", f"enqueued task #{task_id} {label!r} with priority {priority}")

    def archived(self, task_id: int, result: str, failures: int) -> None:
        self.say("queue", f"task #{task_id} archived: {result} (failures={failures})")

    def mail_answer(self, label: str, status: int, detail: str) -> None:
        verdict = "accepted" if status == 200 else "rejected"
        self.say("mailer", f"mail {label!r} {verdict}: HTTP {status} {detail}")


def summary_table(checks: list[Check]) -> str:
    """A plain-text table, one row per seeded item."""
    header = ("area", "item", "expected", "observed", "")
    rows = [header] + [
        (c.area, c.item, c.expected, c.observed, "ok" if c.ok else "MISSING") for c in checks
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines) + "\n"
