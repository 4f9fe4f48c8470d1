"""GORGE_WORKER_WEBHOOK_OWNER: HeraldWebhookWorker tasks are either completed
without delivery (gorge-webhook delivers) or run in Phorge through
worker.execute, and no setup leaves that to a default."""

from __future__ import annotations

import json
from urllib.parse import parse_qsl

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from twisted.internet.task import Clock

from gorge.config import ConfigError
from gorge.worker.handlers.conduit import ConduitDelegate
from gorge.worker.handlers.herald_webhook import LeftToGorgeWebhook, request_phid
from gorge.worker.metrics import WorkerMetrics
from gorge.worker.service import build_registry, build_worker_service
from gorge.worker.settings import load_worker_settings
from tests.worker.fakes import CapturedEvents, run_through_consumer
from tests.worker.rawhttp import Answer

WEBHOOK = "HeraldWebhookWorker"
SETTING = "GORGE_WORKER_WEBHOOK_OWNER"
CONDUIT = {"GORGE_WORKER_CONDUIT_URL": "http://127.0.0.1:9", "GORGE_WORKER_CONDUIT_TOKEN": "t"}
REQUEST_PHID = "PHID-HWBR-abcdefghijklmnopqrst"


def settings_of(**env):
    return load_worker_settings({"GORGE_LISTEN_ADDR": "127.0.0.1:0", **env})


def build(**env):
    return build_worker_service(settings_of(**env), Clock(), http_client=object())


@pytest.mark.parametrize("value", ["gorge-webhook", "phorge"])
def test_owner_values_are_read(value):
    assert settings_of(GORGE_WORKER_WEBHOOK_OWNER=value, **CONDUIT).webhook_owner == value
    assert (
        settings_of(GORGE_WORKER_WEBHOOK_OWNER=value, **CONDUIT).describe()["webhook_owner"]
        == value
    )


def test_unset_owner_is_empty():
    assert settings_of().webhook_owner == ""


@pytest.mark.parametrize(
    "env, words",
    [
        (
            {"GORGE_WORKER_WEBHOOK_OWNER": "both"},
            ["unknown value 'both'", "gorge-webhook", "phorge"],
        ),
        ({"GORGE_WORKER_WEBHOOK_OWNER": "Phorge", **CONDUIT}, ["unknown value 'Phorge'"]),
        (
            {"GORGE_WORKER_WEBHOOK_OWNER": "phorge"},
            ["GORGE_WORKER_CONDUIT_URL", "GORGE_WORKER_CONDUIT_TOKEN", "worker.execute"],
        ),
        (
            {
                "GORGE_WORKER_WEBHOOK_OWNER": "gorge-webhook",
                "GORGE_WORKER_DELEGATE_CLASSES": "PhabricatorSearchWorker,HeraldWebhookWorker",
                **CONDUIT,
            },
            ["contradicts GORGE_WORKER_DELEGATE_CLASSES", "remove HeraldWebhookWorker"],
        ),
    ],
)
def test_contradictory_settings_are_refused_naming_the_owner(env, words):
    with pytest.raises(ConfigError) as info:
        settings_of(**env)
    assert info.value.setting == SETTING
    for word in words:
        assert word in str(info.value)


def test_unset_owner_is_refused_when_the_worker_would_delegate_webhook_tasks():
    for env in (
        {},
        {"GORGE_WORKER_DELEGATE_CLASSES": "HeraldWebhookWorker"},
        {"GORGE_WORKER_TASK_CLASS_FILTER": "HeraldWebhookWorker,Other"},
    ):
        with pytest.raises(ConfigError) as info:
            build(**CONDUIT, **env)
        assert info.value.setting == SETTING
        message = str(info.value)
        assert "gorge-webhook (gorge-webhook delivers webhooks" in message
        assert "phorge (no gorge-webhook; Phorge delivers them" in message
        assert "\n" not in message


