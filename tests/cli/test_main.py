"""gorge.cli.main: the ``gorge`` command's parser and its dispatch to the
subcommands (``gorge queue`` and ``gorge webhook`` are tested beside their
services, in tests/taskqueue/test_cli.py and tests/webhook/test_cli.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gorge.cli.main import build_parser, main
from tests.support.paths import REPO_ROOT


def test_demo_takes_its_options():
    args = build_parser().parse_args(["demo", "--serve", "--timeout", "2.5", "--workdir", "w"])
    assert (args.command, args.serve, args.timeout, args.workdir) == ("demo", True, 2.5, "w")


@pytest.mark.parametrize("timeout", ["0", "-1", "soon"])
def test_demo_refuses_a_timeout_that_is_not_a_positive_number(timeout, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["demo", "--timeout", timeout])
    assert exited.value.code == 2
    assert "--timeout" in capsys.readouterr().err


def test_a_command_is_required(capsys):
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "usage"), [("queue", "usage: gorge queue"), ("webhook", "usage: gorge webhook")]
)
def test_queue_and_webhook_get_their_own_arguments(command, usage, capsys):
    # Not parsed here: everything after the word goes to the subcommand's parser.
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith(usage)


def test_python_dash_m_gorge_cli_runs_the_command():
    # How the tests and a checkout without the console script run it.
    done = subprocess.run(
        [sys.executable, "-m", "gorge.cli", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: gorge ")
    for command in ("demo", "queue", "webhook"):
        assert command in done.stdout
