"""Settings, registry wiring, /readyz, /api/worker/stats and /metrics of the
assembled service."""

from __future__ import annotations

import json
import re

import pytest
import pytest_twisted
from treq.testing import RequestTraversalAgent
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.web.resource import Resource

from gorge.config import ConfigError
from gorge.web.site import stub_client
from gorge.worker import service as worker_service
from gorge.worker.service import build_worker_service
from gorge.worker.settings import load_worker_settings

BASE_ENV = {"GORGE_WORKER_TASK_QUEUE_URL": "http://queue:8090/", "GORGE_LISTEN_ADDR": "127.0.0.1:0"}


def settings_of(**env):
    return load_worker_settings({**BASE_ENV, **env})


def test_defaults():
    s = load_worker_settings({})
    assert (s.queue_url, s.lease_limit, s.poll_interval_ms, s.max_workers) == (
        "http://gorge-taskqueue:8090",
        32,
        1000,
        32,
    )
    assert s.delegate_concurrency == 4
    assert (s.idle_timeout_sec, s.hibernate_sec, s.drain_timeout_sec) == (180, 0, 30)
    assert s.http.listen_addr == ":8170" and s.conduit_url == "" and s.class_filter == ()
    assert s.conduit_probe_sec == 60 and s.native_test_worker is False


def test_legacy_names_are_read_and_warned_about():
    s = load_worker_settings(
        {
            "TASK_QUEUE_URL": "http://task-queue:8090",
            "LEASE_LIMIT": "9",
            "TASK_CLASS_FILTER": " B, ,A ,B",
            "SERVICE_TOKEN": "t",
        }
    )
    assert s.queue_url == "http://task-queue:8090" and s.lease_limit == 9
    assert s.class_filter == ("B", "A") and s.http.token == "t"
    assert any("LEASE_LIMIT is deprecated" in w for w in s.warnings)
    assert "token=" not in repr(s)


@pytest.mark.parametrize(
    "env, setting",
    [
        ({"GORGE_WORKER_LEASE_LIMIT": "x"}, "GORGE_WORKER_LEASE_LIMIT"),
        ({"GORGE_WORKER_POLL_INTERVAL_MS": "0"}, "GORGE_WORKER_POLL_INTERVAL_MS"),
        ({"GORGE_WORKER_MAX_WORKERS": "0"}, "GORGE_WORKER_MAX_WORKERS"),
        ({"GORGE_WORKER_DELEGATE_CONCURRENCY": "0"}, "GORGE_WORKER_DELEGATE_CONCURRENCY"),
        ({"GORGE_WORKER_IDLE_TIMEOUT_SEC": "-1"}, "GORGE_WORKER_IDLE_TIMEOUT_SEC"),
        ({"GORGE_WORKER_DRAIN_TIMEOUT_SEC": "3601"}, "GORGE_WORKER_DRAIN_TIMEOUT_SEC"),
        ({"GORGE_WORKER_TASK_QUEUE_URL": "ftp://queue"}, "GORGE_WORKER_TASK_QUEUE_URL"),
        ({"GORGE_WORKER_TASK_QUEUE_URL": "queue:8090"}, "GORGE_WORKER_TASK_QUEUE_URL"),
        ({"GORGE_WORKER_CONDUIT_URL": "http://gw:8150"}, "GORGE_WORKER_CONDUIT_TOKEN"),
        (
            {"GORGE_WORKER_CONDUIT_URL": "http://gw:99999", "GORGE_WORKER_CONDUIT_TOKEN": "t"},
            "GORGE_WORKER_CONDUIT_URL",
        ),
        ({"GORGE_WORKER_NATIVE_TEST_WORKER": "maybe"}, "GORGE_WORKER_NATIVE_TEST_WORKER"),
        ({"GORGE_WORKER_NOOP_CLASSES": "RetiredWorker, Not-A-Class"}, "GORGE_WORKER_NOOP_CLASSES"),
    ],
)
def test_bad_settings_name_the_variable(env, setting):
    with pytest.raises(ConfigError) as info:
        settings_of(**env)
    assert info.value.setting == setting


