"""Conduit delegation against a loopback server that checks the exact wire
format, and how each answer becomes a queue report."""

from __future__ import annotations

import json
from urllib.parse import parse_qsl

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.defer import CancelledError, Deferred

from gorge.worker.conduit import ConduitClient, ConduitError, parse_conduit_answer, snippet
from gorge.worker.handlers.conduit import ConduitDelegate
from gorge.worker.registry import Registry
from tests.worker.fakes import CapturedEvents, run_through_consumer
from tests.worker.rawhttp import Answer

TOKEN = "conduit-secret"
DATA = '{"documentPHID":"PHID-TASK-abc","context":{"x":"\\u00e9"}}'


def envelope(result=None, code=None, info=None) -> bytes:
    return json.dumps({"result": result, "error_code": code, "error_info": info}).encode()


def assert_wire_format(request, *, task_id=12, task_class="PhabricatorSearchWorker", data=DATA):
    assert request.request_line == "POST /api/worker.execute HTTP/1.1"
    assert request.header("Content-Type") == "application/x-www-form-urlencoded"
    assert request.header("Accept") == "application/json"
    assert request.header("X-Service-Token") == TOKEN
    fields = parse_qsl(request.body.decode("ascii"), keep_blank_values=True)
    assert [name for name, _ in fields] == ["params", "output"]
    assert fields[1] == ("output", "json")
    params = json.loads(fields[0][1])
    expected = {"taskClass": task_class, "returnFollowups": True, "__conduit__": {"token": TOKEN}}
    if task_id is not None:
        expected.update(taskID=task_id, data=data)
    assert params == expected
    if task_id is not None:
        assert type(params["taskID"]) is int and type(params["data"]) is str


FOLLOWUP = {
    "taskClass": "FeedPublisherHTTPWorker",
    "data": '{"key":"1","uri":"http://hook.test/"}',
    "priority": 3000,
    "objectPHID": None,
    "containerPHID": None,
    "delayUntil": None,
}

CASES = [
    ("success", Answer(body=envelope({"result": "success", "duration": 99})), "complete", {}),
    (
        "success-with-followups",
        Answer(body=envelope({"result": "success", "followups": [FOLLOWUP]})),
        "complete",
        {"followups": [FOLLOWUP]},
    ),
    (
        "unreadable-followups",
        Answer(body=envelope({"result": "success", "followups": "all of them"})),
        "fail",
        {"permanent": False},
    ),
    (
        "yield",
        Answer(body=envelope({"result": "yield", "duration": 3, "retry": 120})),
        "yield",
        {"duration": 120},
    ),
    (
        "yield-floor",
        Answer(body=envelope({"result": "yield", "retry": 1})),
        "yield",
        {"duration": 5},
    ),
    (
        "yield-no-retry",
        Answer(body=envelope({"result": "yield", "duration": 700})),
        "yield",
        {"duration": 5},
    ),
    (
        "permanent",
        Answer(
            body=envelope(
                {
                    "result": "permanent-failure",
                    "failureType": "permanent",
                    "failureReason": "no such object",
                }
            )
        ),
        "fail",
        {
            "permanent": True,
            "retryWait": None,
            "message": "PhabricatorSearchWorker permanently failed: no such object",
        },
    ),
    (
        "failure",
        Answer(body=envelope({"result": "failure", "failureReason": "db down"})),
        "fail",
        {
            "permanent": False,
            "retryWait": None,
            "message": "PhabricatorSearchWorker failed: db down",
        },
    ),
    (
        "failure-retry",
        Answer(body=envelope({"result": "failure", "retry": 30})),
        "fail",
        {"permanent": False, "retryWait": 30},
    ),
    (
        "conduit-error-200",
        Answer(body=envelope(code="ERR-CONDUIT-CORE", info="boom")),
        "fail",
        {
            "permanent": False,
            "retryWait": None,
            "message": "conduit worker.execute for PhabricatorSearchWorker (id=12): "
            "conduit error [ERR-CONDUIT-CORE]: boom",
        },
    ),
    (
        "gateway-401",
        Answer(
            status=401,
            body=envelope(code="ERR-CONDUIT-AUTH", info="Missing or invalid service token."),
        ),
        "fail",
        {"permanent": False},
    ),
    (
        "unexpected",
        Answer(body=envelope({"result": "maybe"})),
        "fail",
        {
            "permanent": False,
            "message": "worker.execute for PhabricatorSearchWorker (id=12) "
            'returned unexpected result "maybe"',
        },
    ),
    ("null-result", Answer(body=envelope(None)), "fail", {"permanent": False}),
    ("not-an-object", Answer(body=envelope("done")), "fail", {"permanent": False}),
]


