"""The Phorge extension library in phorge/: every PHP file parses, and its
library map is exactly what Arcanist's ``arc liberate`` writes.

Needs the PHP CLI (``php -l``) and, for the map, Arcanist: ``arc`` on PATH or
the ``arcanist/`` checkout beside ``GORGE_PHORGE_ROOT``. Without them the
tests are skipped and say what is missing. Nothing is written into that
checkout: when its PHP parser (xhpast) is not built, ``arc liberate`` runs
from a temporary copy, which builds it there (about a minute) once; the
built parser is kept under ``$XDG_CACHE_HOME/gorge-tests`` (``~/.cache``)
for later runs.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gorge_testing.phorge import find_checkout, pinned_commits
from tests.support.paths import REPO_ROOT

LIBRARY = REPO_ROOT / "phorge" / "src"
MAP = "__phutil_library_map__.php"
PHP_FILES = sorted(
    path
    for folder in ("phorge", "gorge", "gorge_testing", "tests")
    for path in (REPO_ROOT / folder).rglob("*.php")
)


def _php() -> str:
    php = shutil.which("php")
    if php is None:
        pytest.skip(
            "php is not installed (./scripts/test.sh installs it when it finds a Phorge checkout)"
        )
    return php


def _arcanist() -> Path:
    """The Arcanist checkout: the real-Phorge tests' one, else the one of ``arc``."""
    checkout, _ = find_checkout()
    if checkout is not None:
        return checkout.arcanist
    arc = shutil.which("arc")
    if arc is None:
        pytest.skip(
            "Arcanist is not available: put arc on PATH, make the pinned checkout "
            "with scripts/phorge-checkout.sh, or set GORGE_PHORGE_ROOT"
        )
    return Path(arc).resolve().parent.parent


def _xhpast_is_built(arcanist: Path) -> bool:
    binary = arcanist / "src" / "parser" / "xhpast" / "bin" / "xhpast"
    source = (arcanist / "src" / "parser" / "xhpast" / "bin" / "PhutilXHPASTBinary.php").read_text()
    expected = re.search(r"const EXPECTED_VERSION = '([^']+)'", source)
    if not binary.is_file() or expected is None:
        return False
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.strip() == expected.group(1)


def _xhpast_cache(arcanist: Path) -> Path:
    """Where a parser built for these xhpast sources is kept between runs."""
    digest = hashlib.sha256()
    sources = sorted(
        p
        for p in (arcanist / "support" / "xhpast").rglob("*")
        if p.is_file() and p.suffix not in (".o", ".a") and p.name != "xhpast"
    )
    for path in [
        *sources,
        arcanist / "src" / "parser" / "xhpast" / "bin" / "PhutilXHPASTBinary.php",
    ]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "gorge-tests" / f"xhpast-{digest.hexdigest()[:16]}"


def _arc(tmp_path: Path) -> tuple[str, Path | None]:
    """``arc``, and where to keep the parser it builds (None: nothing to keep).

    When the checkout's PHP parser (xhpast) is not built, ``arc liberate``
    would build it inside the user's checkout; it runs from a copy instead,
    given the parser a previous run built, if any.
    """
    arcanist = _arcanist()
    if _xhpast_is_built(arcanist):
        return str(arcanist / "bin" / "arc"), None
    cache = _xhpast_cache(arcanist)
    if not cache.is_file() and (shutil.which("make") is None or shutil.which("g++") is None):
        pytest.skip(
            f"Arcanist's xhpast is not built in {arcanist}, and building it in a "
            "copy needs make and g++"
        )
    copy = tmp_path / "arcanist"
    shutil.copytree(arcanist, copy, symlinks=True)
    binary = copy / "src" / "parser" / "xhpast" / "bin" / "xhpast"
    if cache.is_file():
        shutil.copy2(cache, binary)
        return str(copy / "bin" / "arc"), None
    return str(copy / "bin" / "arc"), cache


def _keep_built_parser(arc: str, cache: Path) -> None:
    binary = Path(arc).parent.parent / "src" / "parser" / "xhpast" / "bin" / "xhpast"
    if binary.is_file():
        cache.parent.mkdir(parents=True, exist_ok=True)
        staging = cache.with_suffix(f".{os.getpid()}")
        shutil.copy2(binary, staging)
        staging.replace(cache)


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
    arc, cache = _arc(tmp_path)
    copy = tmp_path / "src"
    shutil.copytree(LIBRARY, copy, ignore=shutil.ignore_patterns(".phutil_module_cache"))

    done = subprocess.run(
        [arc, "liberate", "--", str(copy)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=600,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    if cache is not None:
        _keep_built_parser(arc, cache)
    assert (copy / MAP).read_text() == (LIBRARY / MAP).read_text(), (
        f"phorge/src/{MAP} is stale: run `arc liberate -- phorge/src` and commit the result"
    )


def test_the_docs_name_the_pinned_commits():
    # phorge/tested-with is the one place naming them; the docs must agree.
    pinned = pinned_commits()
    for doc in ("docs/phorge.md", "phorge/README.md", "README.md"):
        text = (REPO_ROOT / doc).read_text()
        assert f"`{pinned['phorge'][:10]}`" in text, doc
        assert f"`{pinned['arcanist'][:8]}`" in text, doc
