"""What ships: the wheel holds every package under gorge/ and its data files,
and nothing that only serves the tests or the benchmarks (tests/, bench/,
the launchers in gorge_testing/); the image copies the product alone.

The wheel is built offline from the files git tracks, copied into a
temporary folder, with the venv's own setuptools (``--no-build-isolation``),
as the image's ``pip install .`` would build it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

import pytest

from tests.support.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "gorge"
# Only the product goes into the image (Dockerfile, .dockerignore).
IMAGE_SOURCES = {"pyproject.toml", "README.md", "gorge", "twisted", "conf", "phorge"}
NOT_SHIPPED = ("gorge_testing", "tests", "bench")


def _tracked_files() -> list[str]:
    if not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True, timeout=60
    )
    return [name for name in listed.stdout.decode().split("\0") if name]


@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory) -> set[str]:
    source = tmp_path_factory.mktemp("source")
    for name in _tracked_files():
        origin = REPO_ROOT / name
        if origin.is_file():  # a tracked file deleted in the working tree is not built
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, source / name)
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "-q",
            "-w",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = out.glob("gorge-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def _product_files() -> list[str]:
    return sorted(
        name
        for name in _tracked_files()
        if name.startswith("gorge/") and (REPO_ROOT / name).is_file()
    )


def test_nothing_that_serves_only_the_tests_is_in_the_wheel(wheel_files):
    stray = sorted(
        name
        for name in wheel_files
        if name.split("/")[0] in NOT_SHIPPED or name.startswith("gorge/testing/")
    )
    assert stray == []


def test_every_package_under_gorge_is_in_the_wheel(wheel_files):
    # The packages list in pyproject.toml is kept by hand: a new sub-package
    # (gorge/worker/executor, say) must not be left out of it.
    packages = sorted(
        init.parent.relative_to(REPO_ROOT).as_posix() for init in PACKAGE.rglob("__init__.py")
    )
    assert "gorge/worker/executor" in packages
    missing = [name for name in packages if f"{name}/__init__.py" not in wheel_files]
    assert missing == []


def test_every_file_git_tracks_under_gorge_is_in_the_wheel(wheel_files):
    # Modules and data files alike: a daemon reading a file next to its code
    # (each OpenAPI document) finds it in an installed package too.
    missing = [name for name in _product_files() if name not in wheel_files]
    assert missing == []


def test_each_daemon_serves_its_openapi_document_from_the_wheel(wheel_files):
    for service in ("webhook", "mailer", "taskqueue", "worker"):
        assert f"gorge/{service}/openapi.json" in wheel_files


def test_the_wheel_holds_the_twistd_plugins_and_no_other_twisted_file(wheel_files):
    twisted = sorted(name for name in wheel_files if name.startswith("twisted/"))
    assert twisted == ["twisted/plugins/gorge_plugins.py"]


def _copied_sources(dockerfile: str) -> list[str]:
    sources = []
    for line in dockerfile.splitlines():
        words = line.split()
        if not words or words[0].upper() != "COPY":
            continue
        paths = [word for word in words[1:] if not word.startswith("--")]
        sources.extend(paths[:-1])  # the last one is the destination
    return sources


def test_the_image_copies_the_product_and_no_test_launcher():
    sources = _copied_sources((REPO_ROOT / "Dockerfile").read_text())
    assert sources, "no COPY line found in the Dockerfile"
    tops = {PurePosixPath(re.sub(r"^\./", "", source)).parts[0] for source in sources}
    assert tops <= IMAGE_SOURCES
    assert "gorge" in tops


def test_the_build_context_leaves_the_tests_out():
    ignored = set((REPO_ROOT / ".dockerignore").read_text().split())
    assert set(NOT_SHIPPED) <= ignored


def test_copied_sources_reads_every_copy_line():
    dockerfile = "FROM x\nCOPY a b ./\ncopy --chown=1:1 gorge_testing /x\nRUN cp c d\n"
    assert _copied_sources(dockerfile) == ["a", "b", "gorge_testing"]


def test_the_launchers_are_importable_from_the_checkout():
    # Not from the wheel: gorge_testing lives in the repository root, which
    # the editable install (compat mode) and the benchmarks put on sys.path.
    done = subprocess.run(
        [sys.executable, "-c", "import gorge_testing; print(gorge_testing.__file__)"],
        cwd=Path("/"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).parent == REPO_ROOT / "gorge_testing"
