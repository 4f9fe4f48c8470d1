"""The shared contract-fixture runner on its own."""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from treq.testing import StubTreq
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from twisted.web.resource import Resource

from gorge.log.logger import Logger
from tests.support.contract import (
    MISSING,
    Answer,
    check,
    crashes,
    fixture_files,
    load_fixture,
    loosely_equal,
    replay,
    resolve,
)
from tests.support.logcapture import logged_events

# --- paths -------------------------------------------------------------------


def test_numeric_segments_index_lists_and_out_of_range_is_absent():
    doc = {"data": [{"id": 1}, {"id": 2}]}
    assert resolve(doc, "data.1.id") == 2
    assert resolve(doc, "data.2") is MISSING
    assert resolve(doc, "data.x") is MISSING
    assert resolve(doc, "data.0.id.more") is MISSING


def test_the_longest_literal_key_wins_and_dotted_keys_resolve():
    doc = {"clients.active": 3, "clients": {"active": 4}, "a": {"b.c": {"d": 4}}}
    assert resolve(doc, "clients.active") == 3
    assert resolve(doc, "a.b.c.d") == 4


def test_a_failing_longer_key_backtracks_to_a_shorter_one():
    doc = {"a.b": {"x": 1}, "a": {"b": {"c": 2}}}
    assert resolve(doc, "a.b.c") == 2
    assert resolve(doc, "a.b.x") == 1


def test_a_present_null_resolves_and_the_empty_path_is_the_document():
    doc = {"error": None}
    assert resolve(doc, "error") is None
    assert resolve(doc, "") is doc
    assert resolve(doc, "data") is MISSING


# --- loose equality ----------------------------------------------------------


def test_numbers_compare_numerically_strings_exactly():
    assert loosely_equal(3, 3.0)
    assert not loosely_equal("3", 3)
    assert not loosely_equal("a", "A")
    assert loosely_equal([1, {"n": 2.0}], [1.0, {"n": 2}])
    assert not loosely_equal([1, 2], [1])
    assert not loosely_equal({"a": 1}, {"a": 1, "b": 2})


@given(st.integers(), st.booleans())
def test_a_boolean_never_equals_a_number(n, flag):
    assert not loosely_equal(n, flag)
    assert not loosely_equal(flag, n)
    assert not loosely_equal([n], [flag])
    assert not loosely_equal({"k": float(n)}, {"k": flag})


@given(st.booleans())
def test_a_boolean_equals_itself(flag):
    assert loosely_equal(flag, flag)


# --- the expect block --------------------------------------------------------


def _answer(doc, status=200, **headers) -> Answer:
    hdrs = Headers({k.replace("_", "-"): [v] for k, v in headers.items()})
    return Answer(status, hdrs, json.dumps(doc, separators=(",", ":")).encode())


ANSWER = _answer(
    {"data": {"total": 2, "ok": True, "name": "alpha beta", "gone": None}},
    Content_Type="application/json",
)


def test_a_matching_expect_block_passes():
    check(
        {
            "status": 200,
            "headerEquals": {"content-type": "application/json"},
            "bodyContains": ['"total":2'],
            "bodyNotContains": ["secret"],
            "jsonHas": ["data.total", "data.ok"],
            "jsonAbsent": ["error", "data.total.x"],
            "jsonEquals": {"data.total": 2.0, "data.ok": True, "data.gone": None},
            "jsonStringContains": {"data.name": ["alpha", "beta"]},
        },
        ANSWER,
    )


@pytest.mark.parametrize(
    "expect",
    [
        {"status": 201},
        {"status": 200, "headerEquals": {"Content-Type": "text/plain"}},
        {"status": 200, "bodyContains": ["secret"]},
        {"status": 200, "bodyNotContains": ["total"]},
        {"status": 200, "jsonHas": ["data.gone"]},
        {"status": 200, "jsonHas": ["data.missing"]},
        {"status": 200, "jsonAbsent": ["data.gone"]},
        {"status": 200, "jsonEquals": {"data.ok": 1}},
        {"status": 200, "jsonEquals": {"data.total": "2"}},
        {"status": 200, "jsonEquals": {"data.missing": None}},
        {"status": 200, "jsonStringContains": {"data.name": ["gamma"]}},
        {"status": 200, "jsonStringContains": {"data.total": ["2"]}},
    ],
    ids=lambda e: ",".join(k for k in e if k != "status") or "status",
)
def test_each_check_can_fail(expect):
    with pytest.raises(AssertionError):
        check(expect, ANSWER)


