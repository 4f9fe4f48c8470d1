"""gorge.log: level filter, text/JSON lines, redaction."""

import io
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.logger import Logger as TwistedLogger  # noqa: TID251 - the reference
from twisted.logger import LogLevel, LogPublisher

from gorge.config import ConfigError
from gorge.log.logger import Logger
from gorge.log.output import make_observer, request_id_var
from gorge.log.redaction import redact_uri, scrub


def _emit(environ, fn):
    stream = io.StringIO()
    publisher = LogPublisher(make_observer(environ, stream))
    fn(Logger(namespace="gorge.test", observer=publisher))
    return stream.getvalue().splitlines()


def test_level_filter_drops_lower_levels():
    lines = _emit(
        {"GORGE_LOG_LEVEL": "warn"},
        lambda log: (
            log.debug("DEBUG_EVENT"),
            log.info("INFO_EVENT"),
            log.warn("WARN_EVENT x={x}", x=1),
        ),
    )
    assert len(lines) == 1 and "WARN_EVENT x=1" in lines[0]


def test_default_level_is_info_and_text_format():
    lines = _emit({}, lambda log: (log.debug("D"), log.info("HELLO who={who}", who="you")))
    assert len(lines) == 1
    assert "INFO" in lines[0] and "[gorge.test] HELLO who=you" in lines[0]


def test_json_lines_carry_event_fields_and_request_id():
    def emit(log):
        token = request_id_var.set("req-1")
        try:
            log.info("TASK_LEASED id={id}", id=7, password="hunter2")
        finally:
            request_id_var.reset(token)

    [line] = _emit({"GORGE_LOG_FORMAT": "json"}, emit)
    record = json.loads(line)
    assert record["event"] == "TASK_LEASED"
    assert record["level"] == "info"
    assert record["msg"] == "TASK_LEASED id=7"
    assert record["id"] == 7
    assert record["request_id"] == "req-1"
    assert "hunter2" not in line


def test_failure_is_rendered_with_traceback():
    def emit(log):
        try:
            raise ValueError("boom")
        except ValueError:
            log.failure("X_FAILED")

    lines = _emit({"GORGE_LOG_FORMAT": "json"}, emit)
    record = json.loads(lines[0])
    assert "ValueError: boom" in record["traceback"]


@pytest.mark.parametrize(
    "env,setting",
    [
        ({"GORGE_LOG_LEVEL": "loud"}, "GORGE_LOG_LEVEL"),
        ({"GORGE_LOG_FORMAT": "xml"}, "GORGE_LOG_FORMAT"),
    ],
)
def test_bad_log_settings_name_the_setting(env, setting):
    with pytest.raises(ConfigError) as info:
        make_observer(env, io.StringIO())
    assert info.value.setting == setting


@pytest.mark.parametrize(
    "uri,expected",
    [
        ("/api/x?token=abc", "/api/x?token=[REDACTED]"),
        (
            "/a?x=1&api_key=k&Service-Token=t&y=2",
            "/a?x=1&api_key=[REDACTED]&Service-Token=[REDACTED]&y=2",
        ),
        ("/a?PassWord=p#frag", "/a?PassWord=[REDACTED]#frag"),
        ("/plain/path", "/plain/path"),
        ("/a?tokens=keep", "/a?tokens=keep"),
    ],
)
def test_redact_uri(uri, expected):
    assert redact_uri(uri) == expected


@given(
    st.text(
        alphabet=st.characters(blacklist_characters="&#=?", blacklist_categories=("Cs",)),
        min_size=1,
    )
)
def test_redacted_uri_never_contains_the_token(secret):
    assert redact_uri(f"/api/queue/stats?token={secret}") == "/api/queue/stats?token=[REDACTED]"


def test_scrub_longest_first():
    assert scrub("key=abcdef and abc", ["abc", "abcdef"]) == "key=[REDACTED] and [REDACTED]"


@given(
    level=st.sampled_from(list(LogLevel.iterconstants())),
    fields=st.dictionaries(
        st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True).filter(
            lambda k: not k.startswith("log_")
        ),
        st.integers() | st.text(max_size=5),
        max_size=4,
    ),
)
def test_gorge_logger_emits_the_events_twisteds_logger_emits(level, fields):
    events: dict[str, list] = {"gorge": [], "twisted": []}
    for name, cls in (("gorge", Logger), ("twisted", TwistedLogger)):
        cls(namespace="gorge.test", observer=events[name].append).emit(
            level, "EVENT a={a}", **fields
        )
    (ours,), (theirs,) = events["gorge"], events["twisted"]
    ours.pop("log_time"), theirs.pop("log_time")
    assert ours.pop("log_logger").namespace == theirs.pop("log_logger").namespace
    assert ours == theirs


def test_gorge_logger_reports_a_level_that_is_not_one():
    events: list = []
    Logger(namespace="gorge.test", observer=events.append).emit("loud", "EVENT")
    (event,) = events
    assert event["log_level"] is LogLevel.critical
    assert event["invalidLevel"] == "loud"
