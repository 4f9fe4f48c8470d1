"""What the demo has observed, and whether every seeded item is where it must end.

The observations come from the receiver, the SMTP sink, the task handlers,
the services' log events and periodic reads of the stores; :meth:`checks`
turns them into one row per seeded item for the summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType

from gorge.demo.handlers import TaskRun
from gorge.demo.receiver import ReceiverEvent
from gorge.demo.seed import (
    HOOKS,
    MAILS,
    REQUESTS,
    TASKS,
    DemoMail,
    DemoRequest,
    DemoTask,
    hook_named,
)
from gorge.demo.smtp import SmtpSink
from gorge.taskqueue.model import RESULT_CANCELLED, RESULT_FAILURE, RESULT_SUCCESS

RESULT_NAMES = MappingProxyType(
    {RESULT_SUCCESS: "success", RESULT_FAILURE: "failure", RESULT_CANCELLED: "cancelled"}
)


@dataclass(frozen=True)
class Check:
    area: str
    item: str
    expected: str
    observed: str
    ok: bool


@dataclass
class DemoState:
    sink: SmtpSink
    deliveries: dict[str, list[ReceiverEvent]] = field(default_factory=dict)  # by object PHID
    breaker_opened: set[str] = field(default_factory=set)  # hook PHIDs
    webhook_rows: dict[str, tuple[str, str]] = field(default_factory=dict)  # phid -> status, result
    task_ids: dict[str, int] = field(default_factory=dict)  # label -> id
    task_runs: dict[int, list[TaskRun]] = field(default_factory=dict)
    archived: dict[int, tuple[int, int]] = field(default_factory=dict)  # id -> result, failures
    mail_answers: dict[str, tuple[int, str]] = field(default_factory=dict)  # label -> status, code

    def record_delivery(self, event: ReceiverEvent) -> None:
        self.deliveries.setdefault(event.object_phid, []).append(event)

    def hits_on(self, path: str) -> int:
        return sum(1 for hits in self.deliveries.values() for hit in hits if hit.path == path)

    def record_run(self, run: TaskRun) -> None:
        if run.outcome:
            self.task_runs.setdefault(run.task_id, []).append(run)

    def pending_task_ids(self) -> list[int]:
        return [task_id for task_id in self.task_ids.values() if task_id not in self.archived]

    def checks(self) -> list[Check]:
        return (
            [self._check_request(r) for r in REQUESTS]
            + [self._check_task(t) for t in TASKS]
            + [self._check_mail(m) for m in MAILS]
        )

    def done(self) -> bool:
        return all(check.ok for check in self.checks())

    # -- one row per seeded item -------------------------------------------

    def _check_request(self, request: DemoRequest) -> Check:
        status, result = self.webhook_rows.get(request.phid, ("?", "?"))
        hits = self.deliveries.get(request.object_phid, [])
        signed = bool(hits) and all(hit.signature_ok for hit in hits)
        observed = f"row {status}/{result}, receiver answered {_answers(hits)}"
        if hits:
            observed += ", signature ok" if signed else ", BAD SIGNATURE"
        if request.expect == "sent":
            ok = status == "sent" and signed and hits[-1].status == 200
        elif request.expect == "failed":
            ok = status == "failed" and result == "fail" and signed
        else:  # retrying: retried at least once, then held back by the open breaker
            opened = hook_named(request.hook).phid in self.breaker_opened
            observed += ", breaker open" if opened else ", breaker closed"
            ok = status == "queued" and result == "fail" and signed and len(hits) >= 2 and opened
        expected = {
            "sent": "sent, signature ok",
            "failed": "failed after one 500 (retry=never)",
            "retrying": "queued after >=2 attempts, breaker open",
        }[request.expect]
        return Check("webhook", f"{request.hook} {request.phid[-3:]}", expected, observed, ok)

    def _check_task(self, task: DemoTask) -> Check:
        task_id = self.task_ids.get(task.label)
        label = f"#{task_id} {task.label} (p{task.priority})" if task_id else task.label
        expected = f"archived {task.expect}"
        if task.failures:
            expected += f" after {task.failures} failure"
        if task.task_class.endswith("YieldOnceWorker"):
            expected += " after a yield"
        if task_id is None or task_id not in self.archived:
            outcomes = [run.outcome for run in self.task_runs.get(task_id or -1, [])]
            return Check(
                "task",
                label,
                expected,
                "active" + (f", runs: {','.join(outcomes)}" if outcomes else ""),
                False,
            )
        result, failures = self.archived[task_id]
        outcomes = [run.outcome for run in self.task_runs.get(task_id, [])]
        observed = f"archived {RESULT_NAMES.get(result, result)}, failures={failures}"
        if outcomes:
            observed += f", runs: {','.join(outcomes)}"
        ok = (
            RESULT_NAMES.get(result) == task.expect
            and failures == task.failures
            and (not task.task_class.endswith("YieldOnceWorker") or "yield" in outcomes)
        )
        return Check("task", label, expected, observed, ok)

    def _check_mail(self, mail: DemoMail) -> Check:
        answer = self.mail_answers.get(mail.label)
        delivered = any(set(mail.to) <= set(event.recipients) for event in self.sink.accepted)
        refused = all(address in self.sink.rejected for address in mail.to)
        if answer is None:
            observed = "no answer yet"
            ok = False
        else:
            observed = f"HTTP {answer[0]} {answer[1]}"
            if mail.expect == "accepted":
                observed += ", in the sink" if delivered else ", NOT in the sink"
                ok = answer[0] == 200 and delivered
            else:
                observed += ", sink refused RCPT" if refused else ", sink did not refuse"
                ok = answer == (422, "ERR_PERMANENT_FAILURE") and refused and not delivered
        expected = (
            "200 via smtp, in the sink"
            if mail.expect == "accepted"
            else "422 ERR_PERMANENT_FAILURE (550 5.1.1)"
        )
        return Check("mail", mail.label, expected, observed, ok)


def _answers(hits: list[ReceiverEvent]) -> str:
    """``200`` or ``500 x3``: one entry per distinct status, in order of appearance."""
    counts: dict[int, int] = {}
    for hit in hits:
        counts[hit.status] = counts.get(hit.status, 0) + 1
    if not counts:
        return "none"
    return ", ".join(str(s) if n == 1 else f"{s} x{n}" for s, n in counts.items())


HOOK_NAMES = MappingProxyType({hook.phid: hook.name for hook in HOOKS})
