"""``gorge doctor`` on a real switched-over site: it passes, and with one
prerequisite broken at a time it names that one first.

The site is the shared switched-over stack (Conduit path, so the bot's
token counts); each test breaks one thing and puts it back. The doctor runs
as the command an operator runs, ``python -m gorge doctor --json``, with
the daemons' settings written into an env directory the way
/etc/gorge holds them."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import pytest_twisted

from gorge_testing.gorge_stack import DAEMONS
from tests.phorge.switched import Switched, gorge_mailer_entry
from tests.support.paths import REPO_ROOT

pytestmark = [
    pytest.mark.parametrize("switched", ["conduit"], indirect=True),
]


def write_env_dir(s: Switched, directory: Path, **changed: dict[str, str]) -> Path:
    """gorge.env (empty) and one <service>.env per running daemon, as the
    stack starts them; ``changed`` overrides per service."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "gorge.env").write_text("# shared settings\nGORGE_LOG_LEVEL=info\n")
    for name in DAEMONS:
        env = {
            **s.gorge.environment(name),
            "GORGE_LISTEN_ADDR": f"127.0.0.1:{s.gorge.ports[name]}",
            **changed.get(name, {}),
        }
        (directory / f"{name}.env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return directory


@pytest.fixture(scope="module")
def doctored(switched, tmp_path_factory):
    """The shared site with Phorge's outbound blacklist as gorge-webhook's
    (the stack's webhook receiver is on 127.0.0.1, so both allow everything)."""
    switched.site.configure({"security.outbound-blacklist": []})
    try:
        yield switched, write_env_dir(switched, tmp_path_factory.mktemp("etc-gorge"))
    finally:
        switched.site.configure({"security.outbound-blacklist": None})


async def doctor(s: Switched, env_dir: Path, *extra: str) -> tuple[int, dict]:
    argv = [
        sys.executable,
        "-m",
        "gorge.cli",
        "doctor",
        "--json",
        "--env-dir",
        str(env_dir),
        "--phorge-root",
        str(s.site.checkout.root),
        "--php",
        s.site.checkout.php,
        *extra,
    ]
    status, out, err = await s.site.run(argv)
    try:
        report = json.loads(out)
    except ValueError:
        raise AssertionError(f"doctor printed no JSON (exit {status}):\n{out}\n{err}") from None
    return status, report


def failures(report: dict) -> list[dict]:
    return [c for c in report["checks"] if c["status"] == "fail"]


def explain(report: dict) -> str:
    return "\n".join(
        f"{c['status']} {c['name']}: {c['detail']} {c['fix']}" for c in report["checks"]
    )


async def first_failure(s: Switched, env_dir: Path, *extra: str) -> dict:
    status, report = await doctor(s, env_dir, "--no-canaries", *extra)
    assert status == 1, explain(report)
    assert report["ok"] is False
    return failures(report)[0]


@pytest_twisted.ensureDeferred
async def test_a_switched_over_site_passes_with_its_canaries(doctored):
    s, env_dir = doctored
    s.smtp.deliveries.clear()
    status, report = await doctor(s, env_dir, "--mail-to", "doctor-sink@example.com")
    assert status == 0, explain(report)
    by_name = {c["name"]: c for c in report["checks"]}
    for name in (
        "gorge-taskqueue",
        "gorge-worker",
        "gorge-webhook",
        "gorge-mailer",
        "library",
        "conduit-bot",
        "namespace",
        "taskmasters",
        "webhook-owner",
        "mailer",
        "outbound-policy",
        "silent",
        "canary.task",
        "canary.webhook",
        "canary.mail",
    ):
        assert by_name[name]["status"] == "ok", explain(report)
    # Each daemon's /api/<service>/version, held to this gorge's API and to
    # the library's GorgeDaemon::REQUIRED_API_VERSION (read through Phorge).
    for name in DAEMONS:
        version = by_name[f"version.{name}"]
        assert version["status"] == "ok", explain(report)
        assert re.search(r", the library needs \d+\.\d+\.\d+\)$", version["detail"]), version
    # The test MariaDB account is an administrator's: allowed, and said.
    assert by_name["grants.taskqueue"]["status"] in ("ok", "warn")
    assert "signature verified" in by_name["canary.webhook"]["detail"]
    assert "by gorge-worker" in by_name["canary.task"]["detail"]
    assert s.deliveries_to("doctor-sink@example.com")
    # The canary hook is left disabled.
    hooks = s.site.rows(
        "herald", "SELECT status FROM herald_webhook WHERE name = 'gorge doctor canary'"
    )
    assert [h["status"] for h in hooks] == ["disabled"]


@pytest_twisted.ensureDeferred
async def test_taskmasters_above_zero(doctored):
    s, env_dir = doctored
    s.site.configure({"phd.taskmasters": 2})
    try:
        found = await first_failure(s, env_dir)
    finally:
        s.site.configure({"phd.taskmasters": 0})
    assert found["name"] == "taskmasters"
    assert "phd.taskmasters is 2" in found["detail"] and "phd.taskmasters 0" in found["fix"]


@pytest_twisted.ensureDeferred
async def test_library_not_loaded(doctored):
    s, env_dir = doctored
    libraries = s.site.config["load-libraries"]
    # Without the library Phorge cannot know the gorge mail type either.
    mailers = s.site.config["cluster.mailers"]
    s.site.configure({"load-libraries": [], "cluster.mailers": []})
    try:
        found = await first_failure(s, env_dir)
    finally:
        s.site.configure({"load-libraries": libraries, "cluster.mailers": mailers})
    assert found["name"] == "library"
    assert "load-libraries" in found["fix"] and str(REPO_ROOT / "phorge" / "src") in found["fix"]


@pytest_twisted.ensureDeferred
async def test_bot_token_revoked(doctored):
    s, env_dir = doctored
    revoke = "UPDATE conduit_token SET expires = %s WHERE token = %s"
    s.site.execute("conduit", revoke, 1, s.token)
    try:
        found = await first_failure(s, env_dir)
    finally:
        s.site.execute("conduit", revoke, None, s.token)
    assert found["name"] == "conduit-bot"
    assert "ERR-INVALID-AUTH" in found["detail"] and "GORGE_WORKER_CONDUIT_TOKEN" in found["fix"]


@pytest_twisted.ensureDeferred
async def test_namespace_mismatch(doctored, tmp_path):
    s, _ = doctored
    env_dir = write_env_dir(
        s, tmp_path / "etc-gorge", taskqueue={"GORGE_TASKQUEUE_NAMESPACE": "phabricator"}
    )
    found = await first_failure(s, env_dir)
    assert found["name"] == "namespace"
    assert "GORGE_TASKQUEUE_NAMESPACE=phabricator" in found["detail"]
    assert s.site.namespace in found["fix"]


@pytest_twisted.ensureDeferred
async def test_mailer_missing_from_cluster_mailers(doctored):
    s, env_dir = doctored
    s.site.configure({"cluster.mailers": []})
    try:
        found = await first_failure(s, env_dir)
    finally:
        s.site.configure({"cluster.mailers": [gorge_mailer_entry(s.gorge.mailer_uri)]})
    assert found["name"] == "mailer"
    assert "no entry of type gorge" in found["detail"]


@pytest_twisted.ensureDeferred
async def test_mailer_behind_another(doctored):
    s, env_dir = doctored
    other = {"key": "first", "type": "test", "options": {}}
    s.site.configure({"cluster.mailers": [other, gorge_mailer_entry(s.gorge.mailer_uri)]})
    try:
        found = await first_failure(s, env_dir)
    finally:
        s.site.configure({"cluster.mailers": [gorge_mailer_entry(s.gorge.mailer_uri)]})
    assert found["name"] == "mailer"
    assert "'first'" in found["detail"]


@pytest_twisted.ensureDeferred
async def test_webhook_owner_mismatch_read_from_the_running_worker(doctored):
    s, env_dir = doctored
    await s.gorge.stop("worker")
    await s.gorge.start_ready("worker", GORGE_WORKER_WEBHOOK_OWNER="phorge")
    try:
        found = await first_failure(s, env_dir)
    finally:
        await s.gorge.stop("worker")
        await s.gorge.start_ready("worker")
    assert found["name"] == "webhook-owner"
    # worker.env still says gorge-webhook: the running worker's stats decide.
    assert "gorge-worker reports GORGE_WORKER_WEBHOOK_OWNER='phorge'" in found["detail"]


@pytest_twisted.ensureDeferred
async def test_silent_only_where_gorge_webhook_does_not_read(doctored):
    s, env_dir = doctored
    # An environment file is a source gorge-webhook does not read.
    s.site.configure({"phabricator.silent": True})
    try:
        found = await first_failure(s, env_dir)
    finally:
        s.site.configure({"phabricator.silent": None})
    assert found["name"] == "silent"
    assert "Phorge is silent but gorge-webhook reads false" in found["detail"]


@pytest_twisted.ensureDeferred
async def test_outbound_policy_differs(doctored):
    s, env_dir = doctored
    s.site.configure({"security.outbound-blacklist": None})  # Phorge's default
    try:
        found = await first_failure(s, env_dir)
    finally:
        s.site.configure({"security.outbound-blacklist": []})
    assert found["name"] == "outbound-policy"
    assert "127.0.0.0/8" in found["detail"] or "Phorge refuses" in found["detail"]
