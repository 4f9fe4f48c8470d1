"""Each daemon's OpenAPI document: it names every route the daemon serves and
nothing else, the daemon serves it, and a schemathesis run against the real
daemon finds no 5xx and no answer that breaks it (docs/<service>.md)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.utils import getProcessOutputAndValue

from gorge.mailer.api import MailerApi
from gorge.taskqueue.api import TaskQueueApi
from gorge.web.openapi import OpenApiDocument
from gorge.webhook.api import WebhookApi
from gorge.worker.api import WorkerApi
from tests.support.paths import REPO_ROOT
from tests.support.twistd import TwistdProcess, daemon_environ

# service prefix, the package that holds the document, the Klein app
DAEMONS = {
    "webhook": ("gorge.webhook", WebhookApi.app),
    "mailer": ("gorge.mailer", MailerApi.app),
    "queue": ("gorge.taskqueue", TaskQueueApi.app),
    "worker": ("gorge.worker", WorkerApi.app),
}
# What gorge.web.GorgeRoot serves itself, outside the Klein app.
PROBES = {("GET", "/"), ("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics")}
OPERATIONS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}
TOKEN = "openapi-test-token"


def document(service: str) -> dict:
    package, _ = DAEMONS[service]
    return json.loads(OpenApiDocument(package).raw)


def _template(path: str) -> str:
    """A route with its parameters unnamed: ``/a/<string:id>`` and ``/a/{ref}`` are ``/a/{}``."""
    return re.sub(r"<[^>]*>|\{[^}]*\}", "{}", path)


def served_routes(app) -> set[tuple[str, str]]:
    return {
        (method, _template(rule.rule))
        for rule in app.url_map.iter_rules()
        for method in rule.methods
        if method not in ("HEAD", "OPTIONS")
    } | PROBES


def documented_routes(doc: dict) -> set[tuple[str, str]]:
    return {
        (method.upper(), _template(path))
        for path, item in doc["paths"].items()
        for method in item
        if method in OPERATIONS
    }


@pytest.mark.parametrize("service", DAEMONS)
def test_the_document_names_every_route_served_and_no_other(service):
    doc = document(service)
    # GorgeRoot answers each daemon's version route too (gorge/web/version.py).
    served = served_routes(DAEMONS[service][1]) | {("GET", f"/api/{service}/version")}
    documented = documented_routes(doc)
    assert served - documented == set(), "served but not documented"
    assert documented - served == set(), "documented but not served"
    assert ("GET", f"/api/{service}/openapi.json") in served


@pytest.mark.parametrize("service", DAEMONS)
def test_the_document_is_openapi_3_1_and_every_operation_says_what_it_answers(service):
    doc = document(service)
    assert doc["openapi"] == "3.1.0"
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            assert "200" in responses, (method, path)
            if path.startswith(f"/api/{service}/"):
                # Behind the token (the document's default security), so 401 is possible.
                assert "security" not in operation and "401" in responses, (method, path)
                assert "500" in responses, (method, path)
            else:
                assert operation["security"] == [], (method, path)
    # Every path parameter is declared on the operation that uses it.
    for path, item in doc["paths"].items():
        names = set(re.findall(r"\{([^}]*)\}", path))
        for operation in item.values():
            declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert declared == names, path


def test_a_document_that_is_not_openapi_stops_start_up(tmp_path, monkeypatch):
    package = tmp_path / "notopenapi"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "openapi.json").write_text('{"swagger": "2.0"}')
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="not an OpenAPI document"):
        OpenApiDocument("notopenapi")


# -- schemathesis against the real daemons ------------------------------------

SCHEMATHESIS = [sys.executable, "-c", "from schemathesis.cli import schemathesis; schemathesis()"]


def environ(**extra: str) -> dict[str, str]:
    return daemon_environ(
        {"GORGE_LISTEN_ADDR": "127.0.0.1:0", "GORGE_SERVICE_TOKEN": TOKEN, **extra},
        drop=("GORGE_", "SMTP_", "MAILER_"),
    )


HOOKS = Path(__file__).with_name("schemathesis_hooks.py")

# What a schema-valid request may be answered with beyond schemathesis'
# defaults (2xx, 3xx, 401, 403, 404, 409, 429, 5xx), per operation. A send
# is well formed and still refused 422 when a backend rejects the message
# or mailerKeys names no mailer configured here: the document cannot list
# a daemon's configured keys.
ACCEPTED_ALSO = {"mailer": {"mailerSend": ["422"]}}
DEFAULT_ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "429", "5xx"]


def config_file(service: str, tmp_path: Path) -> Path:
    lines = []
    for operation, statuses in ACCEPTED_ALSO.get(service, {}).items():
        accepted = ", ".join(f'"{s}"' for s in DEFAULT_ACCEPTED + statuses)
        lines += [
            "[[operations]]",
            f'include-operation-id = "{operation}"',
            f"checks.positive_data_acceptance.expected-statuses = [{accepted}]",
            "",
        ]
    path = tmp_path / "schemathesis.toml"
    path.write_text("\n".join(lines))
    return path


async def schemathesis_run(service: str, port: int, tmp_path: Path) -> None:
    """schemathesis over every operation of the document, against 127.0.0.1 only."""
    package = DAEMONS[service][0]
    schema = REPO_ROOT / package.replace(".", "/") / "openapi.json"
    args = [
        *SCHEMATHESIS[1:],
        "--config-file",
        str(config_file(service, tmp_path)),
        "run",
        str(schema),
        "--url",
        f"http://127.0.0.1:{port}",
        "--header",
        f"X-Service-Token: {TOKEN}",
        "--checks",
        "all",
        "--max-examples",
        "15",
        "--workers",
        "1",
        "--request-timeout",
        "35",
        "--suppress-health-check",
        "all",
        "--no-color",
    ]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"))
    }
    env["SCHEMATHESIS_HOOKS"] = str(HOOKS)
    env["HOME"] = str(tmp_path)  # schemathesis keeps its state under the home directory
    out, err, code = await getProcessOutputAndValue(
        SCHEMATHESIS[0], args, env=env, path=str(tmp_path), reactor=reactor
    )
    text = (out + err).decode("utf-8", "replace")
    # The whole run, for reading the failures the tail below leaves out.
    (tmp_path / "schemathesis.txt").write_text(text)
    assert code == 0, f"{tmp_path / 'schemathesis.txt'}:\n{text[-6000:]}"


async def _run_against(daemon: TwistdProcess, service: str, tmp_path: Path) -> None:
    try:
        port = await daemon.serving()
        await schemathesis_run(service, port, tmp_path)
        assert daemon.transport.pid is not None and not daemon.ended.called, daemon.text()[-3000:]
    finally:
        daemon.kill()
    for line in daemon.lines():
        assert "PANIC_RECOVERED" not in line and "REQUEST_FAILED" not in line, line


def _queue(tmp_path: Path) -> TwistdProcess:
    return TwistdProcess(
        reactor,
        "gorge-taskqueue",
        environ(
            GORGE_TASKQUEUE_BACKEND="sqlite",
            GORGE_TASKQUEUE_SQLITE_PATH=str(tmp_path / "queue.sqlite3"),
        ),
    )


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_schemathesis_finds_nothing_in_the_taskqueue(tmp_path):
    await _run_against(_queue(tmp_path), "queue", tmp_path)


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_schemathesis_finds_nothing_in_the_mailer(tmp_path):
    daemon = TwistdProcess(
        reactor,
        "gorge-mailer",
        environ(
            GORGE_MAILER_CONFIG='[{"key":"t","type":"test"}]',
            GORGE_MAILER_IDEMPOTENCY_DB=str(tmp_path / "mailer-idempotency.sqlite3"),
        ),
    )
    await _run_against(daemon, "mailer", tmp_path)


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_schemathesis_finds_nothing_in_the_worker(tmp_path):
    queue = _queue(tmp_path)
    try:
        queue_port = await queue.serving()
        daemon = TwistdProcess(
            reactor,
            "gorge-worker",
            environ(
                GORGE_WORKER_TASK_QUEUE_URL=f"http://127.0.0.1:{queue_port}",
                GORGE_WORKER_TASK_QUEUE_TOKEN=TOKEN,
            ),
        )
        await _run_against(daemon, "worker", tmp_path)
    finally:
        queue.kill()


@pytest.mark.slow
@pytest.mark.integration
@pytest_twisted.ensureDeferred
async def test_schemathesis_finds_nothing_in_the_webhook_daemon(mariadb, tmp_path):
    from tests.webhook.conftest import daemon_env

    namespace = f"oa{os.getpid()}"
    mariadb.create_database("herald", f"{namespace}_herald")
    daemon = TwistdProcess(
        reactor,
        "gorge-webhook",
        environ(
            **daemon_env(mariadb, namespace),
            GORGE_WEBHOOK_OUTBOUND_BLACKLIST="none",
            GORGE_SERVICE_TOKEN=TOKEN,
        ),
    )
    await _run_against(daemon, "webhook", tmp_path)