def test_an_empty_string_is_not_present():
    with pytest.raises(AssertionError):
        check({"status": 200, "jsonHas": ["s"]}, _answer({"s": ""}))


def test_the_body_is_decoded_only_for_json_checks():
    plain = Answer(200, Headers(), b"not json")
    check({"status": 200, "bodyContains": ["not"]}, plain)
    with pytest.raises(ValueError):
        check({"status": 200, "jsonAbsent": ["x"]}, plain)
    with pytest.raises(AssertionError):
        check({"status": 200, "jsonAbsent": ["x"]}, Answer(200, Headers(), b"[1]"))


# --- fixture files -----------------------------------------------------------


def test_fixture_files_are_the_directory_json_in_name_order(tmp_path):
    for name in ("b.json", "a.json", "notes.txt"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "unavailable").mkdir()
    (tmp_path / "unavailable" / "c.json").write_text("{}")
    assert [p.name for p in fixture_files(tmp_path)] == ["a.json", "b.json"]


@pytest.mark.parametrize(
    "fixture",
    [
        {"request": {"method": "GET", "path": "/"}, "expect": {"status": 200}},
        {"name": "n", "request": {"path": "/"}, "expect": {"status": 200}},
        {"name": "n", "request": {"method": "GET"}, "expect": {"status": 200}},
        {"name": "n", "request": {"method": "GET", "path": "/"}, "expect": {}},
    ],
)
def test_a_fixture_without_a_required_field_fails(tmp_path, fixture):
    path = tmp_path / "f.json"
    path.write_text(json.dumps(fixture))
    with pytest.raises(AssertionError):
        load_fixture(path)


class _Echo(Resource):
    """Answers with what it received, so the replayed request can be checked."""

    isLeaf = True

    def render(self, request):
        request.setHeader(b"content-type", b"application/json")
        return json.dumps(
            {
                "method": request.method.decode(),
                "uri": request.uri.decode(),
                "token": (request.getHeader(b"x-service-token") or b"").decode(),
                "contentType": request.getHeader(b"content-type"),
                "body": request.content.read().decode(),
            }
        ).encode()


@pytest_twisted.ensureDeferred
async def test_replay_sends_the_request_as_written(tmp_path):
    path = tmp_path / "echo.json"
    path.write_text(
        json.dumps(
            {
                "name": "echo",
                "request": {
                    "method": "POST",
                    "path": "/api/x?token=t",
                    "headers": {"X-Service-Token": "contract-token"},
                    "body": "{not json",
                },
                "expect": {
                    "status": 200,
                    "jsonEquals": {
                        "method": "POST",
                        "uri": "/api/x?token=t",
                        "token": "contract-token",
                        "contentType": None,
                        "body": "{not json",
                    },
                },
            }
        )
    )
    await replay(StubTreq(_Echo()), path)


@pytest_twisted.ensureDeferred
async def test_replay_fails_when_the_answer_differs(tmp_path):
    path = tmp_path / "wrong.json"
    path.write_text(
        json.dumps(
            {
                "name": "wrong",
                "request": {"method": "GET", "path": "/"},
                "expect": {"status": 200, "jsonEquals": {"method": "POST"}},
            }
        )
    )
    with pytest.raises(AssertionError):
        await replay(StubTreq(_Echo()), path)


# --- crash events ------------------------------------------------------------


def test_panics_and_logged_failures_are_crashes_and_other_events_are_not():
    log = Logger(namespace="contract-test")
    with logged_events() as events:
        log.info("REQUEST_DONE status={status}", status=200)
        log.error("PANIC_RECOVERED path={path}", path="/x")
        try:
            raise ZeroDivisionError("division by zero")
        except ZeroDivisionError:
            log.failure("HANDLER_FAILED", Failure())
    found = crashes(events)
    assert len(found) == 2
    assert found[0] == "PANIC_RECOVERED path=/x"
    assert found[1] == "HANDLER_FAILED"
    log.error("PANIC_RECOVERED after={n}", n=1)
    assert len(events) == 3  # nothing is recorded once the block is left
