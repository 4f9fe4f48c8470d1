"""Phorge's cluster.databases as where a daemon connects (gorge/db/topology.py):
the file's shapes, Phorge's choice of master, what a bad file says, and what a
reload with a changed master does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gorge.config import ConfigError, MySQLSettings
from gorge.db.topology import MasterFollower, TopologySource, parse_topology
from gorge.taskqueue.settings import load_taskqueue_settings
from gorge.webhook.settings import load_webhook_settings
from tests.support.logcapture import logged_events

BASE = MySQLSettings(host="db-own", port=3307, user="daemon", password="own", database="p_worker")


def parse(entries):
    return parse_topology(entries, default_port=3306, default_user="u", default_password="p")


def write(tmp_path: Path, document, name: str = "cluster.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return str(path)


def config_get(entries):
    """What ``bin/config get cluster.databases`` prints."""
    return {
        "config": [
            {
                "key": "cluster.databases",
                "source": "local",
                "value": entries,
                "status": "set",
                "errorInfo": None,
            },
            {
                "key": "cluster.databases",
                "source": "database",
                "value": None,
                "status": "unset",
                "errorInfo": None,
            },
        ]
    }


PAIR = [
    {"host": "db1", "role": "master", "user": "phorge", "pass": "secret"},
    {"host": "db2", "role": "replica", "master": "db1:3307"},
]


@pytest.mark.parametrize(
    "document",
    [PAIR, {"cluster.databases": PAIR}, config_get(PAIR)],
    ids=["list", "local.json", "bin/config get"],
)
def test_each_shape_of_the_file_gives_the_master(tmp_path, document):
    source = TopologySource(write(tmp_path, document), "worker", "SETTING", BASE)
    settings = source.load()
    # Port left out: the daemon's own; TLS, database and the rest stay the daemon's.
    assert (settings.host, settings.port, settings.user, settings.password) == (
        "db1",
        3307,
        "phorge",
        "secret",
    )
    assert settings.database == "p_worker"


def test_local_json_defaults_come_from_its_mysql_options(tmp_path):
    document = {
        "mysql.user": "site",
        "mysql.pass": "site-pass",
        "mysql.port": 3310,
        "cluster.databases": [{"host": "db1", "role": "master"}],
    }
    settings = TopologySource(write(tmp_path, document), "herald", "S", BASE).load()
    assert (settings.port, settings.user, settings.password) == (3310, "site", "site-pass")


PARTITIONED = [
    {"host": "db1", "role": "master", "partition": ["default"]},
    {"host": "db2", "role": "replica", "master": "db1:3306"},
    {"host": "db3", "role": "master", "partition": ["worker", "file"]},
    {"host": "db4", "role": "replica", "master": "db3:3306"},
]


def test_partitioned_site_picks_the_partition_holding_the_database():
    topology = parse(PARTITIONED)
    assert topology.master_for("worker").host == "db3"
    assert topology.master_for("herald").host == "db1"  # the default partition


def test_disabled_hosts_are_left_out_as_phorge_leaves_them():
    entries = [dict(entry) for entry in PARTITIONED]
    entries[2]["disabled"] = True
    # getMasterDatabaseRefForApplication drops disabled masters first: the
    # worker database then goes where Phorge itself would write it.
    assert parse(entries).master_for("worker").host == "db1"
    entries[0]["disabled"] = True
    assert parse(entries).master_for("worker") is None
    single = [{"host": "old", "role": "master", "disabled": True}, *PAIR[1:]]
    single[1] = {"host": "db2", "role": "replica", "master": "old:3306"}
    assert parse(single).master_for("worker") is None  # a replica is never written to


@pytest.mark.parametrize(
    ("entries", "reason"),
    [
        ({"host": "db1"}, "not a list"),
        (["db1"], "entry 0 is not an object"),
        ([{"role": "master"}], "'host' is missing"),
        ([{"host": "db1", "role": "primary"}], "is not master or replica"),
        ([{"host": "db1", "role": "master", "port": "3306"}], "'port' must be a int"),
        ([{"host": "db1", "role": "master", "port": True}], "'port' must be a int"),
        ([{"host": "db1", "role": "master", "disabled": 1}], "'disabled' must be a bool"),
        ([{"host": "db1", "role": "master", "weight": 2}], "unknown key 'weight'"),
        ([{"host": "db1", "role": "master"}] * 2, "db1:3306 is listed twice"),
        (
            [{"host": "db1", "role": "master"}, {"host": "db2", "role": "master"}],
            "has no 'partition'",
        ),
        (
            [
                {"host": "db1", "role": "master", "partition": ["default"]},
                {"host": "db2", "role": "master", "partition": ["default"]},
            ],
            "both hold 'default'",
        ),
        (
            [
                {"host": "db1", "role": "master"},
                {"host": "db2", "role": "replica", "partition": ["worker"]},
            ],
            "only masters have one",
        ),
        (
            [{"host": "db1", "role": "master"}, {"host": "db2", "role": "replica", "master": "x"}],
            "follows x, which is not a master",
        ),
        ([{"host": "db2", "role": "replica"}], "no master to follow"),
    ],
)
def test_what_phorge_refuses_is_refused_with_the_reason(entries, reason):
    with pytest.raises(ValueError, match=reason):
        parse(entries)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{not json", "Expecting property name"),
        ('{"config": []}', "not set in any source"),
        ('{"other": 1}', "no cluster.databases"),
        ('[{"host": "db2", "role": "replica", "master": "db1:1", "disabled": true}]', "not a"),
        ('[{"host": "db1", "role": "master", "disabled": true}]', "no enabled master"),
    ],
)
def test_a_bad_file_stops_start_up_with_one_line_naming_the_setting(tmp_path, content, reason):
    path = tmp_path / "cluster.json"
    path.write_text(content)
    env = {"GORGE_TASKQUEUE_MYSQL_TOPOLOGY_FILE": str(path)}
    with pytest.raises(ConfigError) as raised:
        load_taskqueue_settings(env)
    assert raised.value.setting == "GORGE_TASKQUEUE_MYSQL_TOPOLOGY_FILE"
    assert reason in raised.value.reason and "\n" not in str(raised.value)


def test_a_missing_file_names_the_setting(tmp_path):
    env = {"GORGE_WEBHOOK_MYSQL_TOPOLOGY_FILE": str(tmp_path / "nowhere.json")}
    with pytest.raises(ConfigError, match="GORGE_WEBHOOK_MYSQL_TOPOLOGY_FILE: .*No such file"):
        load_webhook_settings(env)


def test_daemons_look_up_their_own_database(tmp_path):
    path = write(tmp_path, PARTITIONED)
    webhook = load_webhook_settings(
        {"GORGE_WEBHOOK_MYSQL_TOPOLOGY_FILE": path, "GORGE_WEBHOOK_MYSQL_PASS": "pw"}
    )
    assert (webhook.mysql.host, webhook.mysql.database, webhook.mysql.password) == (
        "db1",
        "phorge_herald",
        "pw",
    )
    assert webhook.topology is not None and webhook.topology.application == "herald"
    queue = load_taskqueue_settings({"GORGE_TASKQUEUE_MYSQL_TOPOLOGY_FILE": path})
    assert (queue.mysql.host, queue.mysql.database) == ("db3", "phorge_worker")
    # Off by default; and the other backends have no MySQL to point anywhere.
    assert load_taskqueue_settings({}).topology is None
    other = load_taskqueue_settings(
        {"GORGE_TASKQUEUE_MYSQL_TOPOLOGY_FILE": path, "GORGE_TASKQUEUE_BACKEND": "sqlite"}
    )
    assert other.topology is None


def test_reload_moves_only_when_the_master_changed_and_keeps_it_on_a_bad_file(tmp_path):
    path = write(tmp_path, PAIR)
    source = TopologySource(path, "worker", "GORGE_TASKQUEUE_MYSQL_TOPOLOGY_FILE", BASE)
    moves: list[MySQLSettings] = []
    follower = MasterFollower(source, source.load(), [moves.append], name="taskqueue")
    with logged_events() as events:
        follower.reload()
        assert moves == []
        write(tmp_path, "broken")
        follower.reload()
        assert moves == [] and follower.current.host == "db1"
        promoted = [{"host": "db2", "role": "master", "user": "phorge", "pass": "secret"}]
        write(tmp_path, promoted)
        follower.reload()
    assert [(m.host, m.port, m.database) for m in moves] == [("db2", 3307, "p_worker")]
    names = [str(e.get("log_format", "")).split(" ")[0] for e in events]
    assert names == [
        "TASKQUEUE_DB_TOPOLOGY_UNCHANGED",
        "TASKQUEUE_DB_TOPOLOGY_REJECTED",
        "TASKQUEUE_DB_MASTER_CHANGED",
    ]
    rejected = events[1]
    assert rejected["setting"] == "GORGE_TASKQUEUE_MYSQL_TOPOLOGY_FILE"


applications = st.sampled_from(["worker", "herald", "file", "user", "repository"])


@st.composite
def layouts(draw):
    """A valid cluster.databases: masters with disjoint partitions (at most one
    default), each with some replicas, any of them disabled."""
    count = draw(st.integers(1, 4))
    names = draw(
        st.lists(st.lists(applications, unique=True, max_size=3), min_size=count, max_size=count)
    )
    taken: set[str] = set()
    default_at = draw(st.integers(-1, count - 1))
    entries = []
    for index, partition in enumerate(names):
        own = [name for name in partition if name not in taken]
        taken.update(own)
        if index == default_at:
            own.append("default")
        master = {"host": f"m{index}", "role": "master", "disabled": draw(st.booleans())}
        if count > 1:
            master["partition"] = own
        entries.append(master)
        for replica in range(draw(st.integers(0, 2))):
            entries.append(
                {
                    "host": f"r{index}-{replica}",
                    "role": "replica",
                    "master": f"m{index}:3306",
                    "disabled": draw(st.booleans()),
                }
            )
    return entries


@given(layouts(), applications)
def test_the_master_chosen_is_always_an_enabled_master_holding_the_database(entries, app):
    topology = parse(entries)
    master = topology.master_for(app)
    enabled = [e for e in entries if e["role"] == "master" and not e["disabled"]]
    if master is None:
        # Only when no enabled master holds it, nor an enabled default.
        assert all(
            len(entries)
            and topology.partitioned
            and app not in e["partition"]
            and "default" not in e["partition"]
            for e in enabled
        )
        return
    assert master.is_master and not master.disabled
    if topology.partitioned:
        holder = [e for e in entries if app in e.get("partition", [])]
        if holder and not holder[0]["disabled"]:
            assert master.host == holder[0]["host"]
        else:
            assert "default" in master.partition
