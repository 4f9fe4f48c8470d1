"""What the ``gorge`` sub-commands that talk to a daemon share: one-line usage
errors, argument types, times, tables and the common options."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar, TextIO

from gorge.cli.apiclient import ApiClient, Refused, ServiceUnavailable

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit 2), not usage + error."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: {message}\n")


def wrap(text: str) -> str:
    return textwrap.fill(text, 78)


def non_negative(text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text.strip()):
        raise argparse.ArgumentTypeError(f"not a non-negative integer: {text!r}")
    return int(text)


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_when(text: str, now: float, *, past: bool = False) -> int:
    """A time: epoch seconds, ``now``, ``+90s`` / ``+30m`` / ``+6h`` / ``+2d``
    (``-2h`` ... when ``past``: that long ago), or an ISO 8601 date or time
    (``2026-09-08``, ``2026-09-08T12:30``; local time unless it names an offset)."""
    value = text.strip()
    if value == "now":
        return int(now)
    if re.fullmatch(r"[0-9]+", value):
        return int(value)
    relative = re.fullmatch(r"([+-])([0-9]+)([smhd]?)", value)
    if relative and (relative.group(1) == "+" or past):
        sign = 1 if relative.group(1) == "+" else -1
        return int(now) + sign * int(relative.group(2)) * _UNITS[relative.group(3) or "s"]
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        relatives = "-2h, -30m, +30m" if past else "+30m, +6h, +2d"
        raise argparse.ArgumentTypeError(
            f"not a time (use epoch seconds, now, {relatives} or 2026-09-08T12:30): {text!r}"
        ) from None
    return int(moment.timestamp())


def utc_time(epoch: int | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def print_table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write(
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() + "\n"
        )


def common_options(
    env: Mapping[str, str], *, url_setting: str, default_url: str, product: str, noun: str
) -> OneLineParser:
    """``--url``, ``--token``, ``--json``, ``--timeout``, as a parent parser."""
    common = OneLineParser(add_help=False)
    common.add_argument(
        "--url",
        default=env.get(url_setting) or default_url,
        help=f"base URL of {product} (default: {url_setting}, else {default_url})",
    )
    common.add_argument(
        "--token",
        default=env.get("GORGE_SERVICE_TOKEN", ""),
        help=f"{noun}'s service token (default: GORGE_SERVICE_TOKEN)",
    )
    common.add_argument(
        "--json", action="store_true", help=f"print {noun}'s answer as JSON, for scripts"
    )
    common.add_argument(
        "--timeout",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="give up on a request after this long (default 30)",
    )
    return common


def standard_streams(
    env: Mapping[str, str] | None,
    out: TextIO | None,
    err: TextIO | None,
    clock: Callable[[], float] | None,
) -> tuple[Mapping[str, str], TextIO, TextIO, Callable[[], float]]:
    """A sub-command's ``main`` takes these for tests; the process's own by default."""
    return (
        os.environ if env is None else env,
        sys.stdout if out is None else out,
        sys.stderr if err is None else err,
        time.time if clock is None else clock,
    )


class Command:
    """One run of a ``gorge`` sub-command that talks to a daemon: the parsed
    arguments, the daemon's client, the streams and the exit status so far.

    Each verb is a method of the same name (``dead ls`` is ``dead_ls``).
    """

    prog: ClassVar[str]

    def __init__(
        self,
        args: argparse.Namespace,
        http: ApiClient,
        out: TextIO,
        err: TextIO,
        clock: Callable[[], float],
    ) -> None:
        self.args = args
        self.http = http
        self.out = out
        self.err = err
        self.clock = clock
        self.status = EXIT_OK

    @property
    def verb(self) -> str:
        return str(self.args.verb)

    def emit(self, data: Any, human: Callable[[], object]) -> None:
        """``data`` as JSON with ``--json``, else what ``human`` writes."""
        if self.args.json:
            self.out.write(json.dumps(data, ensure_ascii=False, indent=2) + "\n")
        else:
            human()

    def refused(self, what: str, message: str) -> None:
        """One item the daemon refused: say so and exit 1, but go on with the rest."""
        self.err.write(f"{self.prog} {self.verb}: {what}: {message}\n")
        self.status = EXIT_REFUSED

    def run(self) -> int:
        """Run the verb; the exit status: 0 done, 1 refused, 3 unreachable."""
        try:
            getattr(self, self.verb.replace(" ", "_"))()
        except ServiceUnavailable as e:
            self.err.write(f"{self.prog}: {e}\n")
            return EXIT_UNAVAILABLE
        except Refused as e:
            self.err.write(f"{self.prog} {self.verb}: {e.message}\n")
            return EXIT_REFUSED
        return self.status
