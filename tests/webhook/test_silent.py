"""Phorge's silent mode (docs/webhook.md, "Silent mode").

Real MariaDB for the requests and for ``{namespace}_config.config_entry``, a
real ``local.json`` on disk, the in-process receiver (no POST may arrive), and
a ``task.Clock`` for the re-reading period.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gorge.config import ConfigError
from gorge.webhook.settings import load_webhook_settings, parse_silent_from
from gorge.webhook.silent import php_truthy

FOREVER = {"retry": "forever", "transactionPHIDs": [], "triggerPHIDs": []}
NEVER = {"retry": "never", "transactionPHIDs": [], "triggerPHIDs": [], "silent": False}
T = 1_795_946_900


class ConfigDB:
    """``config_entry`` rows as ``bin/config set --database`` writes them."""

    def __init__(self, mariadb, name: str) -> None:
        self.name = name
        self.conn = mariadb.connect(name)

    def set(self, value: str, *, deleted: int = 0, key: str = "phabricator.silent") -> None:
        with self.conn.cursor() as cur:
            cur.execute(
                "INSERT INTO config_entry"
                " (phid, namespace, configKey, value, isDeleted, dateCreated, dateModified)"
                " VALUES (%s, 'default', %s, %s, %s, %s, %s)"
                " ON DUPLICATE KEY UPDATE value = VALUES(value), isDeleted = VALUES(isDeleted)",
                (f"PHID-CONF-{key[:10]}", key, value, deleted, T, T),
            )


@pytest.fixture
def config(mariadb):
    db = ConfigDB(mariadb, mariadb.create_database("config"))
    yield db
    db.conn.close()


def _outcome(row: dict) -> tuple:
    return row["status"], row["lastRequestResult"], row["lastRequestEpoch"], row["properties"]


def _silenced(properties: dict) -> str:
    """The properties column Phorge's failRequest() saves: the keys kept in
    place, errorType and errorCode appended, PHP's compact JSON."""
    return json.dumps(
        {**properties, "errorType": "hook", "errorCode": "silent"}, separators=(",", ":")
    )


@pytest.mark.integration
async def test_silent_in_the_database_fails_every_request_as_phorge_does_and_posts_nothing(
    herald, receiver, make_harness, config, captured_log
):
    config.set("true")
    harness = make_harness(silent_from=("database",), config_database=config.name)
    start = int(harness.clock.seconds())
    enabled = herald.insert_hook(uri=f"{receiver.base}/ok")
    disabled = herald.insert_hook(uri=f"{receiver.base}/off", status="disabled")
    rows = {
        herald.insert_request(hook=enabled, created=start, properties=FOREVER): FOREVER,
        herald.insert_request(hook=enabled, created=start, properties=NEVER): NEVER,
        # Silent mode comes before the hook's own checks in Phorge's worker.
        herald.insert_request(hook=disabled, created=start, properties=NEVER): NEVER,
        herald.insert_request(hook="PHID-HWBH-missing", created=start, properties=NEVER): NEVER,
    }
    await harness.run_tick()

    assert receiver.count() == 0
    for request_id, properties in rows.items():
        row = herald.request(request_id)
        assert _outcome(row) == ("failed", "none", 0, _silenced(properties))
        assert row["dateModified"] > row["dateCreated"]
    (line,) = captured_log.named("WEBHOOK_SILENT_MODE")
    assert (line["silent"], line["source"], line["previous"]) == (True, "database", "unknown")
    assert len(captured_log.named("WEBHOOK_REQUEST_SILENCED")) == 4
    assert harness.metric("gorge_webhook_deliveries_total", outcome="config_failure") == 4


