"""The example configuration documents every setting the code reads."""

import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SETTING = re.compile(r"\bGORGE_[A-Z0-9_]+\b")
# Read by tooling around the daemons, not by a daemon.
NOT_DAEMON_SETTINGS = {"GORGE_TEST_TIMEOUT", "GORGE_PHORGE_ROOT", "GORGE_PHORGE_CACHE"}


def _settings_read_by_the_code() -> set[str]:
    names: set[str] = set()
    for path in (REPO / "gorge").rglob("*.py"):
        if path.relative_to(REPO / "gorge").parts[0] == "demo":
            continue  # the demo sets settings, it reads none of its own
        with path.open("rb") as source:
            literals = [
                t.string
                for t in tokenize.tokenize(source.readline)
                if t.type == tokenize.STRING or t.type == getattr(tokenize, "FSTRING_MIDDLE", -1)
            ]
        for literal in literals:
            # "GORGE_WEBHOOK_" alone is a prefix completed at run time
            names.update(n for n in SETTING.findall(literal) if not n.endswith("_"))
    return names - NOT_DAEMON_SETTINGS


def test_code_reads_settings():
    assert {
        "GORGE_LISTEN_ADDR",
        "GORGE_WEBHOOK_OUTBOUND_BLACKLIST",
        "GORGE_TASKQUEUE_BACKEND",
    } <= _settings_read_by_the_code()


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


def _compose_environment(service: str) -> dict[str, str]:
    """The ``environment:`` mapping of one service of the example compose
    file, read line by line (the file keeps to plain ``KEY: value`` lines)."""
    lines = (REPO / "conf" / "compose.example.yml").read_text().splitlines()
    start = lines.index(f"  {service}:")
    env: dict[str, str] = {}
    inside = False
    for line in lines[start + 1 :]:
        if line.startswith("  ") and not line.startswith("   "):
            break  # the next service
        if line.strip() == "environment:":
            inside = True
            continue
        if inside:
            if not line.startswith("      "):
                break
            key, _, value = line.strip().partition(": ")
            if key and not key.startswith(("#", "<<")):
                env[key] = value
    return env


_INTERPOLATION = re.compile(r"\$\{([A-Z0-9_]+)(?::([-?])([^}]*))?\}")


def _interpolate(value: str, supplied: dict[str, str]) -> str:
    def one(match):
        name, kind, rest = match.groups()
        if name in supplied:
            return supplied[name]
        if kind == "?":
            raise AssertionError(f"compose would refuse to start: {name}: {rest}")
        return rest or ""

    return _INTERPOLATION.sub(one, value)


def test_compose_worker_needs_conduit_url_and_token_and_then_starts():
    from twisted.internet.task import Clock

    from gorge.worker.service import build_worker_service
    from gorge.worker.settings import load_worker_settings

    raw = _compose_environment("gorge-worker")
    # Both are required by compose itself, so a URL can never come alone.
    for name in ("GORGE_WORKER_CONDUIT_URL", "GORGE_WORKER_CONDUIT_TOKEN"):
        assert raw[name].startswith("${" + name + ":?"), raw[name]
    supplied = {
        "GORGE_WORKER_CONDUIT_URL": "https://phorge.example.com",
        "GORGE_WORKER_CONDUIT_TOKEN": "api-abcdefghijklmnopqrstuvwxyz12",
    }
    env = {key: _interpolate(value.strip('"'), supplied) for key, value in raw.items()}
    settings = load_worker_settings({**env, "GORGE_LISTEN_ADDR": "127.0.0.1:0"})
    assert settings.webhook_owner == "gorge-webhook"  # gorge-webhook is in the stack
    service = build_worker_service(settings, Clock(), http_client=object())
    assert service.part("plan").runnable("HeraldWebhookWorker")