@pytest.mark.parametrize(
    "env",
    [
        {},  # no Conduit: the class cannot run here at all
        {**CONDUIT, "GORGE_WORKER_DELEGATE_CLASSES": "PhabricatorSearchWorker"},
        {**CONDUIT, "GORGE_WORKER_TASK_CLASS_FILTER": "PhabricatorSearchWorker"},
    ],
)
def test_unset_owner_is_fine_when_the_worker_never_leases_webhook_tasks(env):
    svc = build(**env)
    assert not svc.part("plan").runnable(WEBHOOK)
    assert svc.part("plan").task_classes is None or WEBHOOK not in svc.part("plan").task_classes


def test_owner_gorge_webhook_runs_the_class_natively_even_with_a_catch_all_delegate():
    svc = build(GORGE_WORKER_WEBHOOK_OWNER="gorge-webhook", **CONDUIT)
    assert isinstance(svc.part("registry").get(WEBHOOK), LeftToGorgeWebhook)
    assert isinstance(svc.part("registry").get("AnyOtherWorker"), ConduitDelegate)


def test_owner_gorge_webhook_without_conduit_leases_the_class():
    svc = build(GORGE_WORKER_WEBHOOK_OWNER="gorge-webhook")
    assert svc.part("plan").task_classes == ["FeedPublisherHTTPWorker", WEBHOOK]


def test_owner_phorge_delegates_the_class_even_when_the_allow_list_omits_it():
    svc = build(
        GORGE_WORKER_WEBHOOK_OWNER="phorge",
        GORGE_WORKER_DELEGATE_CLASSES="PhabricatorSearchWorker",
        **CONDUIT,
    )
    assert isinstance(svc.part("registry").get(WEBHOOK), ConduitDelegate)
    assert svc.part("plan").task_classes == [
        "FeedPublisherHTTPWorker",
        WEBHOOK,
        "PhabricatorSearchWorker",
    ]


CLASSES = st.lists(
    st.sampled_from([WEBHOOK, "PhabricatorSearchWorker", "Custom", "FeedPublisherHTTPWorker"]),
    unique=True,
    max_size=3,
)


@given(
    owner=st.sampled_from(["", "gorge-webhook", "phorge"]),
    conduit=st.booleans(),
    delegate=CLASSES,
    class_filter=CLASSES,
    native_test=st.booleans(),
)
def test_no_setup_leaves_webhook_delivery_to_a_default(
    owner, conduit, delegate, class_filter, native_test
):
    env = {
        "GORGE_WORKER_WEBHOOK_OWNER": owner,
        "GORGE_WORKER_DELEGATE_CLASSES": ",".join(delegate),
        "GORGE_WORKER_TASK_CLASS_FILTER": ",".join(class_filter),
        "GORGE_WORKER_NATIVE_TEST_WORKER": "1" if native_test else "0",
        **(CONDUIT if conduit else {}),
    }
    would_delegate = (
        conduit
        and (not delegate or WEBHOOK in delegate)
        and (not class_filter or WEBHOOK in class_filter)
    )
    refused_on_owner = (
        (owner == "gorge-webhook" and WEBHOOK in delegate)
        or (owner == "phorge" and not conduit)
        or (owner == "" and would_delegate)
    )
    try:
        svc = build(**env)
    except ConfigError as exc:
        assert (exc.setting == SETTING) == refused_on_owner
        assert exc.setting in (SETTING, "GORGE_WORKER_TASK_CLASS_FILTER")
        return
    assert not refused_on_owner
    handler = svc.part("registry").get(WEBHOOK)
    if owner == "gorge-webhook":
        assert isinstance(handler, LeftToGorgeWebhook)  # never Conduit
    elif owner == "phorge":
        assert isinstance(handler, ConduitDelegate)
    else:
        assert not svc.part("plan").runnable(WEBHOOK)


def test_request_phid_is_read_from_any_data():
    assert request_phid(json.dumps({"webhookRequestPHID": REQUEST_PHID})) == REQUEST_PHID
    for data in (None, "", "not json", "[1]", '{"webhookRequestPHID": 5}', "[" * 100_000):
        assert request_phid(data) == ""


