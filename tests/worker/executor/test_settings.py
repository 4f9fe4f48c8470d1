"""The local executors' settings: a Phorge root that is not one, a PHP that is
not there, or a Phorge that does not load stop the daemon at start-up with
one line naming the setting; the rest have sane defaults."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from gorge.config import ConfigError
from gorge.worker import service as worker_service
from gorge.worker.settings import BUNDLED_EXECUTOR, default_php_executors, load_worker_settings

BASE_ENV = {"GORGE_WORKER_TASK_QUEUE_URL": "http://queue:8090/", "GORGE_LISTEN_ADDR": "127.0.0.1:0"}


def _fake_phorge(tmp_path: Path) -> Path:
    """The files a Phorge and an Arcanist checkout are recognised by (empty)."""
    root = tmp_path / "phorge"
    for path in (
        root / "scripts" / "init" / "init-script.php",
        tmp_path / "arcanist" / "support" / "init" / "init-script.php",
    ):
        path.parent.mkdir(parents=True)
        path.write_text("<?php\n")
    return root


def _settings(**env):
    return load_worker_settings({**BASE_ENV, **env})


def test_without_a_phorge_root_there_are_no_executors_and_conduit_is_the_way():
    s = _settings()
    assert s.phorge_root == "" and not s.delegates
    assert s.php_executor_script == str(BUNDLED_EXECUTOR)
    assert BUNDLED_EXECUTOR.is_file()


@pytest.mark.parametrize(("cpus", "executors"), [(1, 2), (2, 4), (4, 8), (8, 16), (64, 16)])
def test_the_default_pool_is_two_per_core_within_bounds(cpus, executors):
    assert default_php_executors(cpus) == executors


def test_a_phorge_root_turns_executors_on_and_conduit_off_for_php_tasks(tmp_path):
    php = shutil.which("sh")  # any command on PATH passes the check
    s = _settings(
        GORGE_WORKER_PHORGE_ROOT=str(_fake_phorge(tmp_path)),
        GORGE_WORKER_PHP_BINARY=php,
        GORGE_WORKER_PHP_EXECUTORS="3",
        GORGE_WORKER_CONDUIT_URL="http://phorge.test",
        GORGE_WORKER_CONDUIT_TOKEN="t",
    )
    assert s.delegates and s.php_executors == 3
    assert s.phorge_root == str((tmp_path / "phorge").resolve())
    assert any("CONDUIT_URL is not used for PHP tasks" in w for w in s.warnings)


@pytest.mark.parametrize(
    ("make", "setting", "says"),
    [
        (lambda tmp: tmp / "nothing", "GORGE_WORKER_PHORGE_ROOT", "is not a Phorge checkout"),
        (
            lambda tmp: (_fake_phorge(tmp), shutil.rmtree(tmp / "arcanist"))[0],
            "GORGE_WORKER_PHORGE_ROOT",
            "no Arcanist checkout beside it",
        ),
    ],
)
def test_a_root_that_is_no_phorge_names_the_setting(tmp_path, make, setting, says):
    with pytest.raises(ConfigError) as info:
        _settings(GORGE_WORKER_PHORGE_ROOT=str(make(tmp_path)))
    assert info.value.setting == setting and says in str(info.value)


def test_a_missing_php_or_executor_script_names_its_setting(tmp_path):
    root = str(_fake_phorge(tmp_path))
    with pytest.raises(ConfigError) as info:
        _settings(GORGE_WORKER_PHORGE_ROOT=root, GORGE_WORKER_PHP_BINARY="/no/such/php")
    assert info.value.setting == "GORGE_WORKER_PHP_BINARY"
    with pytest.raises(ConfigError) as info:
        _settings(
            GORGE_WORKER_PHORGE_ROOT=root,
            GORGE_WORKER_PHP_BINARY=sys.executable,
            GORGE_WORKER_PHP_EXECUTOR=str(tmp_path / "missing.php"),
        )
    assert info.value.setting == "GORGE_WORKER_PHP_EXECUTOR"


@pytest.mark.parametrize("value", ["0", "257", "many"])
def test_the_pool_size_is_checked(value):
    with pytest.raises(ConfigError) as info:
        _settings(GORGE_WORKER_PHP_EXECUTORS=value)
    assert info.value.setting == "GORGE_WORKER_PHP_EXECUTORS"


def test_an_unloadable_phorge_stops_the_daemon_with_one_line(tmp_path, monkeypatch, capsys):
    php = shutil.which("php")
    if php is None:
        pytest.skip("php is not installed (./scripts/test.sh installs it with a Phorge checkout)")
    # The files are there but hold no Phorge: loading it fails.
    monkeypatch.setenv("GORGE_WORKER_PHORGE_ROOT", str(_fake_phorge(tmp_path)))
    monkeypatch.setenv("GORGE_WORKER_PHP_BINARY", php)
    for name, value in BASE_ENV.items():
        monkeypatch.setenv(name, value)
    options = worker_service.Options()
    options.parseOptions([])
    with pytest.raises(SystemExit) as info:
        worker_service.makeService(options)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("gorge-worker: GORGE_WORKER_PHORGE_ROOT: Phorge at ")
    assert "did not load" in err[0]