def test_drain_zero_means_default_and_trailing_slash_removed():
    s = settings_of(
        GORGE_WORKER_DRAIN_TIMEOUT_SEC="0",
        GORGE_WORKER_CONDUIT_URL="https://gw.example:8150/",
        GORGE_WORKER_CONDUIT_TOKEN="secret",
    )
    assert s.drain_timeout_sec == 30 and s.conduit_url == "https://gw.example:8150"
    assert "secret" not in repr(s)


def test_make_service_turns_bad_config_into_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("GORGE_WORKER_CONDUIT_URL", "http://gw:8150")
    monkeypatch.delenv("GORGE_WORKER_CONDUIT_TOKEN", raising=False)
    monkeypatch.delenv("CONDUIT_TOKEN", raising=False)
    options = worker_service.Options()
    options.parseOptions([])
    with pytest.raises(SystemExit) as info:
        worker_service.makeService(options)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gorge-worker: GORGE_WORKER_CONDUIT_TOKEN: ")


def test_filter_that_leaves_nothing_refuses_to_start():
    with pytest.raises(ConfigError) as info:
        build_worker_service(
            settings_of(GORGE_WORKER_TASK_CLASS_FILTER="Other"), Clock(), http_client=object()
        )
    assert info.value.setting == "GORGE_WORKER_TASK_CLASS_FILTER"


@pytest.mark.parametrize(
    "env, supported, classes",
    [
        ({}, ["FeedPublisherHTTPWorker"], ["FeedPublisherHTTPWorker"]),
        (
            {
                "GORGE_WORKER_CONDUIT_URL": "http://gw:8150",
                "GORGE_WORKER_CONDUIT_TOKEN": "t",
                "GORGE_WORKER_WEBHOOK_OWNER": "phorge",
            },
            [
                "FeedPublisherHTTPWorker",
                "HeraldWebhookWorker",
                "PhabricatorApplicationTransactionPublishWorker",
                "PhabricatorMetaMTAWorker",
                "PhabricatorSearchWorker",
                "*",
            ],
            None,
        ),
        (
            {
                "GORGE_WORKER_CONDUIT_URL": "http://gw:8150",
                "GORGE_WORKER_CONDUIT_TOKEN": "t",
                "GORGE_WORKER_TASK_CLASS_FILTER": "PhabricatorSearchWorker,Custom",
            },
            [
                "FeedPublisherHTTPWorker",
                "HeraldWebhookWorker",
                "PhabricatorApplicationTransactionPublishWorker",
                "PhabricatorMetaMTAWorker",
                "PhabricatorSearchWorker",
                "*",
            ],
            ["Custom", "PhabricatorSearchWorker"],
        ),
        (
            {
                "GORGE_WORKER_CONDUIT_URL": "http://gw:8150",
                "GORGE_WORKER_CONDUIT_TOKEN": "t",
                "GORGE_WORKER_DELEGATE_CLASSES": (
                    "PhabricatorSearchWorker, FeedPublisherHTTPWorker,X"
                ),
            },
            ["FeedPublisherHTTPWorker", "PhabricatorSearchWorker", "X"],
            ["FeedPublisherHTTPWorker", "PhabricatorSearchWorker", "X"],
        ),
        (
            {"GORGE_WORKER_DELEGATE_CLASSES": "X", "GORGE_WORKER_NATIVE_TEST_WORKER": "1"},
            ["FeedPublisherHTTPWorker", "PhabricatorTestWorker"],
            ["FeedPublisherHTTPWorker", "PhabricatorTestWorker"],
        ),
        (
            {"GORGE_WORKER_NOOP_CLASSES": "RetiredWorker, BenchNoopWorker"},
            ["BenchNoopWorker", "FeedPublisherHTTPWorker", "RetiredWorker"],
            ["BenchNoopWorker", "FeedPublisherHTTPWorker", "RetiredWorker"],
        ),
        # A no-op class is native: the fallback does not take it to PHP.
        (
            {
                "GORGE_WORKER_CONDUIT_URL": "http://gw:8150",
                "GORGE_WORKER_CONDUIT_TOKEN": "t",
                "GORGE_WORKER_DELEGATE_CLASSES": "RetiredWorker,X",
                "GORGE_WORKER_NOOP_CLASSES": "RetiredWorker",
            },
            ["FeedPublisherHTTPWorker", "RetiredWorker", "X"],
            ["FeedPublisherHTTPWorker", "RetiredWorker", "X"],
        ),
    ],
)
def test_registry_and_lease_classes(env, supported, classes):
    svc = build_worker_service(settings_of(**env), Clock(), http_client=object())
    assert svc.part("registry").supported_classes() == supported
    assert svc.part("plan").task_classes == classes


