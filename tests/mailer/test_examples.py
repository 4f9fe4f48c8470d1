"""The shipped configuration examples stay loadable and say the defaults."""

from __future__ import annotations

from pathlib import Path

from twisted.internet import task

from gorge.mailer.service import build_mailer_service
from gorge.mailer.settings import load_mailer_settings

CONF = Path(__file__).resolve().parents[2] / "conf"


def read_env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            env[name] = value
    return env


def test_env_example_is_the_defaults():
    env = read_env_file(CONF / "mailer.env.example")
    assert load_mailer_settings(env) == load_mailer_settings({})
    documented = set(env)
    for name in (
        "GORGE_MAILER_CONFIG",
        "GORGE_MAILER_CONFIG_FILE",
        "GORGE_MAILER_STRICT",
        "GORGE_MAILER_MAX_RETRIES",
        "GORGE_MAILER_RETRY_WAIT",
        "GORGE_MAILER_BODY_LIMIT",
        "GORGE_MAILER_SEND_TIMEOUT",
        "GORGE_MAILER_TYPE",
        "GORGE_MAILER_KEY",
        "SMTP_HOST",
        "MAILER_ACCESS_TOKEN",
    ):
        assert name in documented


def test_json_example_builds_every_backend():
    settings = load_mailer_settings(
        {"GORGE_MAILER_CONFIG_FILE": str(CONF / "mailers.example.json")}
    )
    service = build_mailer_service(settings, task.Clock(), listen=False)
    types = {b.type for b in service.part("dispatcher").backends}
    assert types == {"smtp", "sendmail", "ses", "sendgrid", "mailgun", "postmark", "test"}
    assert service.part("dispatcher").backends[0].key == "smtp-primary"
