"""``gorge queue``: inspect and steer a running gorge-taskqueue over its HTTP API.

The verbs mean what Phorge's ``bin/worker`` verbs mean (cancel, delay, retry,
priority, free, flood), plus ``stats``, ``ls``, ``show``, ``dead ls``,
``dead requeue`` and ``migrate`` (which talks to the backends themselves).
Human output by default, ``--json`` for scripts.

Exit status: 0 done; 1 a task was not found or in the wrong state (one line
per task on stderr, the other tasks are still handled); 2 bad usage;
3 the queue could not be used (unreachable, token refused, server error)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from gorge.cli.apiclient import ApiClient, Refused
from gorge.cli.command import (
    EXIT_USAGE,
    OneLineParser,
    common_options,
    parse_when,
    standard_streams,
)
from gorge.cli.command import Command as BaseCommand
from gorge.cli.command import non_negative as _non_negative
from gorge.cli.command import print_table as _table
from gorge.cli.command import seconds as _seconds
from gorge.cli.command import utc_time as _when
from gorge.cli.command import wrap as _wrap

__all__ = ["main", "parse_when", "task_state"]

PROG = "gorge queue"
DEFAULT_URL = "http://127.0.0.1:8090"
FLOOD_CLASS = "PhabricatorTestWorker"

EPILOG = """\
exit status: 0 done; 1 a task was not found or in the wrong state (the others
are still handled); 2 bad usage; 3 the queue could not be used (unreachable,
service token refused, server error).