@pytest.mark.parametrize("name, answer, kind, args", CASES, ids=[c[0] for c in CASES])
@pytest_twisted.ensureDeferred
async def test_each_answer_maps_to_the_right_report(
    name, answer, kind, args, reactor, http_client, raw_server
):
    server, base = raw_server(answer)
    registry = Registry()
    registry.register(
        "PhabricatorSearchWorker", ConduitDelegate(ConduitClient(http_client, reactor, base, TOKEN))
    )
    task = {"id": 12, "taskClass": "PhabricatorSearchWorker", "failureCount": 0, "data": DATA}
    report, consumer = await run_through_consumer(reactor, registry, task)
    (request,) = server.requests
    assert_wire_format(request)
    assert (report.kind, report.task_id) == (kind, 12)
    for key, value in args.items():
        assert report.args[key] == value
    if name == "not-an-object":
        assert report.args["message"].startswith(
            "decode worker.execute result for PhabricatorSearchWorker (id=12)"
        )


@pytest_twisted.ensureDeferred
async def test_html_answer_fails_temporarily_with_status_and_snippet_in_the_log(
    reactor, http_client, raw_server
):
    page = b"<html>\r\n<head><title>Site Not Found</title></head>\n" + b"x" * 400 + b"</html>"
    # A 500 is PHP's own answer (a 502 would be a proxy's: not reached).
    server, base = raw_server(Answer(status=500, body=page, content_type="text/html"))
    registry = Registry()
    registry.set_fallback(ConduitDelegate(ConduitClient(http_client, reactor, base, TOKEN)))
    task = {"id": 77, "taskClass": "SomeWorker", "failureCount": 0}
    with CapturedEvents() as captured:
        report, _ = await run_through_consumer(reactor, registry, task)
        (line,) = [e for e in captured.named("WORKER_TASK_OUTCOME") if e["task_id"] == 77]
    assert_wire_format(server.requests[0], task_id=77, task_class="SomeWorker", data="")
    assert report.kind == "fail" and report.args["permanent"] is False
    expected = (
        "conduit worker.execute for SomeWorker (id=77): conduit worker.execute "
        "returned non-JSON (HTTP 500): " + snippet(page)
    )
    assert line["message"] == expected
    assert "<html> <head><title>Site Not Found</title></head> xxx" in line["message"]
    assert line["message"].endswith("\u2026")


@pytest_twisted.ensureDeferred
async def test_invalid_class_name_fails_permanently_without_a_call(
    reactor, http_client, raw_server
):
    server, base = raw_server(Answer(body=envelope({"result": "success"})))
    registry = Registry()
    registry.set_fallback(ConduitDelegate(ConduitClient(http_client, reactor, base, TOKEN)))
    task = {"id": 5, "taskClass": "Evil;Class", "failureCount": 0}
    report, _ = await run_through_consumer(reactor, registry, task)
    assert report.kind == "fail" and report.args["permanent"] is True
    assert report.args["message"] == "invalid task class"
    assert server.requests == []


@pytest.mark.parametrize(
    "answer, reason",
    [
        (Answer(body=envelope(code="ERR-NO-TASK-CLASS", info="No task class")), None),
        (
            Answer(body=envelope(code="ERR-WORKER-AUTH", info="nope")),
            "conduit error [ERR-WORKER-AUTH]: nope",
        ),
        (
            Answer(status=200, body=b"<html>Site Not Found</html>", content_type="text/html"),
            "conduit worker.execute returned non-JSON (HTTP 200): <html>Site Not Found</html>",
        ),
        (
            Answer(body=envelope({"result": "success"})),
            "conduit worker.execute ran a task without a class",
        ),
    ],
)
@pytest_twisted.ensureDeferred
async def test_probe(answer, reason, reactor, http_client, raw_server):
    server, base = raw_server(answer)
    client = ConduitClient(http_client, reactor, base, TOKEN)
    assert await Deferred.fromCoroutine(client.probe()) == reason
    assert_wire_format(server.requests[0], task_id=None, task_class="")


@pytest_twisted.ensureDeferred
async def test_probe_is_bounded(reactor, http_client, raw_server):
    server, base = raw_server(Answer(hang=True))
    client = ConduitClient(http_client, reactor, base, TOKEN)
    reason = await Deferred.fromCoroutine(client.probe(timeout=0.2))
    assert reason == "probe timed out after 0.2s"