def conduit_answers(request) -> Answer:
    """Success for any task, and the answer the readiness probe expects."""
    params = json.loads(dict(parse_qsl(request.body.decode("ascii")))["params"])
    if params["taskClass"] == "":
        return Answer(
            body=json.dumps(
                {"result": None, "error_code": "ERR-NO-TASK-CLASS", "error_info": "no class"}
            ).encode()
        )
    return Answer(body=json.dumps({"result": {"result": "success"}}).encode())


def delegated_classes(server) -> list[str]:
    return [
        json.loads(dict(parse_qsl(r.body.decode("ascii")))["params"])["taskClass"]
        for r in server.requests
    ]


def registry_for(http_client, reactor, base, **env):
    metrics_registry = CollectorRegistry()
    settings = settings_of(GORGE_WORKER_CONDUIT_URL=base, GORGE_WORKER_CONDUIT_TOKEN="t", **env)
    registry, _ = build_registry(settings, http_client, reactor, WorkerMetrics(metrics_registry))
    return registry, metrics_registry


def webhook_task(task_id: int) -> dict:
    return {
        "id": task_id,
        "taskClass": WEBHOOK,
        "failureCount": 0,
        "data": json.dumps({"webhookRequestPHID": REQUEST_PHID}),
    }


@pytest_twisted.ensureDeferred
async def test_owner_gorge_webhook_completes_the_task_and_never_calls_conduit(
    reactor, http_client, raw_server
):
    server, base = raw_server(conduit_answers)
    registry, metrics = registry_for(
        http_client, reactor, base, GORGE_WORKER_WEBHOOK_OWNER="gorge-webhook"
    )
    with CapturedEvents() as captured:
        report, _ = await run_through_consumer(reactor, registry, webhook_task(41))
        other, _ = await run_through_consumer(
            reactor,
            registry,
            {"id": 42, "taskClass": "PhabricatorSearchWorker", "failureCount": 0, "data": "{}"},
        )
    assert (report.kind, report.task_id) == ("complete", 41)
    assert (other.kind, other.task_id) == ("complete", 42)
    # The same Conduit receiver got the other class, and nothing for webhooks.
    assert delegated_classes(server) == ["PhabricatorSearchWorker"]
    (line,) = captured.named("WORKER_WEBHOOK_TASK_LEFT_TO_GORGE_WEBHOOK")
    assert (line["task_id"], line["request_phid"]) == (41, REQUEST_PHID)
    assert line["log_level"].name == "debug"
    assert metrics.get_sample_value("gorge_worker_webhook_tasks_left_to_gorge_webhook_total") == 1.0


@pytest_twisted.ensureDeferred
async def test_owner_gorge_webhook_completes_a_task_whose_data_is_unreadable(
    reactor, http_client, raw_server
):
    server, base = raw_server(conduit_answers)
    registry, _ = registry_for(
        http_client, reactor, base, GORGE_WORKER_WEBHOOK_OWNER="gorge-webhook"
    )
    task = {**webhook_task(43), "data": "{broken"}
    report, _ = await run_through_consumer(reactor, registry, task)
    assert report.kind == "complete"
    assert server.requests == []


@pytest_twisted.ensureDeferred
async def test_owner_phorge_sends_the_task_to_conduit(reactor, http_client, raw_server):
    server, base = raw_server(conduit_answers)
    registry, metrics = registry_for(
        http_client,
        reactor,
        base,
        GORGE_WORKER_WEBHOOK_OWNER="phorge",
        GORGE_WORKER_DELEGATE_CLASSES="PhabricatorSearchWorker",
    )
    report, _ = await run_through_consumer(reactor, registry, webhook_task(44))
    assert (report.kind, report.task_id) == ("complete", 44)
    (request,) = server.requests
    params = json.loads(dict(parse_qsl(request.body.decode("ascii")))["params"])
    assert (params["taskID"], params["taskClass"]) == (44, WEBHOOK)
    assert json.loads(params["data"]) == {"webhookRequestPHID": REQUEST_PHID}
    assert metrics.get_sample_value("gorge_worker_webhook_tasks_left_to_gorge_webhook_total") == 0.0
