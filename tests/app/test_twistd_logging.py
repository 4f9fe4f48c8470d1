"""A plain ``twistd -n gorge-X`` prints gorge's lines at GORGE_LOG_LEVEL in
GORGE_LOG_FORMAT; ``--logger`` keeps working and nothing is printed twice.

Real twistd processes; each one is stopped with SIGTERM once it has answered.
"""

from __future__ import annotations

import json
import re

import pytest
import pytest_twisted
from twisted.internet import reactor

from tests.support.twistd import TwistdProcess, daemon_environ

pytestmark = pytest.mark.slow

SERVICES = ("gorge-webhook", "gorge-mailer", "gorge-taskqueue", "gorge-worker")
PLAIN = ("--nodaemon", "--pidfile=")
WITH_LOGGER = (*PLAIN, "--logger=gorge.log.output.observer_from_env")

# The mailer names an option its backend does not read at debug level, while
# it builds its tree: a debug line every run produces, before twistd has
# started logging (so it is buffered and replayed through the observer).
MAILERS = '[{"key":"t","type":"test","options":{"colour":"blue"}}]'
DEBUG_EVENT = "MAILER_OPTION_IGNORED"

TEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARN|ERROR|CRITICAL) +\[[^\]]*\] "
)


def environ(tmp_path, **extra: str) -> dict[str, str]:
    return daemon_environ(
        {
            "GORGE_LISTEN_ADDR": "127.0.0.1:0",
            "GORGE_TASKQUEUE_BACKEND": "sqlite",
            "GORGE_TASKQUEUE_SQLITE_PATH": str(tmp_path / "queue.sqlite3"),
            "GORGE_MAILER_CONFIG": MAILERS,
            # Nothing listens there: the worker logs its failed leases, and that is all.
            "GORGE_WORKER_TASK_QUEUE_URL": "http://127.0.0.1:9",
            **extra,
        },
        drop=("GORGE_",),
    )


async def run_until_answered(tapname: str, env, args=PLAIN) -> list[str]:
    """Start, wait for an answer, SIGTERM, wait for the end; the output lines."""
    daemon = TwistdProcess(reactor, tapname, env, args)
    try:
        await daemon.serving()
        await daemon.stop()
    finally:
        daemon.kill()
    return [line for line in daemon.lines() if line.strip()]


def named(lines: list[str], event: str) -> list[str]:
    return [line for line in lines if re.search(rf"\b{event}\b", line)]


@pytest.mark.parametrize("tapname", SERVICES)
@pytest_twisted.ensureDeferred
async def test_plain_twistd_prints_gorge_lines_at_info(tapname, tmp_path):
    lines = await run_until_answered(tapname, environ(tmp_path))
    assert named(lines, "starting on"), lines
    # Every line, twistd's own included, is gorge's text line; none at debug.
    assert [line for line in lines if not TEXT_LINE.match(line)] == []
    assert [line for line in lines if " DEBUG " in line] == []


@pytest_twisted.ensureDeferred
async def test_plain_twistd_honours_the_level_set(tmp_path):
    quiet = await run_until_answered("gorge-mailer", environ(tmp_path))
    assert named(quiet, DEBUG_EVENT) == [] and len(named(quiet, "MAILER_STARTED")) == 1

    debug = await run_until_answered("gorge-mailer", environ(tmp_path, GORGE_LOG_LEVEL="debug"))
    assert len(named(debug, DEBUG_EVENT)) == 1
    assert " DEBUG [gorge.mailer.backends] " in named(debug, DEBUG_EVENT)[0]


@pytest_twisted.ensureDeferred
async def test_plain_twistd_honours_the_json_format(tmp_path):
    lines = await run_until_answered("gorge-mailer", environ(tmp_path, GORGE_LOG_FORMAT="json"))
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    events = [record["event"] for record in records]
    assert events.count("MAILER_STARTED") == 1
    assert all(record["level"] in ("info", "warn", "error") for record in records)


@pytest_twisted.ensureDeferred
async def test_logger_option_still_works_and_prints_each_line_once(tmp_path):
    lines = await run_until_answered(
        "gorge-mailer", environ(tmp_path, GORGE_LOG_LEVEL="debug"), args=WITH_LOGGER
    )
    assert [line for line in lines if not TEXT_LINE.match(line)] == []
    assert len(named(lines, DEBUG_EVENT)) == 1
    assert len(named(lines, "MAILER_STARTED")) == 1
    assert len(named(lines, "starting on")) == 1


def test_the_old_logger_name_still_names_the_same_observer():
    # Units written before the log layer moved name gorge.logging.
    from gorge.log.output import observer_from_env
    from gorge.logging import observer_from_env as alias

    assert alias is observer_from_env
