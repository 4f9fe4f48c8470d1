"""Configuration: env and file modes, the backend list,
strict vs lenient, and the one-line exit for every start-up error."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gorge.config import ConfigError, Env, JsonFields
from gorge.mailer.service import Options, build_mailer_service, makeService
from gorge.mailer.settings import MalformedList, load_mailer_settings, parse_backend_list


def entries(env):
    return [(e.key, e.type, e.priority, dict(e.options)) for e in load_mailer_settings(env).entries]


def test_defaults():
    s = load_mailer_settings({})
    assert (s.max_retries, s.retry_wait, s.body_limit, s.send_timeout) == (2, 2.0, 524288, 25.0)
    assert s.http.listen_addr == ":8110" and s.http.body_limit == 10 * 1024 * 1024
    assert s.entries == () and s.config_problem is None and s.drain_budget == 30


def test_numeric_and_string_options_are_coerced():
    env = {
        "GORGE_MAILER_CONFIG": json.dumps(
            [
                {
                    "key": "p",
                    "type": "smtp",
                    "priority": 100,
                    "options": {"host": "mail", "port": 587, "tls-insecure": True, "user": None},
                }
            ]
        )
    }
    assert entries(env) == [
        ("p", "smtp", 100, {"host": "mail", "port": "587", "tls-insecure": "true", "user": ""})
    ]


def test_auto_priorities_follow_declaration_order():
    env = {
        "GORGE_MAILER_CONFIG": json.dumps(
            [
                {"key": "a", "type": "test"},
                {"key": "b", "type": "test", "priority": 0},
                {"key": "c", "type": "test", "priority": 3},
                {"key": "d", "type": "test"},
            ]
        )
    }
    assert [(k, p) for k, _, p, _ in entries(env)] == [("a", -1), ("b", -2), ("c", 3), ("d", -3)]


def test_flat_single_backend():
    env = {
        "GORGE_MAILER_TYPE": "smtp",
        "SMTP_HOST": "mail.example.com",
        "SMTP_PORT": "587",
        "SMTP_USER": "u",
        "SMTP_PASSWORD": "p",
        "SMTP_PROTOCOL": "tls",
        "MAILER_FROM_NUMBER": "123",
        "MAILER_AUTH_TOKEN": "x",
    }
    assert entries(env) == [
        (
            "default",
            "smtp",
            -1,
            {
                "host": "mail.example.com",
                "port": "587",
                "user": "u",
                "password": "p",
                "protocol": "tls",
            },
        )
    ]


def test_valid_list_wins_over_flat_variables():
    env = {"GORGE_MAILER_CONFIG": "[]", "GORGE_MAILER_TYPE": "smtp"}
    assert entries(env) == []
    env = {"GORGE_MAILER_CONFIG": "null", "GORGE_MAILER_TYPE": "test", "GORGE_MAILER_KEY": "k"}
    assert entries(env) == [("k", "test", -1, {})]


MALFORMED = [
    "{",
    "{}",
    "[1]",
    '[{"key": 1, "type": "test"}]',
    '[{"key": "a", "type": "test", "priority": "high"}]',
    '[{"key": "a", "type": "test", "options": []}]',
    '[{"key": "a", "type": "test", "options": {"x": {"y": 1}}}]',
]


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_list_is_lenient_by_default(text):
    s = load_mailer_settings({"GORGE_MAILER_CONFIG": text, "GORGE_MAILER_TYPE": "test"})
    assert [e.key for e in s.entries] == ["default"] and s.config_problem is None
    s = load_mailer_settings({"GORGE_MAILER_CONFIG": text})
    assert s.entries == () and s.config_problem.startswith("mailer configuration invalid: ")
    assert any("GORGE_MAILER_CONFIG ignored" in w for w in s.warnings)


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_list_stops_strict_mode(text):
    with pytest.raises(ConfigError) as e:
        load_mailer_settings({"GORGE_MAILER_CONFIG": text, "GORGE_MAILER_STRICT": "1"})
    assert e.value.setting == "GORGE_MAILER_CONFIG"


def test_strict_mode_needs_a_backend():
    with pytest.raises(ConfigError) as e:
        load_mailer_settings({"GORGE_STRICT_CONFIG": "true"})
    assert "no mailers configured" in str(e.value)
    # The service's own switch wins over the project-wide one.
    assert not load_mailer_settings({"GORGE_STRICT_CONFIG": "1", "GORGE_MAILER_STRICT": "0"}).strict


@pytest.mark.parametrize(
    "env,setting",
    [
        ({"GORGE_MAILER_MAX_RETRIES": "x"}, "GORGE_MAILER_MAX_RETRIES"),
        ({"GORGE_MAILER_MAX_RETRIES": "-1"}, "GORGE_MAILER_MAX_RETRIES"),
        ({"MAX_RETRIES": "two"}, "MAX_RETRIES"),
        ({"GORGE_MAILER_RETRY_WAIT": "-2"}, "GORGE_MAILER_RETRY_WAIT"),
        ({"GORGE_MAILER_BODY_LIMIT": "1.5"}, "GORGE_MAILER_BODY_LIMIT"),
        ({"GORGE_MAILER_SEND_TIMEOUT": "0"}, "GORGE_MAILER_SEND_TIMEOUT"),
        ({"GORGE_MAILER_STRICT": "maybe"}, "GORGE_MAILER_STRICT"),
        ({"GORGE_LISTEN_ADDR": "nonsense"}, "GORGE_LISTEN_ADDR"),
        (
            {"GORGE_MAILER_CONFIG": '[{"key":" ","type":"test"}]'},
            "GORGE_MAILER_CONFIG [element 0].key",
        ),
        (
            {"GORGE_MAILER_CONFIG": '[{"key":"a","type":"test"},{"key":"a","type":"test"}]'},
            "GORGE_MAILER_CONFIG [a].key",
        ),
    ],
)
def test_bad_scalars_stop_start_up(env, setting):
    with pytest.raises(ConfigError) as e:
        load_mailer_settings(env)
    assert e.value.setting == setting


def test_body_limit_zero_or_negative_disables_truncation():
    assert load_mailer_settings({"GORGE_MAILER_BODY_LIMIT": "-1"}).body_limit == -1


def test_legacy_names_work_and_warn():
    s = load_mailer_settings(
        {
            "MAILER_CONFIG": '[{"key":"t","type":"test"}]',
            "RETRY_WAIT": "1",
            "SERVICE_TOKEN": "tok",
            "LISTEN_ADDR": ":9000",
        }
    )
    assert [e.key for e in s.entries] == ["t"] and s.retry_wait == 1
    assert s.http.token == "tok" and s.http.listen_addr == ":9000"
    assert any("RETRY_WAIT is deprecated" in w for w in s.warnings)


def test_warnings_for_long_retry_budget_and_send_timeout():
    s = load_mailer_settings({"GORGE_MAILER_MAX_RETRIES": "6", "GORGE_MAILER_SEND_TIMEOUT": "30"})
    assert any("exceeds 10 s" in w for w in s.warnings)
    assert any("30 s" in w for w in s.warnings)


def test_file_mode(tmp_path):
    path = tmp_path / "mailer.json"
    path.write_text(
        json.dumps(
            {
                "listenAddr": "127.0.0.1:8111",
                "mailers": [{"key": "t", "type": "test", "priority": 7}],
                "maxRetries": 1,
                "retryWaitSec": 0,
                "bodyLimit": 100,
                "sendTimeoutSec": 20,
                "extra": True,
            }
        )
    )
    s = load_mailer_settings(
        {
            "GORGE_MAILER_CONFIG_FILE": str(path),
            "GORGE_SERVICE_TOKEN": "from-env",
            "GORGE_MAILER_MAX_RETRIES": "9",
        }
    )
    assert (s.max_retries, s.retry_wait, s.body_limit, s.send_timeout) == (1, 0, 100, 20)
    assert s.http.listen_addr == "127.0.0.1:8111" and s.http.token == "from-env"
    assert [(e.key, e.priority) for e in s.entries] == [("t", 7)]
    assert any("GORGE_MAILER_MAX_RETRIES is ignored" in w for w in s.warnings)
    assert any("extra" in w for w in s.warnings)
    path.write_text(json.dumps({"serviceToken": ""}))
    assert (
        load_mailer_settings(
            {"GORGE_MAILER_CONFIG_FILE": str(path), "GORGE_SERVICE_TOKEN": "x"}
        ).http.token
        == ""
    )


@pytest.mark.parametrize(
    "content",
    ["{", "[]", '{"mailers": {}}', '{"maxRetries": "2"}', '{"mailers": [{"key": "a", "type": 5}]}'],
)
def test_bad_file_always_stops(tmp_path, content):
    path = tmp_path / "mailer.json"
    path.write_text(content)
    with pytest.raises(ConfigError):
        load_mailer_settings({"GORGE_MAILER_CONFIG_FILE": str(path)})


def test_missing_file_stops(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_mailer_settings({"GORGE_MAILER_CONFIG_FILE": str(tmp_path / "nope.json")})
    assert e.value.setting == "GORGE_MAILER_CONFIG_FILE"


@pytest.mark.parametrize(
    "mailers,line",
    [
        (
            [{"key": "m", "type": "carrier-pigeon"}],
            "gorge-mailer: GORGE_MAILER_CONFIG [m].type: unknown mailer type: carrier-pigeon",
        ),
        (
            [{"key": "sg", "type": "test", "options": {"fail": "sometimes"}}],
            "gorge-mailer: GORGE_MAILER_CONFIG [sg].fail: must be one of",
        ),
        (
            [{"key": "t", "type": "test", "options": {"fail-times": "x"}}],
            "gorge-mailer: GORGE_MAILER_CONFIG [t].fail-times: not an integer: 'x'",
        ),
        (
            [{"key": "primary", "type": "smtp", "options": {"port": "abc", "password": "hunter2"}}],
            "gorge-mailer: GORGE_MAILER_CONFIG [primary].port: not an integer: 'abc'",
        ),
        (
            [{"key": "primary", "type": "smtp", "options": {"protocol": "tls13"}}],
            "gorge-mailer: GORGE_MAILER_CONFIG [primary].protocol: must be one of",
        ),
    ],
)
@pytest.mark.parametrize("strict", ["0", "1"])
def test_unbuildable_entry_exits_2_with_one_line(monkeypatch, capsys, mailers, line, strict):
    for name in list(__import__("os").environ):
        if name.startswith(("GORGE_", "SMTP_", "MAILER_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("GORGE_MAILER_CONFIG", json.dumps(mailers))
    monkeypatch.setenv("GORGE_MAILER_STRICT", strict)
    options = Options()
    options.parseOptions([])
    with pytest.raises(SystemExit) as e:
        makeService(options)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(line)
    assert "hunter2" not in err


def test_make_service_builds_a_tree(monkeypatch):
    for name in list(__import__("os").environ):
        if name.startswith(("GORGE_", "SMTP_", "MAILER_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("GORGE_MAILER_CONFIG", '[{"key":"t","type":"test"}]')
    options = Options()
    options.parseOptions(["--listen", "127.0.0.1:0"])
    service = makeService(options)
    assert [b.key for b in service.part("dispatcher").backends] == ["t"]
    assert not service.running


def test_every_backend_type_is_registered():
    from gorge.mailer.backends import BACKEND_TYPES

    assert set(BACKEND_TYPES) == {
        "smtp",
        "sendmail",
        "ses",
        "sendgrid",
        "mailgun",
        "postmark",
        "test",
    }


@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "key": st.text(min_size=1, max_size=5).filter(lambda k: k.strip()),
                "priority": st.integers(-5, 5),
            }
        ),
        max_size=6,
        unique_by=lambda d: d["key"],
    )
)
def test_property_effective_priorities(items):
    docs = [{"key": d["key"], "type": "test", "priority": d["priority"]} for d in items]
    got = parse_backend_list(json.dumps(docs), "GORGE_MAILER_CONFIG")
    autos = [e.priority for e, d in zip(got, items, strict=True) if d["priority"] == 0]
    assert autos == list(range(-1, -len(autos) - 1, -1))
    assert all(
        e.priority == d["priority"] for e, d in zip(got, items, strict=True) if d["priority"]
    )


def test_parse_list_null_is_unset():
    assert parse_backend_list("null", "X") is None
    with pytest.raises(MalformedList):
        parse_backend_list("NaN", "X")


def test_unknown_options_are_ignored_and_named_at_debug(events):
    from twisted.internet import task

    settings = load_mailer_settings(
        {
            "GORGE_MAILER_CONFIG": json.dumps(
                [{"key": "t", "type": "test", "options": {"fail": "", "colour": "blue"}}]
            )
        }
    )
    build_mailer_service(settings, task.Clock(), listen=False)
    ignored = [e for e in events if "MAILER_OPTION_IGNORED" in (e.get("log_format") or "")]
    assert [(e["mailer"], e["option"]) for e in ignored] == [("t", "colour")]


@pytest.mark.parametrize("strict", ["0", "1"])
@pytest.mark.parametrize(
    "text,setting,reason",
    [
        ('[{"type": "test"}]', "GORGE_MAILER_CONFIG [element 0].key", "must not be empty"),
        (
            '[{"key": null, "type": "test"}]',
            "GORGE_MAILER_CONFIG [element 0].key",
            "must not be empty",
        ),
        ('[{"key": "a"}]', "GORGE_MAILER_CONFIG [a].type", "type is required"),
    ],
)
def test_missing_key_or_type_is_a_start_up_error_in_both_modes(strict, text, setting, reason):
    # Key and type are required, and a violation is a start-up error
    # (like an empty key or an unknown type), never the lenient
    # "malformed list" path that silently drops the whole list.
    with pytest.raises(ConfigError) as e:
        load_mailer_settings(
            {
                "GORGE_MAILER_CONFIG": text,
                "GORGE_MAILER_STRICT": strict,
                "GORGE_MAILER_TYPE": "test",
            }
        )
    assert e.value.setting == setting and reason in e.value.reason


@pytest.mark.parametrize(
    "name",
    [
        "SMTP_HOST",
        "MAILER_API_KEY",
        "GORGE_MAILER_KEY",
        "LISTEN_ADDR",
        "MAILER_CONFIG",
        "MAX_RETRIES",
        "RETRY_WAIT",
        "BODY_LIMIT",
        "MAILER_TYPE",
    ],
)
def test_file_mode_warns_about_every_ignored_variable(tmp_path, name):
    # In file mode the flat single-backend variables (and the legacy
    # spellings of the env-mode settings) are not read either; a warning
    # tells the operator so. The warning names the variable, never its value.
    path = tmp_path / "mailer.json"
    path.write_text("{}")
    s = load_mailer_settings({"GORGE_MAILER_CONFIG_FILE": str(path), name: "v4lue"})
    assert any(w.startswith(f"{name} is ignored") for w in s.warnings), s.warnings
    assert not any("v4lue" in w for w in s.warnings)


# -- the file and the environment read numbers alike (gorge.config.TypedReader)


@pytest.mark.parametrize(
    "content,setting,reason",
    [
        ('{"maxRetries": "2"}', "GORGE_MAILER_CONFIG_FILE maxRetries", "not an integer: '2'"),
        ('{"maxRetries": true}', "GORGE_MAILER_CONFIG_FILE maxRetries", "not an integer: True"),
        ('{"retryWaitSec": 1.5}', "GORGE_MAILER_CONFIG_FILE retryWaitSec", "not an integer: 1.5"),
        ('{"maxRetries": -1}', "GORGE_MAILER_CONFIG_FILE maxRetries", "must be >= 0, got -1"),
        ('{"sendTimeoutSec": 0}', "GORGE_MAILER_CONFIG_FILE sendTimeoutSec", "must be >= 1, got 0"),
        ('{"listenAddr": 8110}', "GORGE_MAILER_CONFIG_FILE listenAddr", "not a string: 8110"),
        ('{"serviceToken": []}', "GORGE_MAILER_CONFIG_FILE serviceToken", "not a string: an array"),
    ],
)
def test_a_bad_file_value_is_named_and_bounded_like_a_variable(tmp_path, content, setting, reason):
    path = tmp_path / "mailer.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as e:
        load_mailer_settings({"GORGE_MAILER_CONFIG_FILE": str(path)})
    assert (e.value.setting, e.value.reason) == (setting, reason)


def test_integral_json_numbers_are_integers(tmp_path):
    path = tmp_path / "mailer.json"
    path.write_text('{"maxRetries": 3.0, "bodyLimit": null}')
    s = load_mailer_settings({"GORGE_MAILER_CONFIG_FILE": str(path)})
    assert (s.max_retries, s.body_limit) == (3, 524288)


@given(value=st.integers(-5, 5), minimum=st.integers(-3, 3))
def test_property_file_and_environment_agree_on_bounds(value, minimum):
    def outcome(read):
        try:
            return read()
        except ConfigError as e:
            return e.reason.replace("'", "")

    from_env = outcome(lambda: Env({"N": str(value)}).int("N", 0, min=minimum))
    from_json = outcome(lambda: JsonFields({"N": value}).int("N", 0, min=minimum))
    assert from_env == from_json


@pytest.mark.parametrize(
    "element,cause",
    [
        (
            '{"key": "a", "type": "test", "priority": 1.5}',
            "element 0.priority: not an integer: 1.5",
        ),
        ('{"key": "a", "type": 5}', "element 0.type: not a string: 5"),
        (
            '{"key": "a", "type": "test", "options": []}',
            "element 0.options: not an object: an array",
        ),
    ],
)
def test_a_malformed_element_names_its_field(element, cause):
    s = load_mailer_settings({"GORGE_MAILER_CONFIG": f"[{element}]"})
    assert s.config_problem == f"mailer configuration invalid: {cause}"
