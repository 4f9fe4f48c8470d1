"""gorge.config: parsers and the Env reader."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gorge.config import (
    ConfigError,
    Env,
    load_http_settings,
    parse_bool,
    parse_int,
    parse_listen_addr,
    parse_size,
)


@given(st.integers(min_value=-(10**12), max_value=10**12))
def test_parse_int_round_trips_every_integer(n):
    assert parse_int(str(n)) == n
    assert parse_int(f"  {n} ") == n


@given(st.text().filter(lambda t: not t.strip().lstrip("+-").isdigit() or not t.strip().isascii()))
def test_parse_int_refuses_everything_else(text):
    try:
        value = parse_int(text)
    except ValueError as e:
        assert "not an integer" in str(e)
    else:  # only ASCII digit strings may parse
        assert str(value) == text.strip().lstrip("+")


@given(
    st.integers(min_value=0, max_value=2**20),
    st.sampled_from(
        [
            ("", 1),
            ("B", 1),
            ("k", 1024),
            ("KB", 1024),
            ("m", 1024**2),
            ("Mb", 1024**2),
            ("G", 1024**3),
            ("gb", 1024**3),
        ]
    ),
)
def test_parse_size_units_are_binary_and_case_insensitive(n, unit):
    suffix, factor = unit
    assert parse_size(f"{n}{suffix}") == n * factor


@pytest.mark.parametrize("bad", ["", "ten", "10X", "1.5M", "-1", "M"])
def test_parse_size_refuses_garbage(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        ("on", True),
        ("0", False),
        ("False", False),
        ("no", False),
        ("off", False),
    ],
)
def test_parse_bool(text, expected):
    assert parse_bool(text) is expected


def test_parse_bool_refuses_unknown_words():
    with pytest.raises(ValueError):
        parse_bool("maybe")


@pytest.mark.parametrize(
    "addr,endpoint",
    [
        (":8160", "tcp:8160"),
        ("127.0.0.1:8160", "tcp:8160:interface=127.0.0.1"),
        ("0.0.0.0:8090", "tcp:8090:interface=0.0.0.0"),
        ("[::]:8160", "tcp6:8160:interface=\\:\\:"),
        ("[::1]:0", "tcp6:0:interface=\\:\\:1"),
        ("localhost:8110", "tcp:8110:interface=127.0.0.1"),
    ],
)
def test_listen_addr_becomes_strports_description(addr, endpoint):
    assert parse_listen_addr(addr) == endpoint


@pytest.mark.parametrize("bad", ["8160", "host", ":port", "1.2.3.4:99999", "a b:1", ""])
def test_listen_addr_refuses_garbage(bad):
    with pytest.raises(ValueError):
        parse_listen_addr(bad)


def test_env_first_non_empty_name_wins_and_legacy_alias_warns():
    env = Env({"NEW": "", "OLD": "7"})
    assert env.int(("NEW", "OLD"), 1) == 7
    assert env.warnings == ["OLD is deprecated, use NEW"]
    env = Env({"NEW": "3", "OLD": "7"})
    assert env.int(("NEW", "OLD"), 1) == 3
    assert env.warnings == []


def test_env_empty_value_is_unset():
    assert Env({"X": ""}).int("X", 42) == 42
    assert Env({}).str("X", "d") == "d"


def test_env_bad_integer_names_the_setting_and_value():
    with pytest.raises(ConfigError) as info:
        Env({"GORGE_X": "12a"}).int("GORGE_X", 1)
    assert info.value.setting == "GORGE_X"
    assert str(info.value) == "GORGE_X: not an integer: '12a'"


def test_env_range_checks():
    with pytest.raises(ConfigError, match="GORGE_X: must be >= 1"):
        Env({"GORGE_X": "0"}).int("GORGE_X", 5, min=1)
    with pytest.raises(ConfigError, match="must be <= 65535"):
        Env({"P": "70000"}).int("P", 1, max=65535)


def test_env_choice_is_exact():
    env = Env({"B": "redsi"})
    with pytest.raises(ConfigError) as info:
        env.choice("B", "mysql", ("mysql", "redis"))
    assert "redsi" in str(info.value) and info.value.setting == "B"
    assert Env({}).choice("B", "mysql", ("mysql", "redis")) == "mysql"


def test_http_settings_defaults_and_override():
    settings = load_http_settings(Env({"GORGE_SERVICE_TOKEN": "s3cret"}), default_listen=":8160")
    assert settings.endpoint == "tcp:8160"
    assert settings.body_limit == 2 * 1024 * 1024
    assert "s3cret" not in repr(settings)
    settings = load_http_settings(
        Env({"GORGE_LISTEN_ADDR": "127.0.0.1:1"}),
        default_listen=":8160",
        listen_override="127.0.0.1:9",
    )
    assert settings.endpoint == "tcp:9:interface=127.0.0.1"


def test_http_settings_bad_listen_names_setting():
    with pytest.raises(ConfigError) as info:
        load_http_settings(Env({"GORGE_LISTEN_ADDR": "nonsense"}), default_listen=":8160")
    assert info.value.setting == "GORGE_LISTEN_ADDR"


def test_http_settings_body_limit():
    settings = load_http_settings(Env({"GORGE_BODY_LIMIT": "10M"}), default_listen=":1")
    assert settings.body_limit == 10 * 1024 * 1024
    with pytest.raises(ConfigError, match="GORGE_BODY_LIMIT"):
        load_http_settings(Env({"GORGE_BODY_LIMIT": "lots"}), default_listen=":1")


@pytest.mark.parametrize(
    "level,expected",
    [
        (None, True),
        ("", True),
        ("debug", True),
        ("info", True),
        ("INFO", True),
        ("warn", False),
        ("error", False),
        ("loud", True),
    ],
)
def test_http_settings_access_log_follows_the_log_level(level, expected):
    environ = {} if level is None else {"GORGE_LOG_LEVEL": level}
    assert load_http_settings(Env(environ), default_listen=":1").access_log is expected


@pytest.mark.parametrize(
    "level,expected",
    [(None, False), ("info", False), ("debug", True), ("DEBUG", True), ("loud", True)],
)
def test_http_settings_debug_log_follows_the_log_level(level, expected):
    environ = {} if level is None else {"GORGE_LOG_LEVEL": level}
    assert load_http_settings(Env(environ), default_listen=":1").debug_log is expected
