"""tests/ mirrors gorge/, so the tests of a module are where one looks first.

* each sub-package ``gorge/<name>/`` (a platform layer, a service, the demo,
  the command line) has its tests in ``tests/<name>/``;
* a module at the top of the package, ``gorge/<name>.py``, has them in
  ``tests/test_<name>.py``, and no other test module sits at the top;
* the folders that mirror nothing are few and named: ``tests/repo/`` (the
  repository as a whole: packaging, layering, example configuration, the
  OpenAPI documents of all daemons, scripts, benchmarks, the Phorge library
  and the test launchers), ``tests/phorge/`` (the four daemons in a real
  Phorge), ``tests/support/`` (helpers, no tests) and ``tests/fixtures/``
  (data).
"""

from __future__ import annotations

from pathlib import Path

from tests.support.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "gorge"
TESTS = REPO_ROOT / "tests"
BESIDE_THE_MIRROR = {"repo", "phorge", "support", "fixtures"}


def _subpackages() -> set[str]:
    return {path.parent.name for path in PACKAGE.glob("*/__init__.py")}


def _test_folders() -> set[str]:
    # A folder left with nothing but byte code (a moved package) counts as gone.
    return {
        path.name
        for path in TESTS.iterdir()
        if path.is_dir()
        and path.name != "__pycache__"
        and any(entry.name != "__pycache__" for entry in path.iterdir())
    }


def _has_tests(folder: Path) -> bool:
    return any(folder.rglob("test_*.py"))


def test_every_subpackage_of_gorge_has_its_tests_folder():
    subpackages = _subpackages()
    assert {"log", "app", "web", "client", "db", "cli", "webhook", "worker"} <= subpackages
    missing = sorted(
        name
        for name in subpackages
        if not (TESTS / name / "__init__.py").is_file() or not _has_tests(TESTS / name)
    )
    assert missing == []


def test_every_tests_folder_mirrors_a_subpackage_or_is_named_here():
    strays = sorted(_test_folders() - _subpackages() - BESIDE_THE_MIRROR)
    assert strays == []


def test_a_top_level_test_module_names_a_top_level_module():
    modules = {path.stem for path in PACKAGE.glob("*.py")}
    strays = sorted(
        path.name
        for path in TESTS.glob("test_*.py")
        if path.stem.removeprefix("test_") not in modules
    )
    assert strays == []
    assert (TESTS / "test_config.py").is_file()


def test_support_holds_helpers_and_no_tests():
    assert not _has_tests(TESTS / "support")
