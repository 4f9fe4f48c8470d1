"""The ``gorge`` console command.

The daemons themselves run under twistd (``twistd -n gorge-webhook`` ...);
this command holds what is not a daemon: ``gorge demo``, ``gorge queue``
(gorge/taskqueue/cli.py) to inspect and steer a running queue, and
``gorge webhook`` (gorge/webhook/cli.py) for gorge-webhook's delivery log,
and ``gorge doctor`` (gorge/cli/doctor.py), which checks a switched-over site."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gorge", description="Phorge background work on Twisted: tools around the daemons."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        help="run all four services on SQLite in one process and show them at work",
        description="Start gorge-webhook, gorge-mailer, gorge-taskqueue and gorge-worker on "
        "SQLite in a temporary directory, with a webhook receiver and an SMTP sink "
        "in the same process; seed hooks, tasks and mails; narrate; and exit 0 once "
        "every item reached its expected final state.",
    )
    demo.add_argument(
        "--serve",
        action="store_true",
        help="keep everything running afterwards and print the service URLs",
    )
    demo.add_argument(
        "--timeout",
        type=_positive,
        default=60.0,
        metavar="SECONDS",
        help="give up (exit 1) if the items have not settled by then (default 60)",
    )
    demo.add_argument(
        "--workdir",
        default="",
        metavar="DIR",
        help="directory for the SQLite files and the service log "
        "(default: a new temporary directory)",
    )
    # Parsed by gorge.taskqueue.cli itself (see main); listed here for --help.
    commands.add_parser(
        "queue",
        add_help=False,
        help="inspect and steer a running gorge-taskqueue: stats, ls, show, cancel, delay, "
        "retry, priority, free, flood, dead ls/requeue, migrate (gorge queue --help)",
    )
    commands.add_parser(
        "webhook",
        add_help=False,
        help="the delivery log of a running gorge-webhook: stats, ls, show, retry, hooks "
        "(gorge webhook --help)",
    )
    commands.add_parser(
        "doctor",
        add_help=False,
        help="check a switched-over Phorge and the gorge daemons against docs/phorge.md, "
        "with canaries (gorge doctor --help)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["queue"]:
        from gorge.cli.queue import main as queue_main

        raise SystemExit(queue_main(argv[1:]))
    if argv[:1] == ["webhook"]:
        from gorge.cli.webhook import main as webhook_main

        raise SystemExit(webhook_main(argv[1:]))
    if argv[:1] == ["doctor"]:
        from gorge.cli.doctor import main as doctor_main

        raise SystemExit(doctor_main(argv[1:]))
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from gorge.demo import DemoOptions
        from gorge.demo import main as demo_main

        demo_main(DemoOptions(serve=args.serve, timeout=args.timeout, workdir=args.workdir))


if __name__ == "__main__":
    main()
