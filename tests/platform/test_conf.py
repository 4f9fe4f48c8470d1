"""The example configuration documents every setting the code reads."""

import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SETTING = re.compile(r"\bGORGE_[A-Z0-9_]+\b")
# Read by tooling around the daemons, not by a daemon.
NOT_DAEMON_SETTINGS = {"GORGE_TEST_TIMEOUT"}


def _settings_read_by_the_code() -> set[str]:
    names: set[str] = set()
    for path in (REPO / "gorge").rglob("*.py"):
        if path.name.startswith("demo"):
            continue  # the demo sets settings, it reads none of its own
        with path.open("rb") as source:
            literals = [t.string for t in tokenize.tokenize(source.readline)
                        if t.type == tokenize.STRING or t.type == getattr(tokenize, "FSTRING_MIDDLE", -1)]
        for literal in literals:
            # "GORGE_WEBHOOK_" alone is a prefix completed at run time
            names.update(n for n in SETTING.findall(literal) if not n.endswith("_"))
    return names - NOT_DAEMON_SETTINGS


def test_code_reads_settings():
    assert {"GORGE_LISTEN_ADDR", "GORGE_WEBHOOK_OUTBOUND_BLACKLIST",
            "GORGE_TASKQUEUE_BACKEND"} <= _settings_read_by_the_code()


@pytest.mark.parametrize("example", ["gorge.env.example"])
def test_every_setting_is_in_the_combined_example(example):
    text = (REPO / "conf" / example).read_text()
    documented = set(SETTING.findall(text))
    assert _settings_read_by_the_code() - documented == set()


@pytest.mark.parametrize("service", ["webhook", "mailer", "taskqueue", "worker"])
def test_service_examples_have_one_comment_per_setting(service):
    lines = (REPO / "conf" / f"{service}.env.example").read_text().splitlines()
    for index, line in enumerate(lines):
        if line and not line.startswith("#"):
            assert "=" in line and lines[index - 1].startswith("#"), line