@pytest.mark.integration
async def test_the_setting_is_read_again_every_recheck_period_and_each_change_logged_once(
    herald, receiver, make_harness, config, captured_log
):
    config.set("true")
    harness = make_harness(
        silent_from=("database",), config_database=config.name, silent_recheck=10
    )
    hook = herald.insert_hook(uri=f"{receiver.base}/ok")
    first = herald.insert_request(hook=hook, created=int(harness.clock.seconds()))
    await harness.run_tick()
    assert herald.request(first)["status"] == "failed"

    # Switched off (bin/config delete --database marks the row deleted):
    # seen at the next reading, not before.
    config.set("true", deleted=1)
    harness.clock.advance(5)
    early = herald.insert_request(hook=hook, created=int(harness.clock.seconds()))
    await harness.run_tick()
    assert herald.request(early)["status"] == "failed" and receiver.count() == 0
    harness.clock.advance(5)
    later = herald.insert_request(hook=hook, created=int(harness.clock.seconds()))
    await harness.run_tick()
    assert herald.request(later)["status"] == "sent" and receiver.count() == 1

    # Unchanged readings log nothing; a change logs one line.
    for _ in range(3):
        harness.clock.advance(10)
        await harness.run_tick()
    config.set("1")  # any value PHP finds true
    harness.clock.advance(10)
    await harness.run_tick()
    changes = [(e["silent"], e["previous"]) for e in captured_log.named("WEBHOOK_SILENT_MODE")]
    assert changes == [(True, "unknown"), (False, True), (True, False)]


@pytest.mark.integration
async def test_local_json_under_the_phorge_root_and_the_database_wins_over_it(
    herald, receiver, make_harness, config, tmp_path
):
    local = tmp_path / "conf" / "local"
    local.mkdir(parents=True)
    (local / "local.json").write_text('{\n  "phabricator.silent": true\n}\n')
    harness = make_harness(
        silent_from=("database", "local"),
        config_database=config.name,
        phorge_root=str(tmp_path),
        silent_recheck=10,
    )
    hook = herald.insert_hook(uri=f"{receiver.base}/ok")
    first = herald.insert_request(hook=hook, created=int(harness.clock.seconds()))
    await harness.run_tick()
    assert herald.request(first)["status"] == "failed" and receiver.count() == 0

    config.set("false")  # Phorge's stack: the database source is above local.json
    harness.clock.advance(10)
    second = herald.insert_request(hook=hook, created=int(harness.clock.seconds()))
    await harness.run_tick()
    assert herald.request(second)["status"] == "sent" and receiver.count() == 1


@pytest.mark.integration
async def test_while_silent_mode_is_unknown_nothing_is_posted_or_written(
    herald, receiver, make_harness, tmp_path, captured_log
):
    local = tmp_path / "conf" / "local"
    local.mkdir(parents=True)
    (local / "local.json").write_text('{"phabricator.silent": tru')  # a bad edit
    harness = make_harness(silent_from=("local",), phorge_root=str(tmp_path), silent_recheck=10)
    hook = herald.insert_hook(uri=f"{receiver.base}/ok")
    request_id = herald.insert_request(hook=hook, created=int(harness.clock.seconds()))
    before = herald.request(request_id)
    for _ in range(2):
        await harness.run_tick()
        harness.clock.advance(10)
    assert receiver.count() == 0 and herald.request(request_id) == before
    (failed,) = captured_log.named("WEBHOOK_SILENT_CHECK_FAILED")
    assert failed["reason"] == "not valid JSON" and failed["source"].endswith("local.json")

    (local / "local.json").write_text('{"phabricator.silent": false}')
    await harness.run_tick()
    assert receiver.count() == 1 and herald.request(request_id)["status"] == "sent"


@pytest.mark.integration
async def test_a_site_without_a_config_database_is_not_silent(herald, receiver, make_harness):
    # Phorge skips its database source before the schema exists; so do we.
    harness = make_harness(silent_from=("database",), config_database="no_such_config")
    hook = herald.insert_hook(uri=f"{receiver.base}/ok")
    request_id = herald.insert_request(hook=hook, created=int(harness.clock.seconds()))
    await harness.run_tick()
    assert herald.request(request_id)["status"] == "sent"


# -- settings and values ---------------------------------------------------------


