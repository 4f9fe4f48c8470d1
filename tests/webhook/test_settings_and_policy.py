"""Configuration and the outbound URI policy, without a database."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from OpenSSL import SSL
from twisted.internet import task
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone, ConnectionLost, ConnectionRefusedError
from twisted.internet.error import TimeoutError as ConnectTimeout
from twisted.python.failure import Failure
from twisted.web.client import ResponseFailed, ResponseNeverReceived

from gorge.config import ConfigError, Env
from gorge.webhook.settings import (
    DEFAULT_OUTBOUND_BLACKLIST,
    load_webhook_settings,
    parse_blacklist,
)
from gorge.webhook.transport import BodyCutShort, transport_code
from gorge.webhook.uripolicy import Unresolvable, UriPolicy, UriRefused
from tests.support.paths import REPO_ROOT


def test_defaults():
    s = load_webhook_settings({})
    assert s.http.listen_addr == ":8160" and s.http.endpoint == "tcp:8160"
    assert s.mysql.database == "phorge_herald" and s.mysql.host == "127.0.0.1"
    assert (s.poll_interval, s.delivery_timeout, s.max_concurrent) == (1.0, 15, 16)
    assert (s.breaker_window, s.breaker_threshold, s.retry_backoff, s.claim_lease) == (
        300,
        10,
        60,
        30,
    )
    assert len(s.outbound_blacklist) == 29
    assert s.effective_lease == 30 and s.effective_retry == 60
    assert s.startup_warnings() == []


def test_canonical_names_win_and_legacy_names_warn():
    env = Env(
        {
            "GORGE_WEBHOOK_POLL_INTERVAL_MS": "250",
            "POLL_INTERVAL_MS": "9",
            "MAX_CONCURRENT": "3",
            "STORAGE_NAMESPACE": "phabricator",
            "MYSQL_PASS": "pw",
        },
        "gorge-webhook",
    )
    s = load_webhook_settings({}, env=env)
    assert s.poll_interval == 0.25 and s.max_concurrent == 3
    assert s.mysql.database == "phabricator_herald" and s.mysql.password == "pw"
    assert "pw" not in repr(s)
    assert sorted(env.warnings) == sorted(
        [
            "MAX_CONCURRENT is deprecated, use GORGE_WEBHOOK_MAX_CONCURRENT",
            "STORAGE_NAMESPACE is deprecated, use GORGE_WEBHOOK_NAMESPACE",
            "MYSQL_PASS is deprecated, use GORGE_WEBHOOK_MYSQL_PASS",
        ]
    )


@pytest.mark.parametrize(
    "name,value",
    [
        ("GORGE_WEBHOOK_POLL_INTERVAL_MS", "x"),
        ("GORGE_WEBHOOK_POLL_INTERVAL_MS", "0"),
        ("GORGE_WEBHOOK_MAX_CONCURRENT", "0"),
        ("GORGE_WEBHOOK_DELIVERY_TIMEOUT", "0"),
        ("GORGE_WEBHOOK_ERROR_THRESHOLD", "0"),
        ("GORGE_WEBHOOK_ERROR_BACKOFF_SEC", "-1"),
        ("GORGE_WEBHOOK_RETRY_BACKOFF_SEC", "-1"),
        ("GORGE_WEBHOOK_CLAIM_LEASE_SEC", "1.5"),
        ("GORGE_WEBHOOK_MYSQL_PORT", "0"),
        ("GORGE_WEBHOOK_MYSQL_PORT", "65536"),
        ("GORGE_WEBHOOK_OUTBOUND_BLACKLIST", "10.0.0.0/8, nonsense"),
        ("GORGE_LISTEN_ADDR", "nope"),
    ],
)
def test_bad_values_name_the_setting(name, value):
    with pytest.raises(ConfigError) as info:
        load_webhook_settings({name: value})
    assert info.value.setting == name


def test_blacklist_parsing():
    assert parse_blacklist(None) == tuple(
        ipaddress.ip_network(n) for n in DEFAULT_OUTBOUND_BLACKLIST
    )
    assert parse_blacklist("none") == () and parse_blacklist(" NONE ") == ()
    assert parse_blacklist(" 10.1.2.3/8 ,, fd00::/8 ") == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("fd00::/8"),
    )
    # Empty counts as unset: a blank value never switches the guard off.
    assert (
        len(load_webhook_settings({"GORGE_WEBHOOK_OUTBOUND_BLACKLIST": ""}).outbound_blacklist)
        == 29
    )


@pytest.mark.parametrize("value", [" ", "  \t", ",", " , ,"])  # "," is "${A},${B}" with both unset
def test_a_blank_or_item_less_blacklist_is_the_default_not_allow_all(value):
    # A blank or badly interpolated setting can never switch the guard off.
    settings = load_webhook_settings({"GORGE_WEBHOOK_OUTBOUND_BLACKLIST": value})
    assert settings.outbound_blacklist == parse_blacklist(None)
    assert len(settings.outbound_blacklist) == 29


def test_warnings_for_a_lease_raised_to_the_timeout():
    s = load_webhook_settings({"GORGE_WEBHOOK_CLAIM_LEASE_SEC": "5"})
    assert s.effective_lease == 15
    text = " ".join(s.startup_warnings())
    assert "raised to the delivery timeout" in text and "retried every" not in text


@pytest.mark.slow
def test_twistd_exits_2_with_one_line_on_bad_configuration():
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), GORGE_WEBHOOK_POLL_INTERVAL_MS="x")
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from twisted.scripts.twistd import run; run()",
            "--nodaemon",
            "--pidfile=",
            "gorge-webhook",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "gorge-webhook: GORGE_WEBHOOK_POLL_INTERVAL_MS: not an integer: 'x'"
    ]


# -- URI policy ----------------------------------------------------------------


def policy(blacklist=None, addresses=None, fail=False):
    async def resolve(host, port):
        if fail:
            raise OSError("no such host")
        return list(addresses or [])

    return UriPolicy(parse_blacklist(blacklist), resolve, task.Clock(), 15)


def check(p: UriPolicy, uri: str):
    d = Deferred.fromCoroutine(p.check(uri))
    results = []
    d.addBoth(results.append)
    assert results, "the check did not finish"
    if isinstance(results[0], Failure):
        results[0].raiseException()
    return results[0]


@pytest.mark.parametrize(
    "uri,failed",
    [
        ("ftp://example.com/x", "scheme"),
        ("HTTP://example.com/", "scheme"),
        ("example.com", "scheme"),
        ("http:///x", "host"),
        ("https://", "host"),
        ("http://[::1/x", "host"),
        ("http://127.0.0.1:8080/x", "blacklisted address"),
        ("http://[::1]/", "blacklisted address"),
        ("http://[::ffff:10.1.2.3]/", "blacklisted address"),
        ("http://169.254.169.254/", "blacklisted address"),
    ],
)
def test_refused_uris(uri, failed):
    with pytest.raises(UriRefused) as info:
        check(policy(), uri)
    assert info.value.check == failed


def test_every_resolved_address_is_checked():
    with pytest.raises(UriRefused):
        check(policy(addresses=["93.184.216.34", "10.0.0.7"]), "https://hook.example/x")
    target = check(
        policy(addresses=["93.184.216.34", "2606:2800:220:1::1"]),
        "https://hook.example:8443/x?token=t",
    )
    assert (target.host, target.port, target.scheme) == ("hook.example", 8443, "https")
    assert target.addresses == ("93.184.216.34", "2606:2800:220:1::1")


def test_unresolvable_is_not_a_refusal_even_with_blacklist_none():
    for blacklist in (None, "none"):
        with pytest.raises(Unresolvable):
            check(policy(blacklist=blacklist, fail=True), "http://hook.invalid/")
        with pytest.raises(Unresolvable):
            check(policy(blacklist=blacklist, addresses=[]), "http://hook.invalid/")


def test_blacklist_none_allows_loopback():
    assert check(policy("none"), "http://127.0.0.1:1/x").addresses == ("127.0.0.1",)


@given(st.sampled_from(DEFAULT_OUTBOUND_BLACKLIST), st.integers(0, 2**128 - 1), st.booleans())
def test_any_address_in_a_default_range_is_refused(cidr, offset, mapped):
    network = ipaddress.ip_network(cidr)
    address = network[offset % network.num_addresses]
    if mapped and address.version == 4:
        address = ipaddress.IPv6Address(f"::ffff:{address}")
    assert policy().blocked(str(address))


@given(st.integers(0, 2**32 - 1))
def test_public_ipv4_is_allowed_exactly_when_outside_every_range(value):
    address = ipaddress.IPv4Address(value)
    inside = any(
        address in ipaddress.ip_network(c)
        for c in DEFAULT_OUTBOUND_BLACKLIST
        if ipaddress.ip_network(c).version == 4
    )
    assert policy().blocked(str(address)) is inside


# -- transport error codes ---------------------------------------


@pytest.mark.parametrize(
    "exc,code",
    [
        (ConnectionRefusedError(), 7),
        (ConnectTimeout(), 28),
        (ResponseNeverReceived([Failure(ConnectionDone())]), 52),
        (ResponseNeverReceived([Failure(ConnectionLost())]), 56),
        # The connection failed while the body was read: cut short, however it ended...
        (BodyCutShort(Failure(ResponseFailed([Failure(ConnectionDone())]))), 18),
        (BodyCutShort(Failure(ResponseFailed([Failure(ConnectionLost())]))), 18),
        # ...unless TLS broke underneath.
        (
            BodyCutShort(
                Failure(ResponseFailed([Failure(SSL.Error([("", "", "bad record mac")]))]))
            ),
            35,
        ),
        # Closed part-way through the status line or headers: not a body cut short,
        # so "anything else", whatever the close looked like.
        (ResponseFailed([Failure(ConnectionDone())]), 0),
        (ResponseFailed([Failure(ConnectionLost())]), 0),
        (ResponseNeverReceived([Failure(ConnectionRefusedError())]), 7),
        (ValueError("?"), 0),
    ],
)
def test_transport_codes(exc, code):
    assert transport_code(exc) == code


@pytest.mark.slow
def test_a_listener_that_cannot_bind_exits_1_before_polling():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = dict(
            os.environ,
            PYTHONPATH=str(REPO_ROOT),
            GORGE_LISTEN_ADDR=f"127.0.0.1:{port}",
            GORGE_WEBHOOK_MYSQL_PORT="1",
            GORGE_LOG_LEVEL="debug",
        )
        result = subprocess.run(
            [
                sys.executable,
                "-c",
                "from twisted.scripts.twistd import run; run()",
                "--nodaemon",
                "--pidfile=",
                "--logger=gorge.log.output.observer_from_env",
                "gorge-webhook",
            ],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert "CannotListenError" in output
    assert "WEBHOOK_POLL" not in output and "WEBHOOK_CONFIG " in output


def test_the_example_env_file_holds_the_defaults():
    from gorge.webhook.settings import load_webhook_settings
    from tests.support.paths import REPO_ROOT

    lines = (REPO_ROOT / "conf" / "webhook.env.example").read_text().splitlines()
    env = dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))
    assert {
        "GORGE_WEBHOOK_STANDARD_HEADERS",
        "GORGE_WEBHOOK_RETRY_AFTER_MAX_SEC",
        "GORGE_WEBHOOK_URL",
    } <= set(env)
    assert load_webhook_settings(env) == load_webhook_settings({})
    settings = load_webhook_settings(
        {"GORGE_WEBHOOK_STANDARD_HEADERS": "1", "GORGE_WEBHOOK_RETRY_AFTER_MAX_SEC": "0"}
    )
    assert (settings.standard_headers, settings.retry_after_max) == (True, 0)


@pytest.mark.parametrize(
    "name,value",
    [
        ("GORGE_WEBHOOK_STANDARD_HEADERS", "maybe"),
        ("GORGE_WEBHOOK_RETRY_AFTER_MAX_SEC", "-1"),
        ("GORGE_WEBHOOK_RETRY_AFTER_MAX_SEC", "1h"),
    ],
)
def test_bad_new_settings_name_themselves(name, value):
    from gorge.config import ConfigError
    from gorge.webhook.settings import load_webhook_settings

    with pytest.raises(ConfigError) as raised:
        load_webhook_settings({name: value})
    assert raised.value.setting == name


def test_the_settings_carry_every_start_up_warning():
    # Legacy names and the combinations that work but surprise, in one place
    # (logged as WEBHOOK_CONFIG_WARNING), as every daemon's settings do.
    s = load_webhook_settings({"MAX_CONCURRENT": "3", "GORGE_WEBHOOK_CLAIM_LEASE_SEC": "5"})
    assert "MAX_CONCURRENT is deprecated, use GORGE_WEBHOOK_MAX_CONCURRENT" in s.warnings
    assert any(w.startswith("GORGE_WEBHOOK_CLAIM_LEASE_SEC=5 raised") for w in s.warnings)
