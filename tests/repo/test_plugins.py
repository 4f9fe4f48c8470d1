"""twistd finds the four gorge daemons and can describe their options."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.support.paths import REPO_ROOT
from tests.support.twistd import TWISTD, daemon_environ

SERVICES = ("gorge-webhook", "gorge-mailer", "gorge-taskqueue", "gorge-worker")


def _twistd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*TWISTD, *args],
        cwd=REPO_ROOT,
        env=daemon_environ(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _service_module(tapname: str) -> str:
    return f"gorge.{tapname.removeprefix('gorge-')}.service"


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def test_plugin_discovery_finds_the_four_daemons(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    # twisted.plugins computes its search path once, at first import; make
    # sure it is computed with the repository root on sys.path.
    import twisted
    import twisted.plugins

    monkeypatch.setattr(twisted, "plugins", twisted.plugins)  # restored afterwards
    monkeypatch.delitem(sys.modules, "twisted.plugins")
    from twisted.application.service import IServiceMaker
    from twisted.plugin import getPlugins

    import twisted.plugins

    makers = {p.tapname: p for p in getPlugins(IServiceMaker, twisted.plugins)}
    assert set(SERVICES) <= set(makers)
    for tapname in SERVICES:
        assert makers[tapname].module == _service_module(tapname)
        assert makers[tapname].description


def test_twistd_help_lists_the_four_daemons():
    result = _twistd("--help")
    assert result.returncode == 0, result.stderr
    for tapname in SERVICES:
        assert tapname in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "tapname",
    [
        pytest.param(
            tapname,
            marks=pytest.mark.xfail(
                not _module_exists(_service_module(tapname)),
                reason=f"{_service_module(tapname)} does not exist yet",
                strict=True,
            ),
        )
        for tapname in SERVICES
    ],
)
def test_twistd_subcommand_help_lists_its_options(tapname):
    result = _twistd(tapname, "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"twistd [options] {tapname}" in result.stdout
    assert "--help" in result.stdout
    # Anything beyond --help/--version proves the service's own Options were used.
    own_options = [
        line
        for line in result.stdout.splitlines()
        if line.lstrip().startswith("-") and "--help" not in line and "--version" not in line
    ]
    assert own_options, result.stdout


def test_every_package_directory_is_declared_for_installation():
    # The image installs with a plain `pip install .`, which ships only the
    # packages pyproject.toml lists; the editable install used by the tests
    # would hide an omission.
    import tomllib

    declared = set(
        tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    on_disk = {
        ".".join(path.parent.relative_to(REPO_ROOT).parts)
        for path in (REPO_ROOT / "gorge").rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert on_disk - declared == set()
    assert "twisted.plugins" in declared
    assert (REPO_ROOT / "twisted" / "plugins" / "gorge_plugins.py").is_file()
    # twistd's plugin directory must stay a namespace: an __init__.py here
    # would shadow Twisted's own twisted.plugins package.
    assert not (REPO_ROOT / "twisted" / "__init__.py").exists()
    assert not (REPO_ROOT / "twisted" / "plugins" / "__init__.py").exists()
