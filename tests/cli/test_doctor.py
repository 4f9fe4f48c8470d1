"""``gorge doctor`` without a site: its output, ``--json``, exit status, and
the pieces that read settings (env files, listen addresses, MySQL grants,
Phorge's mailer order). tests/phorge/test_doctor.py runs it on real sites."""

from __future__ import annotations

import io
import json
import re
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gorge.cli.doctor import main
from gorge.cli.doctor.grants import ALL, parse_grants
from gorge.cli.doctor.mail import mailer_order
from gorge.cli.doctor.report import (
    Check,
    exit_status,
    fail,
    ok,
    skip,
    warn,
    write_json,
    write_lines,
)
from gorge.cli.doctor.site import base_url, parse_env_file


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the report ---------------------------------------------------------------------


def test_one_line_per_check_with_the_fix_only_where_something_is_wrong():
    checks = [
        ok("namespace", "'phabricator' everywhere"),
        fail("taskmasters", "phd.taskmasters is 2", "./bin/config set phd.taskmasters 0"),
        warn("grants.webhook", "may also ALTER", "no DDL rights"),
        skip("silent", "gorge-webhook is not deployed"),
    ]
    out = io.StringIO()
    write_lines(checks, out)
    assert out.getvalue().splitlines() == [
        "ok   namespace: 'phabricator' everywhere",
        "FAIL taskmasters: phd.taskmasters is 2; fix: ./bin/config set phd.taskmasters 0",
        "warn grants.webhook: may also ALTER; fix: no DDL rights",
        "skip silent: gorge-webhook is not deployed",
        "1 of 4 checks failed: taskmasters",
    ]
    assert exit_status(checks) == 1


def test_warnings_and_skips_do_not_fail():
    checks = [ok("a", "fine"), warn("b", "odd", "look"), skip("c", "n/a")]
    out = io.StringIO()
    write_lines(checks, out)
    assert out.getvalue().splitlines()[-1] == "all 3 checks passed"
    assert exit_status(checks) == 0


def test_json_lists_every_check_and_the_failed_names():
    checks = [ok("a", "fine"), fail("b", "broken", "mend it")]
    out = io.StringIO()
    write_json(checks, out)
    assert json.loads(out.getvalue()) == {
        "ok": False,
        "failed": ["b"],
        "checks": [
            {"name": "a", "status": "ok", "detail": "fine", "fix": ""},
            {"name": "b", "status": "fail", "detail": "broken", "fix": "mend it"},
        ],
    }


def test_a_status_outside_the_four_is_refused():
    with pytest.raises(ValueError, match="status must be one of"):
        Check("a", "fine", "x")


# -- the command ----------------------------------------------------------------------


def run(argv, env=None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main(argv, env=env or {}, out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def test_no_settings_directory_is_one_line_and_exit_2(tmp_path):
    status, out, err = run(["--env-dir", str(tmp_path / "absent")])
    assert status == 2 and out == ""
    assert err == f"gorge doctor: {tmp_path / 'absent'} is not a directory (set --env-dir)\n"


def test_a_directory_without_any_daemon_file_is_exit_2(tmp_path):
    (tmp_path / "gorge.env").write_text("GORGE_LOG_LEVEL=info\n")
    status, _, err = run(["--env-dir", str(tmp_path)])
    assert status == 2 and "no daemon's settings in" in err


def test_bad_usage_is_exit_2():
    status, _, _ = run(["--timeout", "soon"])
    assert status == 2


def test_daemons_that_do_not_answer_fail_by_name_and_exit_1(tmp_path):
    mysql_port = closed_port()
    for name in ("taskqueue", "worker"):
        (tmp_path / f"{name}.env").write_text(f"GORGE_LISTEN_ADDR=127.0.0.1:{closed_port()}\n")
    (tmp_path / "gorge.env").write_text(
        f"GORGE_TASKQUEUE_MYSQL_PORT={mysql_port}\nGORGE_TASKQUEUE_MYSQL_HOST=127.0.0.1\n"
    )
    status, out, _ = run(["--env-dir", str(tmp_path), "--json", "--no-canaries"])
    assert status == 1
    report = json.loads(out)
    by_name = {c["name"]: c for c in report["checks"]}
    assert by_name["gorge-taskqueue"]["status"] == "fail"
    assert "no answer at http://127.0.0.1:" in by_name["gorge-taskqueue"]["detail"]
    assert "systemctl start gorge-taskqueue" in by_name["gorge-taskqueue"]["fix"]
    assert by_name["grants.taskqueue"]["status"] == "fail"
    # Without Phorge's checkout its checks say why they did not run.
    assert by_name["taskmasters"] == {
        "name": "taskmasters",
        "status": "skip",
        "detail": "Phorge's configuration not read (no --phorge-root)",
        "fix": "",
    }
    assert set(report["failed"]) >= {"gorge-taskqueue", "gorge-worker", "grants.taskqueue"}


def test_a_phorge_root_that_is_no_phorge_is_a_failed_check(tmp_path):
    (tmp_path / "taskqueue.env").write_text(f"GORGE_LISTEN_ADDR=127.0.0.1:{closed_port()}\n")
    status, out, _ = run(
        ["--env-dir", str(tmp_path), "--phorge-root", str(tmp_path), "--no-canaries"]
    )
    assert status == 1
    assert re.search(r"^FAIL phorge: .*not a Phorge checkout", out, re.MULTILINE), out


# -- reading the settings ---------------------------------------------------------------


def test_env_files_read_as_systemd_reads_them():
    text = (
        "# comment\n; also a comment\n\nGORGE_A=1\nexport GORGE_B = two words \n"
        "GORGE_C=\"quoted value\"\nGORGE_D='single'\nnot a line\nGORGE_A=again\n"
    )
    assert parse_env_file(text) == {
        "GORGE_A": "again",
        "GORGE_B": "two words",
        "GORGE_C": "quoted value",
        "GORGE_D": "single",
    }


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({}, "http://127.0.0.1:8170"),
        ({"GORGE_LISTEN_ADDR": ":9000"}, "http://127.0.0.1:9000"),
        ({"GORGE_LISTEN_ADDR": "0.0.0.0:9000"}, "http://127.0.0.1:9000"),
        ({"GORGE_LISTEN_ADDR": "[::1]:9000"}, "http://[::1]:9000"),
        (
            {"GORGE_LISTEN_ADDR": "10.0.0.5:9000", "GORGE_TLS_CERT": "/c.pem"},
            "https://10.0.0.5:9000",
        ),
    ],
)
def test_where_a_daemon_is_reached(env, url):
    assert base_url("worker", env) == url


