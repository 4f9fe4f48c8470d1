"""``gorge webhook``: the delivery log of a running gorge-webhook, over its HTTP API.

``stats``, ``ls``, ``show``, ``retry`` (one request, or a hook's requests in a
time range) and ``hooks`` (each hook with its breaker and backlog). Human
output by default, ``--json`` for scripts.

Exit status: 0 done; 1 a request was not found or could not be retried (one
line per request on stderr, the others are still handled); 2 bad usage;
3 the daemon could not be used (unreachable, token refused, server error)."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from gorge.cli.apiclient import ApiClient, Refused
from gorge.cli.command import (
    EXIT_USAGE,
    OneLineParser,
    common_options,
    non_negative,
    parse_when,
    print_table,
    standard_streams,
    utc_time,
    wrap,
)
from gorge.cli.command import Command as BaseCommand

PROG = "gorge webhook"
DEFAULT_URL = "http://127.0.0.1:8160"
PAGES = 10  # listing calls per ls at most (each reads at most 10,000 ids)

EPILOG = """\
exit status: 0 done; 1 a request was not found or could not be retried (the
others are still handled); 2 bad usage; 3 gorge-webhook could not be used
(unreachable, service token refused, server error).

gorge-webhook is GORGE_WEBHOOK_URL (default http://127.0.0.1:8160) and the
token GORGE_SERVICE_TOKEN, unless --url / --token say otherwise.
"""

_REQUEST = re.compile(r"[0-9]+|PHID-HWBR-[A-Za-z0-9]+", re.ASCII)
_HOOK = re.compile(r"PHID-HWBH-[A-Za-z0-9]+", re.ASCII)


def request_ref(text: str) -> str:
    if not _REQUEST.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(f"not a request id or PHID-HWBR-... PHID: {text!r}")
    return text.strip()


def hook_phid(text: str) -> str:
    if not _HOOK.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(f"not a hook PHID (PHID-HWBH-...): {text!r}")
    return text.strip()


def _error(item: Mapping[str, Any]) -> str:
    if item.get("errorType") is None:
        return "-"
    return f"{item['errorType']}/{item['errorCode']}"


def _attempt(item: Mapping[str, Any]) -> str:
    return utc_time(item["lastRequestEpoch"]) if item["lastRequestEpoch"] else "-"


def _stats_text(data: dict) -> str:
    """The answering replica's figures, the site's beside them (a daemon
    older than the site figures answers without them)."""
    site = data.get("site")
    if not isinstance(site, dict):
        return (
            f"queued  {data['queuedCount']}\n"
            f"sent    {data['sentCount']}\n"
            f"failed  {data['failedCount']}\n"
            f"hooks   {data['activeWebhooks']} not disabled\n"
        )
    rows = [
        ("", "REPLICA", "SITE"),
        ("queued", data["queuedCount"], site["queuedCount"]),
        ("sent", data["sentCount"], site["sentCount"]),
        ("failed", data["failedCount"], site["failedCount"]),
        ("hooks", data["activeWebhooks"], site["activeWebhooks"]),
    ]
    lines = [f"{name:<8}{str(mine):<9}{theirs}".rstrip() for name, mine, theirs in rows]
    lines.append(f"(hooks: not disabled; site counted {site['ageSeconds']:g} s ago)")
    return "\n".join(lines) + "\n"


class Command(BaseCommand):
    """One run of ``gorge webhook``."""

    prog = PROG

    def stats(self) -> None:
        data = self.http.get("stats")
        self.emit(data, lambda: self.out.write(_stats_text(data)))

    def ls(self) -> None:
        args = self.args
        found: list[dict] = []
        cursor = args.cursor
        for _ in range(PAGES):
            page = self.http.get(
                "requests",
                hook=args.hook,
                status=args.status,
                result=args.result,
                since=args.since,
                cursor=cursor,
                limit=args.limit - len(found),
            )
            found += page["requests"]
            cursor = page["nextCursor"]
            if cursor is None or len(found) >= args.limit:
                break

        def human() -> None:
            if found:
                rows = [
                    ["ID", "STATUS", "RESULT", "ERROR", "LAST ATTEMPT", "RETRY", "HOOK", "CREATED"]
                ]
                rows += [
                    [
                        str(r["id"]),
                        r["status"],
                        r["lastRequestResult"],
                        _error(r),
                        _attempt(r),
                        r["retry"],
                        r["hookPHID"],
                        utc_time(r["dateCreated"]),
                    ]
                    for r in found
                ]
                print_table(rows, self.out)
            else:
                self.out.write("no requests match\n")
            if cursor is not None:
                self.out.write(f"older requests may match: add --cursor {cursor}\n")

        self.emit({"requests": found, "nextCursor": cursor}, human)

    def show(self) -> None:
        try:
            item = self.http.get(f"requests/{self.args.request}")
        except Refused as e:
            self.refused(f"request {self.args.request}", e.message)
            return

        def human() -> None:
            self.out.write(
                f"request {item['id']}: {item['status']}, last result "
                f"{item['lastRequestResult']}, error {_error(item)}\n"
            )
            for key, value in item.items():
                if key in ("dateCreated", "dateModified", "heldUntil") and value:
                    value = f"{value}  ({utc_time(value)})"
                elif key == "lastRequestEpoch" and value:
                    value = f"{value}  ({utc_time(value)})"
                elif isinstance(value, list):
                    value = ", ".join(value) or "-"
                self.out.write(f"  {key}: {value}\n")

        self.emit(item, human)

    def retry(self) -> None:
        if self.args.hook is not None:
            self._retry_range()
            return
        results = []
        for ref in self.args.requests:
            try:
                item = self.http.post(f"requests/{ref}/retry", None)
            except Refused as e:
                self.refused(f"request {ref}", e.message)
                results.append({"request": ref, "ok": False, "code": e.code, "message": e.message})
                continue
            results.append({"request": ref, "ok": True, "data": item})
            if not self.args.json:
                self.out.write(f"request {item['id']} ({item['phid']}): queued again\n")
        if self.args.json:
            self.emit(results, lambda: None)

    def _retry_range(self) -> None:
        args = self.args
        body: dict[str, Any] = {
            "hookPHID": args.hook,
            "since": args.since,
            "status": args.retry_status,
        }
        if args.until is not None:
            body["until"] = args.until
        retried: list[dict] = []
        skipped: list[dict] = []
        after = 0
        while True:
            answer = self.http.post("requests/retry", {**body, "afterId": after})
            retried += answer["retried"]
            skipped += answer["skipped"]
            if answer["nextAfterId"] is None:
                break
            after = answer["nextAfterId"]
        for item in skipped:
            self.refused(f"request {item['id']}", "changed while it was retried; retry it alone")

        def human() -> None:
            until = utc_time(args.until) if args.until is not None else "now"
            self.out.write(
                f"queued {len(retried)} requests of {args.hook} again (created "
                f"{utc_time(args.since)} to {until}, {args.retry_status})\n"
            )

        self.emit({"retried": retried, "skipped": skipped}, human)

    def hooks(self) -> None:
        data = self.http.get("hooks/state")

        def human() -> None:
            if not data["hooks"]:
                self.out.write("no hooks\n")
                return
            rows = [["PHID", "NAME", "STATUS", "BREAKER", "FAILURES", "QUEUED"]]
            rows += [
                [
                    h["phid"],
                    h["name"],
                    h["status"],
                    h["breaker"],
                    f"{h['failures']}/{data['threshold']} in {data['window']}s",
                    str(h["queued"]),
                ]
                for h in data["hooks"]
            ]
            print_table(rows, self.out)

        self.emit(data, human)


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    common = common_options(
        env,
        url_setting="GORGE_WEBHOOK_URL",
        default_url=DEFAULT_URL,
        product="gorge-webhook",
        noun="gorge-webhook",
    )
    parser = OneLineParser(
        prog=PROG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=wrap(
            "The delivery log of a running gorge-webhook: list and show Herald "
            "webhook requests, put them back in the queue, see each hook's "
            "breaker and backlog."
        ),
        epilog=EPILOG,
    )
    verbs = parser.add_subparsers(
        dest="verb", required=True, metavar="VERB", parser_class=OneLineParser
    )

    def verb(name: str, help_text: str, description: str):
        return verbs.add_parser(
            name,
            help=help_text,
            description=wrap(description),
            epilog=EPILOG,
            parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    verb(
        "stats",
        "request counts",
        "Queued, sent and failed requests as this replica knows "
        "them, and the hooks that are not disabled.",
    )
    ls = verb(
        "ls",
        "list requests, newest first",
        "Requests newest first with their status, last result and error, the time of "
        "the last attempt, the retry mode and the hook. When older requests may match "
        "and were not read, the last line says which --cursor goes on.",
    )
    ls.add_argument("--hook", type=hook_phid, metavar="PHID", help="only this hook's requests")
    ls.add_argument("--status", choices=["queued", "sent", "failed"])
    ls.add_argument(
        "--result",
        choices=["none", "okay", "fail"],
        help="last result: none (no attempt), okay, fail",
    )
    ls.add_argument(
        "--since",
        metavar="WHEN",
        help="only requests created at or after: epoch seconds, now, -30m, -2h, "
        "-7d, or an ISO date or time such as 2026-09-08T12:30",
    )
    ls.add_argument(
        "--limit", type=non_negative, default=50, help="at most this many (1-1000, default 50)"
    )
    ls.add_argument(
        "--cursor",
        type=non_negative,
        metavar="ID",
        help="only requests with a lower id (from a previous ls)",
    )
    show = verb(
        "show",
        "one request",
        "Every field of one request: status, last result and "
        "error, retry mode, flags, triggers and transactions as the body lists them, "
        "and a Retry-After hold if this replica has one.",
    )
    show.add_argument(
        "request", type=request_ref, metavar="REQUEST", help="request id or PHID-HWBR-... PHID"
    )
    retry = verb(
        "retry",
        "put sent or failed requests back in the queue",
        "Put sent or failed requests back in the queue: they are delivered again "
        "once, with the same body and signature. Either name requests, or give "
        "--hook and --since (and --until) for a hook's requests created in that "
        "time; those are the failed ones unless --status says otherwise. Queued "
        "requests are refused (they will be delivered anyway).",
    )
    retry.add_argument(
        "requests",
        type=request_ref,
        nargs="*",
        metavar="REQUEST",
        help="request ids or PHID-HWBR-... PHIDs",
    )
    retry.add_argument(
        "--hook",
        type=hook_phid,
        metavar="PHID",
        help="retry this hook's requests created between --since and --until",
    )
    retry.add_argument("--since", metavar="WHEN", help="with --hook: created at or after")
    retry.add_argument(
        "--until", metavar="WHEN", help="with --hook: created before (default: no bound)"
    )
    retry.add_argument(
        "--status",
        dest="retry_status",
        choices=["failed", "sent", "any"],
        default="failed",
        help="with --hook: which requests (default failed)",
    )
    verb(
        "hooks",
        "every hook with its breaker and backlog",
        "Each hook's name and status, its breaker (failed attempts within the window, "
        "open at the threshold) and the queued requests this replica knows of.",
    )
    return parser


def _check(args: argparse.Namespace, now: float) -> str | None:
    """Usage errors argparse cannot see; the message, or None."""
    for name in ("since", "until"):
        value = getattr(args, name, None)
        if value is not None:
            try:
                setattr(args, name, parse_when(value, now, past=True))
            except argparse.ArgumentTypeError as e:
                return f"argument --{name}: {e}"
    if args.verb == "ls" and not 1 <= args.limit <= 1000:
        return "argument --limit: must be between 1 and 1000"
    if args.verb == "retry":
        if args.hook is None:
            if not args.requests:
                return "name at least one request, or give --hook and --since"
            if args.since is not None or args.until is not None:
                return "--since and --until go with --hook"
        else:
            if args.requests:
                return "name requests or give --hook, not both"
            if args.since is None:
                return "--hook needs --since"
            if args.until is not None and args.until <= args.since:
                return "--until must be later than --since"
    return None


def main(
    argv: Sequence[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    clock: Callable[[], float] | None = None,
) -> int:
    env, out, err, clock = standard_streams(env, out, err, clock)
    args = build_parser(env).parse_args(sys.argv[1:] if argv is None else list(argv))
    problem = _check(args, clock())
    if problem is not None:
        err.write(f"{PROG} {args.verb}: {problem}\n")
        return EXIT_USAGE
    http = ApiClient(
        args.url,
        "/api/webhook/",
        noun="gorge-webhook",
        product="gorge-webhook",
        token=args.token,
        timeout=args.timeout,
    )
    return Command(args, http, out, err, clock).run()
