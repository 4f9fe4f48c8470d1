"""``gorge doctor``: check a live site against every prerequisite of the
switch-over (docs/phorge.md) and send canaries through it.

One line per check (``ok``, ``FAIL name: what; fix: what to do``, ``warn``,
``skip``), or ``--json``. Exit status: 0 nothing failed; 1 a check failed;
2 bad usage or the daemons' settings could not be read at all.

gorge's side is read from the daemons' own settings files (``--env-dir``,
the layout of conf/systemd/), Phorge's from its checkout (``--phorge-root``)
through phorge/scripts/gorge-doctor.php (gorge/cli/doctor/site.py says why)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from gorge.cli.command import EXIT_USAGE, OneLineParser, seconds
from gorge.cli.doctor.canary import Waiting, mail_canary, task_canary, webhook_canary
from gorge.cli.doctor.conduit import check_conduit_bot, conduit_post
from gorge.cli.doctor.daemons import check_daemons
from gorge.cli.doctor.database import check_grants
from gorge.cli.doctor.mail import check_mailer
from gorge.cli.doctor.phorgeconfig import check_library, check_namespace, check_taskmasters
from gorge.cli.doctor.report import Check, exit_status, fail, write_json, write_lines
from gorge.cli.doctor.site import (
    DEFAULT_ENV_DIR,
    PhorgeScript,
    Site,
    SiteUnreadable,
    daemons_of,
    default_phorge_root,
    phorge_environ,
    read_env_dir,
)
from gorge.cli.doctor.webhook import check_outbound_policy, check_silent, check_webhook_owner
from gorge.db.mysql import connect

PROG = "gorge doctor"

EPILOG = """\
exit status: 0 no check failed (warnings and skips allowed); 1 a check failed;
2 bad usage, or no daemon's settings could be read.

gorge's side: GORGE_ENV_DIR or /etc/gorge, holding gorge.env and one
<service>.env per deployed daemon, as the units in conf/systemd/ read them.
Phorge's side: --phorge-root (default: GORGE_WORKER_PHORGE_ROOT or
GORGE_WEBHOOK_PHORGE_ROOT from those files), loaded with PHABRICATOR_ENV
as bin/phd has it. Without it the checks that need Phorge's configuration
are skipped. The canaries enqueue one test task and send one test webhook
(--no-canaries leaves them out); --mail-to sends a test mail as well.
"""


def build_parser(env: Mapping[str, str]) -> OneLineParser:
    parser = OneLineParser(
        prog=PROG,
        description="Check a switched-over Phorge and the gorge daemons against docs/phorge.md.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--env-dir",
        default=env.get("GORGE_ENV_DIR") or DEFAULT_ENV_DIR,
        help="directory of gorge.env and <service>.env (default: GORGE_ENV_DIR, else /etc/gorge)",
    )
    parser.add_argument("--phorge-root", default="", help="Phorge's checkout (arcanist/ beside it)")
    parser.add_argument(
        "--phorge-env",
        default=env.get("PHABRICATOR_ENV", ""),
        help="PHABRICATOR_ENV for Phorge's PHP (default: this environment's)",
    )
    parser.add_argument(
        "--php", default="", help="PHP command line (default: GORGE_WORKER_PHP_BINARY, else php)"
    )
    parser.add_argument("--json", action="store_true", help="print the checks as JSON, for scripts")
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=60.0,
        metavar="SECONDS",
        help="how long a canary may take (default 60); each HTTP call gets at most 10 s",
    )
    parser.add_argument(
        "--no-canaries", action="store_true", help="read only: no test task or webhook"
    )
    parser.add_argument(
        "--canary-listen",
        default="127.0.0.1",
        metavar="ADDRESS",
        help="address the webhook canary's receiver listens on (default 127.0.0.1)",
    )
    parser.add_argument(
        "--mail-to",
        default="",
        metavar="ADDRESS",
        help="also send a test mail through Phorge's gorge mailer to this address (a sink)",
    )
    return parser


def run_checks(
    site: Site,
    script: PhorgeScript | None,
    root: Path | None,
    args: Any,
    *,
    connect: Callable[..., Any],
    post: Callable[[str, dict], dict],
    waiting: Waiting,
) -> list[Check]:
    checks: list[Check] = []
    checks += check_daemons(site)
    checks += check_library(site)
    checks += check_conduit_bot(site, post)
    checks += check_namespace(site)
    checks += check_grants(site, connect)
    checks += check_taskmasters(site)
    checks += check_webhook_owner(site)
    checks += check_mailer(site)
    checks += check_outbound_policy(site)
    checks += check_silent(site, connect)
    if not args.no_canaries:
        checks += task_canary(site, waiting)
        checks += webhook_canary(site, script, waiting, args.canary_listen)
    checks += mail_canary(site, root, script, args.mail_to)
    return checks


def main(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> int:
    env = os.environ if env is None else env
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    parser = build_parser(env)
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as e:
        return int(e.code or 0)
    try:
        environments = read_env_dir(Path(args.env_dir))
    except SiteUnreadable as e:
        err.write(f"{PROG}: {e}\n")
        return EXIT_USAGE
    daemons = daemons_of(environments)
    raw_root = args.phorge_root or default_phorge_root(environments)
    root = Path(raw_root) if raw_root else None
    php = args.php or environments.get("worker", {}).get("GORGE_WORKER_PHP_BINARY") or "php"
    script = None
    view, problem = None, "no --phorge-root"
    if root is not None:
        script = PhorgeScript(root, shutil.which(php) or php, phorge_environ(env, args.phorge_env))
        try:
            view, problem = script.view(), ""
        except SiteUnreadable as e:
            problem = str(e)
    site = Site(daemons, view, problem, timeout=min(10.0, args.timeout))
    checks: list[Check] = []
    if view is None and root is not None:
        checks.append(fail("phorge", problem, "check --phorge-root, --phorge-env and --php"))
    checks += run_checks(
        site,
        script if view is not None else None,
        root,
        args,
        connect=connect,
        post=conduit_post(site.timeout),
        waiting=Waiting(clock, pause, args.timeout),
    )
    (write_json if args.json else write_lines)(checks, out)
    return exit_status(checks)