# -- MySQL grants -------------------------------------------------------------------------


def test_grants_at_each_level():
    grants = parse_grants(
        [
            "GRANT USAGE ON *.* TO `gorge`@`%` IDENTIFIED BY PASSWORD '*AB'",
            "GRANT SELECT, INSERT, UPDATE, DELETE ON `ph\\_worker`.* TO `gorge`@`%`",
            "GRANT SELECT ON `ph_herald`.`herald_webhook` TO `gorge`@`%`",
            "GRANT SELECT, UPDATE (status) ON `ph_herald`.`herald_webhookrequest` TO `gorge`@`%`",
        ]
    )
    assert grants.on("ph_worker", "worker_activetask") == {"SELECT", "INSERT", "UPDATE", "DELETE"}
    # An escaped underscore matches only itself.
    assert grants.on("phXworker", "worker_activetask") == frozenset()
    assert grants.on("ph_herald", "herald_webhook") == {"SELECT"}
    # A column grant does not give the table.
    assert grants.on("ph_herald", "herald_webhookrequest") == {"SELECT"}
    assert not grants.roles


def test_all_privileges_on_everything_and_roles():
    grants = parse_grants(
        [
            "GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` WITH GRANT OPTION",
            "GRANT `operators` TO `root`@`localhost`",
        ]
    )
    assert grants.on("any_db", "any_table") == ALL
    assert grants.roles


@given(st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True))
def test_a_database_granted_by_its_escaped_name_matches_itself_only(name):
    escaped = name.replace("_", "\\_")
    grants = parse_grants([f"GRANT SELECT ON `{escaped}`.* TO `u`@`%`"])
    assert grants.on(name, "t") == {"SELECT"}
    if "_" in name:
        assert grants.on(name.replace("_", "x"), "t") == frozenset()


@given(st.from_regex(r"[a-z0-9]{1,20}", fullmatch=True))
def test_a_wildcard_database_grant_matches_by_pattern(suffix):
    grants = parse_grants(["GRANT SELECT ON `ph%`.* TO `u`@`%`"])
    assert grants.on("ph" + suffix, "t") == {"SELECT"}
    assert grants.on("x" + suffix, "t") == frozenset()


# -- Phorge's mailer order ----------------------------------------------------------------


def keys(mailers):
    return [m["key"] for m in mailer_order(mailers)]


def test_mailers_in_list_order_without_priorities():
    assert keys([{"key": "gorge"}, {"key": "smtp"}]) == ["gorge", "smtp"]


def test_a_priority_goes_before_the_list_order_and_outbound_false_drops_out():
    mailers = [
        {"key": "smtp"},
        {"key": "gorge", "priority": 10},
        {"key": "inbound", "outbound": False, "priority": 50},
    ]
    assert keys(mailers) == ["gorge", "smtp"]