The queue is GORGE_TASKQUEUE_URL (default http://127.0.0.1:8090) and the token
GORGE_SERVICE_TOKEN, unless --url / --token say otherwise.
"""


class UsageError(Exception):
    """Bad arguments found after parsing; exit 2 with one line."""


# -- argument types -------------------------------------------------------------


def task_id(text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text.strip()) or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"not a task id: {text!r}")
    return int(text)


# -- rendering ------------------------------------------------------------------


def task_state(task: Mapping[str, Any], now: float) -> str:
    """How an active task stands, in the words of docs/taskqueue.md."""
    owner, expires = task.get("leaseOwner"), task.get("leaseExpires")
    if owner is None:
        if expires is None:
            return "waiting"
        if expires >= now:
            return f"not before {_when(expires)}"
        return "waiting"
    if owner == "(yield)":
        return (
            f"yielded until {_when(expires)}"
            if expires is not None and expires >= now
            else "waiting (yield ended)"
        )
    if expires is not None and expires >= now:
        return f"leased by {owner} until {_when(expires)}"
    return f"lease of {owner} expired"


RESULTS = {0: "success", 1: "failure", 2: "cancelled"}


class Command(BaseCommand):
    """One run of ``gorge queue``."""

    prog = PROG

    @property
    def verb(self) -> str:
        if self.args.verb == "dead":
            return f"dead {self.args.dead_verb}"
        return str(self.args.verb)

    # -- reads --------------------------------------------------------------------

    def stats(self) -> None:
        data = self.http.get("stats")

        def human() -> None:
            waiting = data["activeCount"] - data["leasedCount"]
            self.out.write(
                f"active    {data['activeCount']}\n"
                f"leased    {data['leasedCount']}\n"
                f"waiting   {waiting}\n"
                f"failed    {data['failedCount']}  (active, failed before)\n"
                f"archived  {data['archivedCount']}\n"
            )
            # Older daemons answer the counts only.
            for row in data.get("oldestWaiting", []):
                self.out.write(
                    f"oldest    {row['ageSeconds']}s  {row['priorityBand']}  {row['taskClass']}\n"
                )

        self.emit(data, human)

    def ls(self) -> None:
        tasks = self.http.get("tasks", limit=self.args.limit, offset=self.args.offset)
        now = self.clock()

        def human() -> None:
            if not tasks:
                self.out.write("no active tasks\n")
                return
            rows = [["ID", "PRIORITY", "CLASS", "FAILURES", "STATE"]]
            rows += [
                [
                    str(t["id"]),
                    str(t["priority"]),
                    t["taskClass"],
                    str(t["failureCount"]),
                    task_state(t, now),
                ]
                for t in tasks
            ]
            _table(rows, self.out)

        self.emit(tasks, human)

    def show(self) -> None:
        where = "active"
        try:
            task = self.http.get(f"tasks/{self.args.id}")
        except Refused as e:
            if e.code != "ERR_NOT_FOUND":
                raise
            where = "archived"
            try:
                task = self.http.get(f"archived/{self.args.id}")
            except Refused as e:
                self.refused(f"task {self.args.id}", e.message)
                return
        now = self.clock()

        def human() -> None:
            if where == "active":
                self.out.write(f"task {task['id']}: active, {task_state(task, now)}\n")
            else:
                self.out.write(
                    f"task {task['id']}: archived, {RESULTS.get(task['result'], task['result'])}\n"
                )
            for key, value in task.items():
                if key in (
                    "leaseExpires",
                    "failureTime",
                    "dateCreated",
                    "dateModified",
                    "archivedEpoch",
                ):
                    value = f"{value}  ({_when(value)})"
                self.out.write(f"  {key}: {value}\n")

        self.emit({"state": where, "task": task}, human)

    # -- verbs on tasks -------------------------------------------------------------

    def _each(self, path: str, body: Callable[[int], dict], done: str) -> None:
        """The verb for each id in turn; a refused id does not stop the others."""
        results = []
        for tid in self.args.ids:
            try:
                task = self.http.post(path, body(tid))
            except Refused as e:
                self.refused(f"task {tid}", e.message)
                results.append({"taskID": tid, "ok": False, "code": e.code, "message": e.message})
                continue
            results.append({"taskID": tid, "ok": True, "task": task})
            if not self.args.json:
                self.out.write(f"task {tid} ({task['taskClass']}): {done}\n")
        if self.args.json:
            self.emit(results, lambda: None)

    def cancel(self) -> None:
        self._each("cancel", lambda tid: {"taskID": tid}, "cancelled")

    def delay(self) -> None:
        until = self.args.until
        self._each(
            "delay", lambda tid: {"taskID": tid, "until": until}, f"delayed until {_when(until)}"
        )

    def priority(self) -> None:
        value = self.args.priority
        self._each("priority", lambda tid: {"taskID": tid, "priority": value}, f"priority {value}")

    def free(self) -> None:
        self._each("free", lambda tid: {"taskID": tid}, "lease freed")

    def retry(self) -> None:
        repeat = self.args.repeat
        self._each("retry", lambda tid: {"taskID": tid, "repeat": repeat}, "queued for retry")

    def flood(self) -> None:
        count, queued = self.args.count, 0
        data = json.dumps({"duration": self.args.duration}, separators=(",", ":"))
        progress = not self.args.json and self.err.isatty()
        try:
            while count == 0 or queued < count:
                self.http.post("enqueue", {"taskClass": self.args.task_class, "data": data})
                queued += 1
                if progress and queued % 100 == 0:
                    self.err.write(".")
                    self.err.flush()
        except KeyboardInterrupt:
            pass
        finally:
            if progress and queued >= 100:
                self.err.write("\n")
            self.emit(
                {"queued": queued},
                lambda: self.out.write(f"queued {queued} {self.args.task_class} tasks\n"),
            )

    # -- dead tasks -----------------------------------------------------------------

    def dead_ls(self) -> None:
        rows = self.http.get(
            "archived",
            result=self.args.result,
            limit=self.args.limit,
            offset=self.args.offset,
            **{"class": self.args.task_class},
        )
        errors = self._last_errors([r["id"] for r in rows])
        for r in rows:
            r["lastError"] = errors.get(r["id"])

        def human() -> None:
            if not rows:
                self.out.write("no archived tasks match\n")
                return
            table = [["ID", "CLASS", "RESULT", "FAILURES", "PRIORITY", "ARCHIVED", "LAST ERROR"]]
            table += [
                [
                    str(r["id"]),
                    r["taskClass"],
                    RESULTS.get(r["result"], str(r["result"])),
                    str(r["failureCount"]),
                    str(r["priority"]),
                    _when(r.get("archivedEpoch")),
                    _cut(r["lastError"] or "-", 80),
                ]
                for r in rows
            ]
            _table(table, self.out)

        self.emit(rows, human)

    def _last_errors(self, task_ids: list[int]) -> dict[int, str]:
        """The error each task's last failure reported, as gorge-taskqueue
        keeps it (docs/taskqueue.md, Last errors); none from a taskqueue
        too old to keep them."""
        if not task_ids:
            return {}
        try:
            notes = self.http.get(
                "failures", taskIDs=",".join(map(str, task_ids)), limit=len(task_ids)
            )
        except Refused:
            return {}
        return {note["taskID"]: note["message"] for note in notes}

    def dead_requeue(self) -> None:
        answers = self.http.post("requeue", {"taskIDs": self.args.ids})
        for answer in answers:
            if answer["status"] == "requeued":
                if not self.args.json:
                    task = answer["task"]
                    self.out.write(
                        f"task {answer['taskID']} ({task['taskClass']}): "
                        f"requeued as task {task['id']}\n"
                    )
            else:
                self.refused(f"task {answer['taskID']}", answer.get("message", ""))
        if self.args.json:
            self.emit(answers, lambda: None)


# -- the parser -------------------------------------------------------------------


def _common(env: Mapping[str, str]) -> OneLineParser:
    return common_options(
        env,
        url_setting="GORGE_TASKQUEUE_URL",
        default_url=DEFAULT_URL,
        product="gorge-taskqueue",
        noun="the queue",
    )


def _ids(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("ids", type=task_id, nargs="*", metavar="ID", help=f"task ids {what}")
    parser.add_argument(
        "--id",
        type=task_id,
        action="append",
        dest="more_ids",
        default=[],
        metavar="ID",
        help="a task id, as bin/worker spells it (repeatable)",
    )


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    common = _common(env)
    parser = OneLineParser(
        prog=PROG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_wrap(
            "Inspect and steer a running gorge-taskqueue: Phorge's bin/worker "
            "verbs over the queue's HTTP API, dead tasks, and moving tasks "
            "between backends."
        ),
        epilog=EPILOG,
    )
    verbs = parser.add_subparsers(
        dest="verb", required=True, metavar="VERB", parser_class=OneLineParser
    )

    def verb(name: str, help_text: str, description: str, *, parents=(common,)):
        return verbs.add_parser(
            name,
            help=help_text,
            description=_wrap(description),
            epilog=EPILOG,
            parents=list(parents),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    verb(
        "stats",
        "task counts",
        "Active, leased (held now, yields included), waiting (active minus leased), "
        "failed (active tasks that failed before) and archived task counts.",
    )
    ls = verb(
        "ls",
        "list active tasks in queue order",
        "Active tasks in the order they are leased (priority, then id), with their "
        "state: waiting, not before a time (delayed or backing off), leased by an "
        "owner until a time, yielded, or a lease that expired.",
    )
    ls.add_argument(
        "--limit",
        type=_non_negative,
        default=100,
        help="at most this many (default 100, the queue caps at 1000)",
    )
    ls.add_argument("--offset", type=_non_negative, default=0, help="skip this many first")
    show = verb(
        "show",
        "one task, active or archived",
        "Every field of one task, with its payload when it is active; an id that is "
        "not active is looked up in the archive.",
    )
    show.add_argument("id", type=task_id, metavar="ID")
    cancel = verb(
        "cancel",
        "cancel tasks: their work will never be performed",
        "Archive active tasks as cancelled (result 2), whoever holds them: the "
        "work they represent will never be performed. A worker still running one "
        "cannot report it any more. Archived tasks are refused.",
    )
    _ids(cancel, "to cancel")
    delay = verb(
        "delay",
        "delay tasks until a time",
        "Hold active tasks until the given time; they are not leased before it. "
        "A running or yielded task loses its lease, as with free: its worker stops "
        "it at the next heartbeat. Archived tasks are refused.",
    )
    _ids(delay, "to delay")
    delay.add_argument(
        "--until",
        required=True,
        metavar="WHEN",
        help="epoch seconds, now, +90s, +30m, +6h, +2d, or an ISO date or time "
        "such as 2026-09-08T12:30 (local time unless an offset is given)",
    )
    retry = verb(
        "retry",
        "queue archived failures and cancels again under their own id",
        "Move archived tasks that failed permanently or were cancelled back into the "
        "active queue under the same id and payload, with no failures counted; the "
        "archive row is removed. Tasks that succeeded are refused unless --repeat. "
        "Active tasks are refused. (dead requeue instead keeps the archive row and "
        "makes a new task.)",
    )
    _ids(retry, "to retry")
    retry.add_argument(
        "--repeat", action="store_true", help="also repeat tasks that already succeeded"
    )
    priority = verb(
        "priority",
        "change the priority of tasks",
        "Give active tasks a new priority: smaller values run first (1000 alerts, "
        "2000 default, 2500 commit, 3000 bulk, 3500 index, 4000 import). Archived "
        "tasks are refused.",
    )
    _ids(priority, "to reprioritize")
    priority.add_argument(
        "--priority", type=_non_negative, required=True, metavar="N", help="the new priority"
    )
    free = verb(
        "free",
        "break the lease on tasks",
        "Free the lease on active tasks so another worker can lease them from the next "
        "second. If the worker holding the lease is still running the task, it may run "
        "twice; gorge-worker notices at its next renewal or report and stops. Tasks "
        "without a lease and archived tasks are refused.",
    )
    _ids(free, "to free")
    flood = verb(
        "flood",
        "fill the queue with test tasks",
        "Enqueue PhabricatorTestWorker tasks, for development and load tests: until "
        "interrupted (^C), like bin/worker flood, or --count of them. A worker runs "
        "them only with GORGE_WORKER_NATIVE_TEST_WORKER=1 or through PHP.",
    )
    flood.add_argument(
        "--count", type=_non_negative, default=0, help="how many (default 0: until interrupted)"
    )
    flood.add_argument(
        "--duration",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="wall time each task takes to run (default 0)",
    )
    flood.add_argument(
        "--class",
        dest="task_class",
        default=FLOOD_CLASS,
        help=f"task class (default {FLOOD_CLASS})",
    )

    dead = verbs.add_parser(
        "dead",
        help="list and requeue tasks archived as failures",
        description="Tasks archived as failures, newest first, and requeueing them as new tasks.",
    )
    dead_verbs = dead.add_subparsers(
        dest="dead_verb", required=True, metavar="VERB", parser_class=OneLineParser
    )
    dead_ls = dead_verbs.add_parser(
        "ls",
        parents=[common],
        help="archived failures, newest first",
        description=_wrap(
            "Archived tasks, newest first, with result, failure count and "
            "class; failures only unless --result says otherwise."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dead_ls.add_argument(
        "--result",
        choices=["failure", "cancelled", "success"],
        default="failure",
        help="which archived tasks (default failure)",
    )
    dead_ls.add_argument(
        "--all-results",
        dest="result",
        action="store_const",
        const=None,
        help="every archived task, whatever its result",
    )
    dead_ls.add_argument("--class", dest="task_class", default=None, help="only this class")
    dead_ls.add_argument(
        "--limit",
        type=_non_negative,
        default=100,
        help="at most this many (default 100, the queue caps at 1000)",
    )
    dead_ls.add_argument("--offset", type=_non_negative, default=0, help="skip this many first")
    requeue = dead_verbs.add_parser(
        "requeue",
        parents=[common],
        help="queue archived failures again as new tasks",
        description=_wrap(
            "Make a new active task from each archived failure or cancel: same "
            "class, payload, priority and PHIDs, no failures counted, a new id. "
            "The archive row stays as history, so requeueing twice runs the "
            "work twice. Tasks that succeeded and active tasks are refused."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _ids(requeue, "to requeue")

    from gorge.taskqueue.migrate import add_migrate_parser

    add_migrate_parser(verbs, wrap=_wrap)
    return parser


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
    if args.verb == "migrate":
        from gorge.taskqueue.migrate import run_migrate

        return run_migrate(args, env, out, err)
    if hasattr(args, "more_ids"):
        args.ids = list(dict.fromkeys([*args.ids, *args.more_ids]))
        if not args.ids:
            err.write(f"{PROG} {args.verb}: name at least one task id\n")
            return EXIT_USAGE
    if getattr(args, "until", None) is not None:
        try:
            args.until = parse_when(args.until, clock())
        except argparse.ArgumentTypeError as e:
            err.write(f"{PROG} {args.verb}: argument --until: {e}\n")
            return EXIT_USAGE
    http = ApiClient(
        args.url,
        "/api/queue/",
        noun="the queue",
        product="gorge-taskqueue",
        token=args.token,
        timeout=args.timeout,
    )
    return Command(args, http, out, err, clock).run()


def _cut(text: str, width: int) -> str:
    """One line of at most ``width`` characters for a table cell."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"
