"""Native FeedPublisherHTTPWorker: byte-exact against Phorge's own requests
(tests/fixtures/feed), shapes and policy."""

from __future__ import annotations

import json
from urllib.parse import parse_qsl, unquote_plus

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from gorge.worker.handlers.feed_http import (
    FeedHttpHandler,
    FeedPolicy,
    http_build_query,
    php_urlencode,
)
from gorge.worker.outcome import PermanentFailure, RetryLater
from gorge.worker.registry import Registry
from tests.support.logcapture import logged_events
from tests.support.paths import FIXTURES_DIR
from tests.worker.fakes import run_through_consumer
from tests.worker.rawhttp import Answer

FEED_DIR = FIXTURES_DIR / "feed"
CASES = sorted(p.name for p in FEED_DIR.iterdir() if p.is_dir())


def golden(case: str) -> dict:
    folder = FEED_DIR / case
    row = json.loads((folder / "feed_storydata_row.json").read_text())
    pairs = json.loads((folder / "body_decoded_pairs.json").read_text())
    return {
        "row": row,
        "story_text": dict(pairs)["storyText"],
        "body": (folder / "body.bin").read_bytes(),
        "headers": json.loads((folder / "headers.json").read_text()),
        "task": json.loads((folder / "worker_task_before.json").read_text()),
    }


def story_task_data(g: dict, uri: str) -> str:
    """What a story-field task carries: the story as Phorge has it, PHP-encoded."""
    row = g["row"]
    return json.dumps(
        {
            "storyID": row["id"],
            "storyType": row["storyType"],
            "storyData": json.loads(row["storyData"]),
            "storyAuthorPHID": row["authorPHID"],
            "storyText": g["story_text"],
            "epoch": row["dateCreated"],
            "uri": uri,
        }
    )


@pytest.mark.parametrize("case", CASES)
@pytest_twisted.ensureDeferred
async def test_request_matches_what_phorge_sends(case, reactor, http_client, raw_server):
    g = golden(case)
    status = g["headers"]["receiver_responded_status"]
    server, base = raw_server(Answer(status=status, body=b"ignored", content_type="text/plain"))
    path = g["headers"]["request_line"].split()[1]
    handler = FeedHttpHandler(http_client, reactor)
    task = {
        "id": g["task"]["worker_activetask"]["id"],
        "taskClass": "FeedPublisherHTTPWorker",
        "failureCount": 0,
    }
    try:
        await handler(task, story_task_data(g, base + path))
        outcome = None
    except RetryLater as exc:
        outcome = exc
    (request,) = server.requests
    assert request.body == g["body"]
    assert request.request_line == g["headers"]["request_line"]
    golden_headers = dict(g["headers"]["headers"])
    assert request.header("Content-Type") == golden_headers["Content-Type"]
    assert request.header("Content-Length") == golden_headers["Content-Length"]
    assert request.header("Host") == base.split("//")[1]
    assert request.header("Accept") == golden_headers["Accept"]
    assert request.header("Accept-Encoding") == golden_headers["Accept-Encoding"]
    for absent in ("Expect", "Authorization", "X-Service-Token", "Transfer-Encoding"):
        assert request.header(absent) is None
    if status == 200:
        assert outcome is None
    else:
        assert outcome is not None and outcome.retry_wait == 60
        assert f"returned status {status}" in str(outcome)


@pytest_twisted.ensureDeferred
async def test_receiver_500_is_reported_as_a_temporary_failure(reactor, http_client, raw_server):
    g = golden("story_2_comment_receiver_500")
    _, base = raw_server(Answer(status=500, body=b"oops", content_type="text/plain"))
    registry = Registry()
    registry.register("FeedPublisherHTTPWorker", FeedHttpHandler(http_client, reactor))
    task = {
        "id": 36,
        "taskClass": "FeedPublisherHTTPWorker",
        "failureCount": 2,
        "data": story_task_data(g, base + "/feed/status/500"),
    }
    report, consumer = await run_through_consumer(reactor, registry, task)
    assert (report.kind, report.task_id) == ("fail", 36)
    assert report.args["permanent"] is False and report.args["retryWait"] == 180
    assert consumer.counters.failed == 1


@pytest_twisted.ensureDeferred
async def test_snapshot_body_is_posted_verbatim(reactor, http_client, raw_server):
    server, base = raw_server(Answer(status=204))
    body = "storyID=9&storyText=a+b%7E"
    handler = FeedHttpHandler(http_client, reactor)
    await handler(
        {"id": 1, "failureCount": 0},
        json.dumps({"deliveryVersion": 1, "uri": base + "/h", "body": body}),
    )
    assert server.requests[0].body == body.encode()


@pytest_twisted.ensureDeferred
async def test_redirect_is_not_followed(reactor, http_client, raw_server):
    server, base = raw_server(Answer(status=302))
    handler = FeedHttpHandler(http_client, reactor)
    with pytest.raises(RetryLater, match="returned status 302"):
        await handler({"id": 1, "failureCount": 0}, json.dumps({"storyID": 3, "uri": base + "/h"}))
    assert len(server.requests) == 1


def _call(handler, data, failure_count=0):
    return Deferred.fromCoroutine(handler({"id": 1, "failureCount": failure_count}, data))


