"""The Phorge extension library in phorge/: every PHP file parses, and its
library map is exactly what Arcanist's ``arc liberate`` writes.

Needs the PHP CLI (``php -l``) and, for the map, Arcanist: ``arc`` on PATH or
the ``arcanist/`` checkout beside ``GORGE_PHORGE_ROOT``. Without them the
tests are skipped and say what is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

LIBRARY = REPO_ROOT / "phorge" / "src"
MAP = "__phutil_library_map__.php"
PHP_FILES = sorted([*(REPO_ROOT / "phorge").rglob("*.php"), *(REPO_ROOT / "tests").rglob("*.php")])


def _php() -> str:
    php = shutil.which("php")
    if php is None:
        pytest.skip("php is not installed (./scripts/test.sh installs it with GORGE_PHORGE_ROOT set)")
    return php


def _arc() -> str:
    root = os.environ.get("GORGE_PHORGE_ROOT")
    if root:
        beside = Path(root).resolve().parent / "arcanist" / "bin" / "arc"
        if beside.is_file():
            return str(beside)
    arc = shutil.which("arc")
    if arc is None:
        pytest.skip("Arcanist is not available: put arc on PATH or set GORGE_PHORGE_ROOT "
                    "to a Phorge checkout with arcanist/ beside it")
    return arc


def test_the_library_has_php_files():
    assert (LIBRARY / "__phutil_library_init__.php").is_file()
    assert (LIBRARY / MAP).is_file()
    assert len(PHP_FILES) >= 4


@pytest.mark.parametrize("path", PHP_FILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_php_file_parses(path):
    done = subprocess.run([_php(), "-l", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_library_map_is_what_arc_liberate_writes(tmp_path):
    _php()
    arc = _arc()
    copy = tmp_path / "src"
    shutil.copytree(LIBRARY, copy, ignore=shutil.ignore_patterns(".phutil_module_cache"))

    done = subprocess.run([arc, "liberate", "--", str(copy)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=300)

    assert done.returncode == 0, done.stdout + done.stderr
    assert (copy / MAP).read_text() == (LIBRARY / MAP).read_text(), (
        f"phorge/src/{MAP} is stale: run `arc liberate -- phorge/src` and commit the result")