@pytest_twisted.ensureDeferred
async def test_an_answer_over_the_cap_fails_the_call_temporarily(reactor, http_client, raw_server):
    from gorge.worker import conduit

    server, base = raw_server(Answer(body=b" " * (conduit.ANSWER_LIMIT + 1)))
    client = ConduitClient(http_client, reactor, base, TOKEN)
    with pytest.raises(ConduitError, match="response body over the limit of 1048576 bytes"):
        await Deferred.fromCoroutine(client.execute(12, "PhabricatorSearchWorker", DATA))
    assert len(server.requests) == 1


def test_snippet_rules():
    assert snippet(b"") == ""
    assert snippet(b"  a\r\nb\nc\rd  ") == "a b c d"
    assert snippet(b"y" * 200) == "y" * 200
    assert snippet(b"y" * 201) == "y" * 200 + "\u2026"


@given(st.binary(max_size=600))
def test_snippet_is_one_bounded_line(raw):
    text = snippet(raw)
    assert "\n" not in text and "\r" not in text
    assert len(text) <= 201


DEEP = b"[" * 100_000  # valid JSON prefix deep enough to exhaust the decoder's recursion


def test_deeply_nested_body_is_a_non_json_answer_not_a_decoder_crash():
    with pytest.raises(ConduitError) as info:
        parse_conduit_answer(200, DEEP)
    assert str(info.value) == (
        "conduit worker.execute returned non-JSON (HTTP 200): " + snippet(DEEP)
    )


@pytest_twisted.ensureDeferred
async def test_probe_with_a_deeply_nested_answer_fails_with_a_reason(
    reactor, http_client, raw_server
):
    server, base = raw_server(Answer(body=DEEP))
    client = ConduitClient(http_client, reactor, base, TOKEN)
    reason = await Deferred.fromCoroutine(client.probe())
    assert reason == "conduit worker.execute returned non-JSON (HTTP 200): " + snippet(DEEP)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(
    st.one_of(
        JSON_VALUES,
        st.fixed_dictionaries(
            {
                "result": st.sampled_from(
                    ["success", "yield", "permanent-failure", "failure", "", "other"]
                )
                | JSON_VALUES
            },
            optional={"retry": JSON_VALUES, "failureReason": JSON_VALUES, "duration": JSON_VALUES},
        ),
    )
)
def test_every_worker_execute_result_becomes_exactly_one_outcome(result):
    from gorge.worker.handlers.conduit import interpret_result
    from gorge.worker.outcome import PermanentFailure, RetryLater, Yield

    try:
        interpret_result(12, "SomeWorker", result)
    except Yield as exc:
        assert isinstance(result, dict) and result["result"] == "yield"
        assert isinstance(exc.seconds, int) and exc.seconds >= 5
    except PermanentFailure:
        assert isinstance(result, dict) and result["result"] == "permanent-failure"
    except RetryLater as exc:
        assert not (
            isinstance(result, dict)
            and result.get("result") in ("success", "yield", "permanent-failure")
        )
        assert exc.retry_wait is None or (isinstance(exc.retry_wait, int) and exc.retry_wait >= 0)
    else:
        assert isinstance(result, dict) and result["result"] == "success"


class _CountingAgent:
    """The test's own agent, counting the requests handed to it."""

    def __init__(self, agent) -> None:
        self._agent = agent
        self.sent = 0

    def request(self, *args, **kwargs):
        self.sent += 1
        return self._agent.request(*args, **kwargs)


@pytest_twisted.ensureDeferred
async def test_delegated_calls_beyond_the_concurrency_wait_their_turn(
    reactor, http_client, raw_server
):
    def answer(request):
        # The first two calls run until cancelled; later ones answer at once.
        return Answer(hang=True) if len(server.requests) < 2 else Answer(body=envelope("done"))

    server, base = raw_server(answer)
    agent = _CountingAgent(http_client)
    client = ConduitClient(agent, reactor, base, TOKEN, concurrency=2)
    calls = [
        Deferred.fromCoroutine(client.execute(task_id, "PhabricatorSearchWorker", DATA))
        for task_id in (1, 2, 3)
    ]
    await server.received(2)
    assert agent.sent == 2 and not calls[2].called
    calls[0].cancel()  # the lease deadline of a running call frees its place
    assert await calls[2] == "done"
    assert agent.sent == 3
    assert json.loads(dict(parse_qsl(server.requests[2].body.decode()))["params"])["taskID"] == 3
    calls[1].cancel()
    for call in calls[:2]:
        with pytest.raises(CancelledError):
            await call
