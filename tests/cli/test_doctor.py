"""``gorge doctor`` without a site: its output, ``--json``, exit status, and
the pieces that read settings (env files, listen addresses, MySQL grants,
Phorge's mailer order). tests/phorge/test_doctor.py runs it on real sites."""

from __future__ import annotations

import argparse
import io
import json
import re
import socket
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gorge.cli.doctor import main
from gorge.cli.doctor.canary import Waiting
from gorge.cli.doctor.command import run_checks
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
from gorge.cli.doctor.site import (
    LOADERS,
    PhorgeScript,
    PhorgeView,
    Site,
    base_url,
    daemons_of,
    parse_env_file,
    read_env_dir,
)
from gorge.db.mysql import connect
from gorge.webhook.settings import DEFAULT_OUTBOUND_BLACKLIST


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


# -- each daemon's settings loaded once per run ---------------------------------------


def counted_loaders(loads: Counter) -> dict:
    """The daemons' own settings loaders, each call counted by service."""

    def counting(name, loader):
        def load(env):
            loads[name] += 1
            return loader(env)

        return load

    return {name: counting(name, loader) for name, loader in LOADERS.items()}


def site_with_phorge(tmp_path, loaders, **webhook_env) -> tuple[Site, PhorgeScript]:
    """A site whose daemons do not answer (closed ports, MySQL too), and what
    Phorge would report for it: every check that compares gorge-webhook's
    settings with Phorge's runs, and the webhook canary gets as far as them."""
    env_dir = tmp_path / "etc"
    env_dir.mkdir()
    (env_dir / "gorge.env").write_text("GORGE_LOG_LEVEL=info\n")
    (env_dir / "taskqueue.env").write_text(
        f"GORGE_LISTEN_ADDR=127.0.0.1:{closed_port()}\n"
        f"GORGE_TASKQUEUE_MYSQL_HOST=127.0.0.1\nGORGE_TASKQUEUE_MYSQL_PORT={closed_port()}\n"
    )
    lines = {
        "GORGE_LISTEN_ADDR": f"127.0.0.1:{closed_port()}",
        "GORGE_WEBHOOK_MYSQL_HOST": "127.0.0.1",
        "GORGE_WEBHOOK_MYSQL_PORT": str(closed_port()),
        "GORGE_WEBHOOK_SILENT_FROM": "none",
        **webhook_env,
    }
    (env_dir / "webhook.env").write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
    view = PhorgeView(
        config={
            "storage.default-namespace": "phorge",
            "security.outbound-blacklist": list(DEFAULT_OUTBOUND_BLACKLIST),
            "phabricator.silent": False,
            "phd.taskmasters": 0,
            "load-libraries": ["/srv/gorge/phorge/src"],
        },
        libraries=("phorge", "arcanist", "gorge"),
        worker_execute=True,
        gorge_mailer=True,
        running_taskmasters=0,
    )
    site = Site(daemons_of(read_env_dir(env_dir)), view, "", timeout=5.0, loaders=loaders)
    return site, PhorgeScript(tmp_path, "php", {})


def all_checks(site: Site, script: PhorgeScript) -> dict:
    def no_waiting(seconds):
        raise AssertionError("no canary here waits")

    checks = run_checks(
        site,
        script,
        script.root,
        argparse.Namespace(no_canaries=False, canary_listen="127.0.0.1", mail_to=""),
        connect=connect,
        post=lambda url, params: {},
        waiting=Waiting(lambda: 0.0, no_waiting, 1.0),
    )
    return {c.name: c for c in checks}


def test_each_daemons_settings_are_loaded_once_for_every_check_that_needs_them(tmp_path):
    loads: Counter = Counter()
    site, script = site_with_phorge(tmp_path, counted_loaders(loads))
    by_name = all_checks(site, script)
    assert loads == {"webhook": 1, "taskqueue": 1}
    # Every check that reads them got them: the namespace, both accounts, the
    # outbound policy, silent mode, and the webhook canary's listen address.
    assert by_name["namespace"].status == "ok"
    for service in ("taskqueue", "webhook"):
        account = f"{site.daemons[service].env[f'GORGE_{service.upper()}_MYSQL_PORT']}"
        assert by_name[f"grants.{service}"].status == "fail"
        assert f"@127.0.0.1:{account} cannot open" in by_name[f"grants.{service}"].detail
    assert by_name["outbound-policy"].status == "ok"
    assert by_name["silent"].status == "ok"
    assert by_name["canary.webhook"].status == "skip"
    assert "gorge-webhook refuses 127.0.0.1" in by_name["canary.webhook"].detail


def test_settings_that_do_not_load_are_loaded_once_and_named_by_every_check(tmp_path):
    loads: Counter = Counter()
    site, script = site_with_phorge(
        tmp_path, counted_loaders(loads), GORGE_WEBHOOK_NAMESPACE="not-a-namespace"
    )
    by_name = all_checks(site, script)
    assert loads["webhook"] == 1
    problem = "gorge-webhook's settings: GORGE_WEBHOOK_NAMESPACE"
    for name in ("namespace", "outbound-policy", "silent"):
        assert by_name[name].status == "fail"
        assert by_name[name].detail.startswith(problem), by_name[name]
    assert by_name["canary.webhook"].status == "skip"
    assert by_name["canary.webhook"].detail.startswith(problem)
    assert "grants.webhook" not in by_name  # the namespace check names the problem


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
