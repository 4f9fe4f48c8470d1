"""Dispatcher rules with an injected clock."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from twisted.internet import task
from twisted.internet.defer import Deferred

from gorge.mailer.dispatcher import Answer, Dispatcher
from gorge.mailer.message import parse_send_request
from gorge.mailer.metrics import MailerMetrics
from gorge.mailer.outcome import Kind, Outcome
from tests.mailer.conftest import valid_message

MESSAGE = parse_send_request({"message": valid_message()}).message

MAKERS = {
    Kind.ACCEPTED: lambda: Outcome.accepted("id-1"),
    Kind.REJECTED_MESSAGE: lambda: Outcome.rejected_message("bad recipient"),
    Kind.REJECTED_BACKEND: lambda: Outcome.rejected_backend("bad key"),
    Kind.REJECTED_UNSCOPED: lambda: Outcome.rejected_unscoped("550 no"),
    Kind.TRANSIENT: lambda: Outcome.transient("421 later"),
    Kind.UNKNOWN: lambda: Outcome.unknown("lost reply"),
}


@dataclass
class Scripted:
    """A backend answering from a script; ``"pending"`` never answers until
    cancelled, then returns ``on_cancel``."""

    key: str
    priority: int = 0
    script: list = field(default_factory=list)
    type: str = "fake"
    on_cancel: Outcome = field(default_factory=lambda: Outcome.transient("aborted"))
    calls: int = 0
    deadlines: list = field(default_factory=list)

    async def send(self, message, *, deadline):
        self.calls += 1
        self.deadlines.append(deadline)
        step = self.script.pop(0) if self.script else Kind.ACCEPTED
        if step == "pending":
            d = Deferred(lambda d: d.callback(self.on_cancel))
            return await d
        if isinstance(step, Outcome):
            return step
        return MAKERS[step]()


def dispatcher(backends, clock=None, **kw) -> Dispatcher:
    kw.setdefault("retry_wait", 0)
    return Dispatcher(
        backends, clock=clock or task.Clock(), metrics=MailerMetrics(CollectorRegistry()), **kw
    )


def run(d: Dispatcher, keys=None) -> Answer:
    started = d.start(MESSAGE, keys)
    if isinstance(started, Answer):
        return started
    result = []
    started.result.addCallback(result.append)
    assert result, "dispatch did not finish synchronously"
    return result[0]


def test_priority_order_and_stable_ties():
    a, b, c = Scripted("a", 10), Scripted("b", 50), Scripted("c", 10)
    d = dispatcher([a, b, c])
    assert [x.key for x in d.backends] == ["b", "a", "c"]
    assert run(d).mailer_key == "b"


def test_mailer_keys_narrow_without_reordering():
    a, b = Scripted("a", 100, [Kind.TRANSIENT]), Scripted("b", 1)
    d = dispatcher([a, b], max_retries=0)
    answer = run(d, ["b", "a", "zzz"])
    assert (a.calls, b.calls) == (1, 1)
    assert answer.status == 200 and answer.mailer_key == "b"
    assert run(d, ["b"]).mailer_key == "b" and a.calls == 1


def test_unknown_keys_are_refused_and_no_backends_is_send_failed():
    answer = run(dispatcher([Scripted("a")]), ["x", "y"])
    assert (answer.status, answer.code, answer.message) == (
        422,
        "ERR_UNKNOWN_MAILER",
        "mailerKeys names no configured mailer: [x, y]; use keys that "
        "GET /api/mailer/mailers lists, or leave mailerKeys out to use any",
    )
    answer = run(dispatcher([]))
    assert (answer.status, answer.code, answer.message) == (
        502,
        "ERR_SEND_FAILED",
        "no mailers configured",
    )


def test_retries_are_one_plus_max_retries_per_backend():
    a = Scripted("a", 2, [Kind.TRANSIENT] * 10)
    b = Scripted("b", 1, [Kind.TRANSIENT] * 10)
    answer = run(dispatcher([a, b], max_retries=2))
    assert (a.calls, b.calls) == (3, 3)
    assert answer.code == "ERR_SEND_FAILED"
    assert answer.message.startswith("all mailers failed, last error: b (fake): ")


def test_backend_scoped_rejection_fails_over_without_retry():
    a, b = Scripted("a", 2, [Kind.REJECTED_BACKEND]), Scripted("b", 1)
    answer = run(dispatcher([a, b], max_retries=2))
    assert (a.calls, b.calls, answer.status, answer.mailer_key) == (1, 1, 200, "b")


def test_message_scoped_rejection_stops():
    a, b = Scripted("a", 2, [Kind.REJECTED_MESSAGE]), Scripted("b", 1)
    answer = run(dispatcher([a, b]))
    assert (answer.status, answer.code) == (422, "ERR_PERMANENT_FAILURE")
    assert b.calls == 0 and "a (fake): bad recipient" in answer.message


def test_unscoped_is_422_only_when_unanimous():
    a, b = Scripted("a", 2, [Kind.REJECTED_UNSCOPED]), Scripted("b", 1, [Kind.REJECTED_UNSCOPED])
    answer = run(dispatcher([a, b]))
    assert (answer.status, answer.code, a.calls, b.calls) == (422, "ERR_PERMANENT_FAILURE", 1, 1)
    a, b = Scripted("a", 2, [Kind.REJECTED_UNSCOPED]), Scripted("b", 1, [Kind.REJECTED_BACKEND])
    answer = run(dispatcher([a, b]))
    assert (answer.status, answer.code) == (502, "ERR_SEND_FAILED")


def test_unknown_stops_without_retry_or_failover():
    a, b = Scripted("a", 2, [Kind.UNKNOWN]), Scripted("b", 1)
    answer = run(dispatcher([a, b], max_retries=2))
    assert (answer.status, answer.code, a.calls, b.calls) == (502, "ERR_OUTCOME_UNKNOWN", 1, 0)


def test_retry_wait_uses_the_clock():
    clock = task.Clock()
    a = Scripted("a", 1, [Kind.TRANSIENT, Kind.TRANSIENT])
    d = dispatcher([a], clock, retry_wait=2, max_retries=2)
    started = d.start(MESSAGE)
    assert a.calls == 1 and not started.result.called
    clock.advance(1.9)
    assert a.calls == 1
    clock.advance(0.1)
    assert a.calls == 2
    clock.advance(2)
    assert a.calls == 3 and started.result.called


def test_deadline_during_retry_wait_is_send_failed_after_one_call():
    clock = task.Clock()
    a = Scripted("a", 1, [Kind.TRANSIENT] * 5)
    d = dispatcher([a], clock, retry_wait=20, max_retries=2, send_timeout=25)
    started = d.start(MESSAGE)
    clock.advance(20)
    assert a.calls == 2
    clock.advance(5)
    answer = started.result.result
    assert (answer.code, a.calls) == ("ERR_SEND_FAILED", 2)
    assert "deadline" in answer.message
    assert not clock.getDelayedCalls()


def test_deadline_during_attempt_uses_the_backend_classification():
    clock = task.Clock()
    a = Scripted("a", 2, ["pending"], on_cancel=Outcome.unknown("after dot"))
    b = Scripted("b", 1)
    started = dispatcher([a, b], clock, send_timeout=25).start(MESSAGE)
    assert a.deadlines == [25.0]
    clock.advance(25)
    answer = started.result.result
    assert (answer.code, b.calls) == ("ERR_OUTCOME_UNKNOWN", 0)

    a = Scripted("a", 2, ["pending"], on_cancel=Outcome.transient("still connecting"))
    b = Scripted("b", 1)
    started = dispatcher([a, b], clock, send_timeout=25).start(MESSAGE)
    clock.advance(25)
    assert (started.result.result.code, b.calls) == ("ERR_SEND_FAILED", 0)


def test_client_disconnect_cancels_the_attempt():
    a = Scripted("a", 1, ["pending"], on_cancel=Outcome.transient("aborted"))
    started = dispatcher([a], task.Clock()).start(MESSAGE)
    started.cancel("client disconnected")
    answer = started.result.result
    assert answer.code == "ERR_SEND_FAILED" and "client disconnected" in answer.message
    assert a.calls == 1


def test_retry_after_longer_than_the_deadline_fails_over_at_once():
    clock = task.Clock()
    a = Scripted("a", 2, [Outcome.transient("429", retry_after=60)])
    b = Scripted("b", 1)
    answer = run(dispatcher([a, b], clock, retry_wait=2, send_timeout=25))
    assert (answer.mailer_key, a.calls) == ("b", 1)


def test_retry_after_extends_the_wait():
    clock = task.Clock()
    a = Scripted("a", 1, [Outcome.transient("429", retry_after=7)])
    started = dispatcher([a], clock, retry_wait=2).start(MESSAGE)
    clock.advance(6.9)
    assert a.calls == 1
    clock.advance(0.1)
    assert a.calls == 2 and started.result.result.status == 200


def test_a_crashing_backend_is_unknown():
    class Boom(Scripted):
        async def send(self, message, *, deadline):
            raise RuntimeError("bug")

    answer = run(dispatcher([Boom("a", 2), Scripted("b", 1)]))
    assert answer.code == "ERR_OUTCOME_UNKNOWN"


def test_metrics_count_attempts_failovers_and_sends():
    registry = CollectorRegistry()
    a, b = Scripted("a", 2, [Kind.REJECTED_BACKEND]), Scripted("b", 1)
    d = Dispatcher([a, b], clock=task.Clock(), metrics=MailerMetrics(registry), retry_wait=0)
    run(d)
    get = registry.get_sample_value
    assert get("gorge_mailer_attempts_total", {"mailer": "a", "outcome": "rejected_backend"}) == 1
    assert get("gorge_mailer_attempts_total", {"mailer": "b", "outcome": "accepted"}) == 1
    assert get("gorge_mailer_failovers_total") == 1
    assert get("gorge_mailer_sends_total", {"mailer": "b", "result": "accepted"}) == 1
    assert get("gorge_mailer_send_duration_seconds_count", {"mailer": "a"}) == 1


def test_default_retry_budget_stays_within_ten_seconds():
    from gorge.mailer.settings import load_mailer_settings

    for d in (
        Dispatcher([], clock=task.Clock(), metrics=MailerMetrics(CollectorRegistry())),
        load_mailer_settings({}),
    ):
        assert d.max_retries * d.retry_wait <= 10
        assert d.send_timeout < 30


# --- property: the answer and failover rules hold for any sequence of outcomes

KINDS = list(Kind)


def model(scripts: list[list[Kind]], max_retries: int) -> tuple[int, str | None, list[int]]:
    """The spec's rules, written out independently of the dispatcher."""
    calls = [0] * len(scripts)
    final = []
    for i, script in enumerate(scripts):
        script = list(script)
        for attempt in range(max_retries + 1):
            kind = script.pop(0) if script else Kind.ACCEPTED
            calls[i] += 1
            if kind is Kind.ACCEPTED:
                return 200, None, calls
            if kind is Kind.REJECTED_MESSAGE:
                return 422, "ERR_PERMANENT_FAILURE", calls
            if kind is Kind.UNKNOWN:
                return 502, "ERR_OUTCOME_UNKNOWN", calls
            if kind in (Kind.REJECTED_BACKEND, Kind.REJECTED_UNSCOPED):
                final.append(kind)
                break
            if attempt == max_retries:
                final.append(kind)
    if all(k is Kind.REJECTED_UNSCOPED for k in final):
        return 422, "ERR_PERMANENT_FAILURE", calls
    return 502, "ERR_SEND_FAILED", calls


@settings(max_examples=300, deadline=None)
@example(scripts=[[Kind.TRANSIENT, Kind.REJECTED_UNSCOPED]], max_retries=1)
@example(scripts=[[Kind.REJECTED_UNSCOPED], [Kind.TRANSIENT]], max_retries=0)
@given(
    scripts=st.lists(st.lists(st.sampled_from(KINDS), max_size=4), min_size=1, max_size=4),
    max_retries=st.integers(0, 3),
)
def test_property_final_answer_and_calls(scripts, max_retries):
    backends = [Scripted(f"b{i}", 100 - i, list(s)) for i, s in enumerate(scripts)]
    answer = run(dispatcher(backends, max_retries=max_retries))
    status, code, calls = model(scripts, max_retries)
    assert (answer.status, answer.code) == (status, code)
    assert [b.calls for b in backends] == calls
    assert all(c <= max_retries + 1 for c in calls)
