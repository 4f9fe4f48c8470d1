"""The ``gorge`` command: every subcommand, and the blocking API client they use."""

from gorge.cli.main import main

__all__ = ["main"]