@pytest.mark.parametrize(
    "env",
    [
        {"GORGE_WORKER_NOOP_CLASSES": "FeedPublisherHTTPWorker"},
        {
            "GORGE_WORKER_NOOP_CLASSES": "PhabricatorTestWorker",
            "GORGE_WORKER_NATIVE_TEST_WORKER": "1",
        },
    ],
)
def test_a_noop_class_that_runs_natively_refuses_to_start(env):
    with pytest.raises(ConfigError) as info:
        build_worker_service(settings_of(**env), Clock(), http_client=object())
    assert info.value.setting == "GORGE_WORKER_NOOP_CLASSES"
    assert env["GORGE_WORKER_NOOP_CLASSES"] in str(info.value)


@pytest_twisted.ensureDeferred
async def test_a_noop_class_completes_with_one_line():
    from tests.support.logcapture import logged_events

    svc = build_worker_service(
        settings_of(GORGE_WORKER_NOOP_CLASSES="RetiredWorker"), Clock(), http_client=object()
    )
    handler = svc.part("registry").get("RetiredWorker")
    with logged_events() as events:
        assert await handler({"id": 42, "failureCount": 0}, '{"anything": 1}') is None
    (line,) = [e for e in events if e.get("log_format", "").startswith("WORKER_NOOP_TASK")]
    assert (line["task_class"], line["task_id"]) == ("RetiredWorker", 42)
    assert settings_of(GORGE_WORKER_NOOP_CLASSES="RetiredWorker").describe()["noop_classes"] == [
        "RetiredWorker"
    ]


@pytest_twisted.ensureDeferred
async def test_a_noop_class_builds_no_line_the_log_level_would_drop():
    from tests.support.logcapture import logged_events

    svc = build_worker_service(
        settings_of(GORGE_WORKER_NOOP_CLASSES="RetiredWorker", GORGE_LOG_LEVEL="warn"),
        Clock(),
        http_client=object(),
    )
    handler = svc.part("registry").get("RetiredWorker")
    with logged_events() as events:
        assert await handler({"id": 42, "failureCount": 0}, None) is None
    assert not [e for e in events if e.get("log_format", "").startswith("WORKER_NOOP_TASK")]


def test_allow_list_without_conduit_warns():
    s = settings_of(GORGE_WORKER_DELEGATE_CLASSES="X")
    assert any(
        "no effect without GORGE_WORKER_PHORGE_ROOT or GORGE_WORKER_CONDUIT_URL" in w
        for w in s.warnings
    )


class FakeQueueResource(Resource):
    isLeaf = True

    def __init__(self):
        super().__init__()
        self.status = 200
        self.seen: list[bytes] = []
        self.answers = {
            b"/api/queue/lease": b'{"data":[]}',
            b"/api/worker.execute": json.dumps(
                {"result": None, "error_code": "ERR-NO-TASK-CLASS", "error_info": "x"}
            ).encode(),
        }

    def render(self, request):
        self.seen.append(request.path)
        request.setResponseCode(self.status)
        return self.answers.get(request.path, b'{"data":{"status":"ok"}}')


def flushed(stub, d):
    stub.flush()
    results = []
    d.addBoth(results.append)
    return results[0]