def test_where_silent_mode_is_read_by_default(tmp_path):
    assert parse_silent_from(None, "") == ("database",)
    assert parse_silent_from("", str(tmp_path)) == ("database", "local")
    assert parse_silent_from("none", "") == ()
    assert parse_silent_from("local, database,local", str(tmp_path)) == ("local", "database")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"GORGE_WEBHOOK_SILENT_FROM": "local"}, "local needs GORGE_WEBHOOK_PHORGE_ROOT"),
        ({"GORGE_WEBHOOK_SILENT_FROM": "file"}, "expected database, local"),
        ({"GORGE_WEBHOOK_PHORGE_ROOT": "/no/such/phorge"}, "is not a directory"),
        ({"GORGE_WEBHOOK_SILENT_RECHECK_SEC": "0"}, "GORGE_WEBHOOK_SILENT_RECHECK_SEC"),
        ({"GORGE_WEBHOOK_NAMESPACE": "a`b"}, "letters, digits and _ only"),
    ],
)
def test_bad_silent_settings_stop_start_up(env, message):
    with pytest.raises(ConfigError) as caught:
        load_webhook_settings(env)
    assert message in str(caught.value)


def test_the_loader_reads_the_config_database_of_the_namespace(tmp_path):
    settings = load_webhook_settings(
        {"GORGE_WEBHOOK_NAMESPACE": "phabricator", "GORGE_WEBHOOK_PHORGE_ROOT": str(tmp_path)}
    )
    assert settings.config_database == "phabricator_config"
    assert settings.silent_from == ("database", "local") and settings.silent_recheck == 10


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(), st.lists))
def test_php_truthiness_of_the_decoded_value(value):
    falsy = value in (None, False, 0, "", "0", []) and value is not True
    assert php_truthy(value) is (not falsy)


# -- byte for byte what Phorge writes ----------------------------------------------

PHORGE_SILENT_ROW = Path(__file__).with_name("php") / "silent_row.php"

# Properties as Phorge and earlier attempts leave them: a previous outcome to
# replace in place, escaped slashes and non-ASCII text, keys in any order.
PROPERTY_TEXTS = [
    '{"retry":"never","transactionPHIDs":[],"triggerPHIDs":[],"silent":false,"secure":false}',
    '{"retry":"forever","transactionPHIDs":["PHID-XACT-TASK-a"],"triggerPHIDs":["PHID-HRUL-b"],'
    '"silent":true,"secure":false,"errorType":"http","errorCode":500}',
    '{"errorCode":28,"retry":"forever","errorType":"timeout","note":"caf\\u00e9 a\\/b"}',
    '{"retry":"never","transactionPHIDs":[],"triggerPHIDs":[],"test":true,"extra":{"k":[1,2.5]}}',
]


def _phorge_silent_row(row: dict) -> dict:
    from gorge_testing.phorge import find_checkout

    checkout, why_not = find_checkout()
    if checkout is None:
        pytest.skip(why_not or "no Phorge checkout")
    done = subprocess.run(
        [checkout.php, str(PHORGE_SILENT_ROW), str(checkout.root)],
        input=json.dumps(row).encode(),
        capture_output=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


@pytest.mark.integration
async def test_the_silent_row_is_byte_for_byte_what_phorges_worker_writes(
    herald, receiver, make_harness, config
):
    config.set("true")
    harness = make_harness(silent_from=("database",), config_database=config.name)
    hook = herald.insert_hook(uri=f"{receiver.base}/ok")
    start = int(harness.clock.seconds())
    ids = [
        herald.insert_request(
            hook=hook, created=start, properties=text, result="fail", epoch=start - 60
        )
        for text in PROPERTY_TEXTS
    ]
    before = {request_id: herald.request(request_id) for request_id in ids}
    await harness.run_tick()
    assert receiver.count() == 0
    for request_id in ids:
        after = herald.request(request_id)
        phorge = _phorge_silent_row(before[request_id])  # Phorge's code, on the same row
        assert {key: after[key] for key in phorge} == phorge