class RecordingClient:
    def __init__(self):
        self.calls = []

    def request(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        raise AssertionError("must not send")


@pytest.mark.parametrize(
    "data",
    [
        None,
        "",
        "not json",
        "[1,2]",
        "42",
        '"text"',
        # too deep to decode: as undeliverable as bad syntax,
        # and retrying it would never end
        '{"storyID":1,"uri":"http://h/x","storyData":' + "[" * 100_000,
    ],
)
def test_task_data_that_is_not_a_json_object_fails_permanently(data):
    client = RecordingClient()
    d = _call(FeedHttpHandler(client, Clock()), data)
    errors = []
    d.addErrback(errors.append)
    assert errors and errors[0].check(PermanentFailure)
    assert client.calls == []


@pytest.mark.parametrize(
    "doc",
    [
        {"uri": "http://h/x"},
        {"storyID": 0, "uri": "http://h/x"},
        {"storyID": 3, "uri": ""},
        {"deliveryVersion": 2, "uri": "http://h/x", "body": "a=b"},
        {"deliveryVersion": 1, "uri": "http://h/x", "body": ""},
        # JSON true is not the number 1, however Python compares them
        {"deliveryVersion": True, "uri": "http://h/x", "body": "a=b"},
        {"storyID": True, "uri": "http://h/x"},
        {"key": "1", "uri": "http://h/x", "storyID": 0},
    ],
)
def test_undeliverable_shapes_fail_permanently(doc):
    client = RecordingClient()
    errors = []
    _call(FeedHttpHandler(client, Clock()), json.dumps(doc)).addErrback(errors.append)
    assert errors and errors[0].check(PermanentFailure)
    assert client.calls == []


def test_legacy_key_without_conduit_is_retried_later_and_never_sent():
    client = RecordingClient()
    errors = []
    data = (
        FEED_DIR / "story_1_PhabricatorApplicationTransactionFeedStory" / "worker_task_before.json"
    )
    raw = json.loads(data.read_text())["worker_taskdata"]["data"]
    _call(FeedHttpHandler(client, Clock()), raw, failure_count=1).addErrback(errors.append)
    assert errors and errors[0].check(RetryLater)
    assert errors[0].value.retry_wait == 120
    assert "GORGE_WORKER_CONDUIT_URL" in str(errors[0].value)
    assert client.calls == []


def test_legacy_key_with_conduit_is_delegated_with_the_raw_data():
    client = RecordingClient()
    seen = []

    async def delegate(task, data):
        seen.append(data)

    raw = '{"key":"7713533494219205552","uri":"http:\\/\\/127.0.0.1:8765\\/feed\\/hook"}'
    d = _call(FeedHttpHandler(client, Clock(), delegate=delegate), raw)
    assert d.called and seen == [raw] and client.calls == []


def test_policy_file_silent_unlisted_and_broken(tmp_path):
    client = RecordingClient()
    path = tmp_path / "policy.json"
    data = json.dumps({"storyID": 3, "uri": "http://h/x"})
    policy = FeedPolicy(str(path))
    handler = FeedHttpHandler(client, Clock(), policy=policy)

    errors = []
    _call(handler, data).addErrback(errors.append)  # missing file
    assert errors[-1].check(RetryLater)
    path.write_text('{"silent": true, "uris": []}')
    policy.reload()
    assert _call(handler, data).called and client.calls == []
    path.write_text('{"silent": false, "uris": ["http://h/other"]}')
    policy.reload()
    _call(handler, data).addErrback(errors.append)
    assert errors[-1].check(PermanentFailure)
    assert "no longer configured" in str(errors[-1].value)
    path.write_text('{"silent": false}')
    policy.reload()
    _call(handler, data).addErrback(errors.append)
    assert errors[-1].check(RetryLater)
    assert "needs boolean silent and list uris" in str(errors[-1].value)


def test_policy_file_is_read_once_not_per_task(tmp_path):
    client = RecordingClient()
    path = tmp_path / "policy.json"
    path.write_text('{"silent": true, "uris": []}')
    with logged_events() as events:
        policy = FeedPolicy(str(path))
    assert [e["log_format"].split()[0] for e in events] == ["WORKER_FEED_POLICY_LOADED"]
    handler = FeedHttpHandler(client, Clock(), policy=policy)
    path.unlink()  # a task must not look at the file again
    data = json.dumps({"storyID": 3, "uri": "http://h/x"})
    assert _call(handler, data).called and client.calls == []
    with logged_events() as events:
        policy.reload()
    assert [e["log_format"].split()[0] for e in events] == ["WORKER_FEED_POLICY_UNUSABLE"]
    errors = []
    _call(handler, data).addErrback(errors.append)
    assert errors[-1].check(RetryLater) and "FileNotFoundError" in str(errors[-1].value)


def test_http_build_query_follows_php_rules():
    body = http_build_query(
        [
            ("storyID", 5),
            ("storyType", "T y~pe"),
            (
                "storyData",
                {
                    "a": True,
                    "b": False,
                    "c": None,
                    "d": [],
                    "e": {},
                    "f": ["x", 2],
                    "g": "",
                    "h": 1.5,
                },
            ),
            ("storyText", "ü&=/"),
        ]
    )
    assert body == (
        b"storyID=5&storyType=T+y%7Epe&storyData%5Ba%5D=1&storyData%5Bb%5D=0"
        b"&storyData%5Bf%5D%5B0%5D=x&storyData%5Bf%5D%5B1%5D=2&storyData%5Bg%5D="
        b"&storyData%5Bh%5D=1.5&storyText=%C3%BC%26%3D%2F"
    )


@given(st.text())
def test_php_urlencode_leaves_only_php_safe_bytes_and_round_trips(text):
    encoded = php_urlencode(text)
    assert set(encoded) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-+%"
    )
    assert unquote_plus(encoded) == text


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["storyID", "storyType", "storyText", "epoch"]),
            st.one_of(st.text(), st.integers()),
        ),
        max_size=6,
    )
)
def test_http_build_query_keeps_order_and_values(fields):
    decoded = parse_qsl(http_build_query(fields).decode(), keep_blank_values=True)
    assert decoded == [(name, str(value)) for name, value in fields]