def readyz(site):
    client = stub_client(site)
    response = flushed(client, client.get("http://worker/readyz"))
    body = flushed(client, response.json())
    return response.code, body


def test_readiness_follows_the_last_lease_and_shutdown():
    clock, queue = Clock(), FakeQueueResource()
    stub = RequestTraversalAgent(queue)
    svc = build_worker_service(settings_of(GORGE_SERVICE_TOKEN="svc"), clock, http_client=stub)
    svc.part("consumer").start()
    assert readyz(svc.part("site")) == (
        503,
        {"status": "unavailable", "reason": "no lease attempt has completed yet"},
    )
    clock.advance(1.0)
    stub.flush()
    assert readyz(svc.part("site")) == (200, {"status": "ok"})
    queue.status = 500
    queue.answers[b"/api/queue/lease"] = (
        b'{"error":{"code":"ERR_INTERNAL","message":"internal server error"}}'
    )
    clock.advance(1.0)
    stub.flush()
    assert readyz(svc.part("site")) == (
        503,
        {
            "status": "unavailable",
            "reason": "taskqueue: lease: api error [ERR_INTERNAL]: internal server error",
        },
    )
    Deferred.fromCoroutine(svc.part("consumer").stop())
    assert readyz(svc.part("site"))[1]["reason"] == "shutting down"


def delegating_service(queue: FakeQueueResource | None = None, **env: str):
    """A worker that delegates to a fake Phorge (``queue``, which also plays
    the taskqueue): the service, its clock, the fake's answers and the agent
    that reaches it."""
    clock, queue = Clock(), queue if queue is not None else FakeQueueResource()
    stub = RequestTraversalAgent(queue)
    svc = build_worker_service(
        settings_of(
            GORGE_WORKER_CONDUIT_URL="http://gw:8150",
            GORGE_WORKER_CONDUIT_TOKEN="t",
            GORGE_WORKER_WEBHOOK_OWNER="gorge-webhook",
            **env,
        ),
        clock,
        http_client=stub,
    )
    return svc, clock, queue, stub


def test_readiness_with_delegation_needs_a_passing_probe():
    svc, clock, queue, stub = delegating_service()
    svc.part("consumer").start()
    clock.advance(1.0)
    stub.flush()
    assert readyz(svc.part("site"))[1]["reason"] == "conduit: no probe has completed yet"
    svc.part("conduit-probe").start()
    stub.flush()
    assert readyz(svc.part("site")) == (200, {"status": "ok"})
    queue.answers[b"/api/worker.execute"] = (
        b'{"result":null,"error_code":"ERR-WORKER-AUTH","error_info":"denied"}'
    )
    clock.advance(60)
    stub.flush()
    assert readyz(svc.part("site"))[1]["reason"] == (
        "conduit: conduit error [ERR-WORKER-AUTH]: denied; delegated classes paused"
    )
    svc.part("conduit-probe").stop()


def test_a_failed_probe_is_tried_again_sooner_than_the_period():
    # A passing hiccup in Phorge (a first-use race, a restart) must not keep
    # the worker unready for a whole probe period.
    svc, clock, queue, stub = delegating_service(GORGE_WORKER_CONDUIT_PROBE_SEC="3600")
    passing = queue.answers[b"/api/worker.execute"]
    queue.answers[b"/api/worker.execute"] = (
        b'{"result":null,"error_code":"ERR-CONDUIT-CORE","error_info":"duplicate key"}'
    )
    probe = svc.part("conduit-probe")
    probe.start()
    stub.flush()
    assert probe.reason == "conduit error [ERR-CONDUIT-CORE]: duplicate key"
    calls: list[float] = []

    def run_for(seconds: int) -> None:
        for _ in range(seconds):
            queue.seen.clear()
            clock.advance(1.0)
            stub.flush()
            calls.extend(clock.seconds() for path in queue.seen if path == b"/api/worker.execute")

    # Still failing: tried again after 2, 4, 8 ... seconds, not every second.
    run_for(40)
    assert calls == [2.0, 6.0, 14.0, 30.0]
    queue.answers[b"/api/worker.execute"] = passing
    run_for(30)
    assert calls == [2.0, 6.0, 14.0, 30.0, 62.0] and probe.reason is None
    # Passing again: the next probe is the period's, with no retry left behind.
    run_for(600)
    assert calls[-1] == 62.0
    assert all(call.getTime() >= 3600.0 for call in clock.getDelayedCalls())
    probe.stop()


