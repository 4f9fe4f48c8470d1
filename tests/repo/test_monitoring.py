"""conf/'s Prometheus alert rules and Grafana dashboard.

promtool (Debian's ``prometheus`` package, installed by
``scripts/install-deps.sh --test``) checks the rules and runs their unit tests
(tests/repo/promtool/), and checks every dashboard query as PromQL; every
metric the rules and the dashboard name is one the four daemons really
export, read from their ``/metrics`` while they run, so a renamed metric
fails here. The same daemons answer ``/api/<service>/version``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_twisted
import treq
import yaml
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import reactor

from tests.support.paths import REPO_ROOT
from tests.support.twistd import TwistdProcess, daemon_environ

RULES = REPO_ROOT / "conf" / "prometheus" / "gorge-alerts.yml"
RULE_TESTS = REPO_ROOT / "tests" / "repo" / "promtool" / "gorge-alerts.test.yml"
DASHBOARD = REPO_ROOT / "conf" / "grafana" / "gorge-dashboard.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="no promtool (scripts/install-deps.sh --test installs Debian's prometheus)",
)

METRIC = re.compile(r"\b(gorge_[a-z0-9_]+)")
# The scrape jobs the rules and the dashboard select with up{job=~...}.
JOBS = re.compile(r'up\{job=~"gorge-\(([a-z|]+)\)"')
SERVICES = {"taskqueue", "worker", "webhook", "mailer"}
TOKEN = "monitoring-test-token"
# The dashboard's variables, as Grafana would fill them in.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$instance": ".*"}


def rules() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def panels() -> Iterator[dict]:
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in panels() for target in panel.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(variable["definition"])
    return queries


def filled(query: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        query = query.replace(name, value)
    return query


def promtool(*args: str | Path, cwd: Path = REPO_ROOT) -> str:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@needs_promtool
def test_promtool_checks_the_rules():
    assert f"SUCCESS: {len(rules())} rules found" in promtool("check", "rules", RULES)


@needs_promtool
def test_each_alert_fires_in_the_promtool_unit_tests_on_what_it_is_about():
    tested = set(re.findall(r'alertname="([A-Za-z]+)"', RULE_TESTS.read_text()))
    assert {rule["alert"] for rule in rules()} == tested
    promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)


@needs_promtool
def test_every_dashboard_query_is_promql(tmp_path):
    # Each query as a recording rule: promtool parses it as Prometheus would.
    as_rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"gorge_dashboard:query_{n}", "expr": filled(query)}
                    for n, query in enumerate(dashboard_queries())
                    if not query.startswith("label_values(")
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(as_rules))
    promtool("check", "rules", path)


def test_the_dashboard_is_one_grafana_can_import():
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    ids = [panel["id"] for panel in panels()]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "instance"} <= variables
    for panel in panels():
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            assert 'instance=~"$instance"' in target["expr"], target["expr"]


def test_the_jobs_the_rules_and_the_dashboard_select_are_the_four_daemons():
    texts = [rule["expr"] for rule in rules()] + dashboard_queries()
    selections = [set(found.split("|")) for text in texts for found in JOBS.findall(text)]
    assert selections and all(found == SERVICES for found in selections)


def used_metrics() -> set[str]:
    texts = [rule["expr"] for rule in rules()] + dashboard_queries()
    return {name for text in texts for name in METRIC.findall(text)}


def exported_names(text: str) -> set[str]:
    """Every sample name a scrape can carry, from each family's type (a
    labelled family without children yet has no samples, only its type)."""
    suffixes = {
        "counter": ("_total",),
        "gauge": ("",),
        "histogram": ("_bucket", "_count", "_sum"),
        "summary": ("", "_count", "_sum"),
        "untyped": ("",),
    }
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in suffixes[family.type])
        names.update(sample.name for sample in family.samples)
    return names


def environ(**extra: str) -> dict[str, str]:
    return daemon_environ(
        {"GORGE_LISTEN_ADDR": "127.0.0.1:0", "GORGE_SERVICE_TOKEN": TOKEN, **extra},
        drop=("GORGE_", "SMTP_", "MAILER_"),
    )


async def scrape(port: int, service: str) -> str:
    base = f"http://127.0.0.1:{port}"
    response = await treq.get(f"{base}/metrics")
    assert response.code == 200
    metrics = await response.text()
    response = await treq.get(f"{base}/api/{service}/version", headers={"X-Service-Token": TOKEN})
    assert response.code == 200
    about = (await response.json())["data"]
    assert about["version"] == importlib.metadata.version("gorge")
    assert about["apiVersion"] and about["uptimeSeconds"] >= 0
    return metrics


@pytest.mark.slow
@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_every_metric_the_rules_and_the_dashboard_name_is_exported(mariadb, tmp_path: Path):
    from tests.webhook.conftest import daemon_env

    namespace = f"mon{os.getpid()}"
    mariadb.create_database("herald", f"{namespace}_herald")
    daemons: list[TwistdProcess] = []

    def start(name: str, env: dict[str, str]) -> TwistdProcess:
        daemon = TwistdProcess(reactor, name, env)
        daemons.append(daemon)
        return daemon

    exported: set[str] = set()
    try:
        queue = start(
            "gorge-taskqueue",
            environ(
                GORGE_TASKQUEUE_BACKEND="sqlite",
                GORGE_TASKQUEUE_SQLITE_PATH=str(tmp_path / "queue.sqlite3"),
            ),
        )
        queue_port = await queue.serving()
        worker = start(
            "gorge-worker",
            environ(
                GORGE_WORKER_TASK_QUEUE_URL=f"http://127.0.0.1:{queue_port}",
                GORGE_WORKER_TASK_QUEUE_TOKEN=TOKEN,
            ),
        )
        mailer = start(
            "gorge-mailer",
            environ(
                GORGE_MAILER_CONFIG='[{"key":"t","type":"test"}]',
                GORGE_MAILER_IDEMPOTENCY_DB=str(tmp_path / "mailer-idempotency.sqlite3"),
            ),
        )
        webhook = start(
            "gorge-webhook",
            environ(**daemon_env(mariadb, namespace), GORGE_SERVICE_TOKEN=TOKEN),
        )
        for daemon, service in ((queue, "queue"), (worker, "worker"), (mailer, "mailer")):
            exported |= exported_names(await scrape(await daemon.serving(), service))
        exported |= exported_names(await scrape(await webhook.serving(), "webhook"))
    finally:
        for daemon in daemons:
            daemon.kill()
    used = used_metrics()
    assert {
        "gorge_taskqueue_oldest_waiting_seconds",
        "gorge_webhook_oldest_queued_seconds",
        "gorge_mailer_sends_total",
    } <= used
    assert used - exported == set(), "named in conf/ but exported by no daemon"