def test_stats_contract_and_auth():
    clock = Clock()
    svc = build_worker_service(settings_of(GORGE_SERVICE_TOKEN="svc"), clock, http_client=object())
    client = stub_client(svc.part("site"))
    denied = flushed(client, client.get("http://worker/api/worker/stats"))
    assert denied.code == 401
    assert flushed(client, denied.json()) == {
        "error": {"code": "ERR_UNAUTHORIZED", "message": "missing or invalid service token"}
    }
    unknown = flushed(client, client.get("http://worker/api/worker/nope?token=svc"))
    assert unknown.code == 404
    response = flushed(
        client, client.get("http://worker/api/worker/stats", headers={"X-Service-Token": "svc"})
    )
    data = flushed(client, response.json())["data"]
    assert {k: data[k] for k in ("processed", "failed", "active", "supported")} == {
        "processed": 0,
        "failed": 0,
        "active": 0,
        "supported": ["FeedPublisherHTTPWorker"],
    }
    assert data["yielded"] == 0 and data["unreported"] == 0 and data["idle"] is False
    assert isinstance(data["startedAt"], int)
    assert data["leaseOwner"].endswith(":gorge-worker")
    assert data["webhookOwner"] == ""
    owned = build_worker_service(
        settings_of(GORGE_WORKER_WEBHOOK_OWNER="gorge-webhook"), clock, http_client=object()
    )
    owned_client = stub_client(owned.part("site"))
    answer = flushed(owned_client, owned_client.get("http://worker/api/worker/stats"))
    assert flushed(owned_client, answer.json())["data"]["webhookOwner"] == "gorge-webhook"


def test_metrics_are_served_from_the_service_registry():
    clock, queue = Clock(), FakeQueueResource()
    stub = RequestTraversalAgent(queue)
    svc = build_worker_service(settings_of(), clock, http_client=stub)
    svc.part("consumer").start()
    clock.advance(1.0)
    stub.flush()
    client = stub_client(svc.part("site"))
    response = flushed(client, client.get("http://worker/metrics"))
    text = flushed(client, response.text())
    assert 'gorge_worker_lease_requests_total{result="empty"} 1.0' in text
    assert "gorge_worker_active_tasks 0.0" in text


def test_env_example_lists_every_setting_with_its_default():
    from tests.support.paths import REPO_ROOT

    text = (REPO_ROOT / "conf" / "worker.env.example").read_text()
    env = dict(
        line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    source = (REPO_ROOT / "gorge" / "worker" / "settings.py").read_text()
    read = set(re.findall(r'"(GORGE_WORKER_[A-Z_]+)"', source))
    assert read <= set(env), read - set(env)
    assert load_worker_settings(env) == load_worker_settings({})


def test_probe_routes_need_no_token_and_unknown_api_paths_need_one():
    svc = build_worker_service(
        settings_of(GORGE_SERVICE_TOKEN="svc"), Clock(), http_client=object()
    )
    client = stub_client(svc.part("site"))
    for path in ("/", "/healthz", "/readyz", "/metrics"):
        response = flushed(client, client.get("http://worker" + path))
        assert response.code in (200, 503), path
    unknown = flushed(client, client.get("http://worker/api/worker/nope"))
    assert unknown.code == 401
    wrong_header = flushed(
        client,
        client.get(
            "http://worker/api/worker/stats?token=svc", headers={"X-Service-Token": "wrong"}
        ),
    )
    assert wrong_header.code == 401  # the query parameter is read only without a header
