"""Moving every active task from one backend to another (``gorge queue migrate``).

Per batch, in ascending source id order: the target takes the batch and, in
the same atomic step, records the highest source id it now holds (a ledger
named after the source); only then are the tasks removed from the source.
An interrupted run leaves at most one batch in both places, and the ledger
says which: running the command again removes those from the source without
copying them a second time, then carries on.  The ledger is forgotten once
the source is empty.  This relies on ids only growing in the source, which
holds while the queue is stopped (docs/taskqueue.md, Moving between backends).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from gorge.config import ConfigError
from gorge.taskqueue.model import YIELD_OWNER, Task
from gorge.taskqueue.settings import BACKENDS, load_taskqueue_settings
from gorge.taskqueue.store import TaskStore

DEFAULT_BATCH = 500
MAX_BATCH = 1000
# A batch is also cut at this many payload bytes, so one atomic import stays
# a reasonable size whatever the tasks carry.
MAX_BATCH_BYTES = 16 * 1024 * 1024
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def ledger_name(source: str) -> str:
    """Fits lisk_counter.counterName (32 characters)."""
    return f"gorge-migrate-from-{source}"


@dataclass
class Summary:
    source: str
    target: str
    total: int = 0  # active in the source when the run started
    moved: int = 0
    finished: int = 0  # already in the target from an interrupted run
    by_class: Counter = field(default_factory=Counter)
    held: int = 0  # leased right now: a queue still running?
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "from": self.source,
            "to": self.target,
            "total": self.total,
            "moved": self.moved,
            "alreadyInTarget": self.finished,
            "byClass": dict(sorted(self.by_class.items())),
            "leasedNow": self.held,
            "seconds": round(self.seconds, 3),
        }


Progress = Callable[[int, int], None]


def _batches(tasks: Sequence[Task], size: int) -> list[list[Task]]:
    out: list[list[Task]] = []
    current: list[Task] = []
    weight = 0
    for task in tasks:
        cost = len((task.data or "").encode("utf-8"))
        if current and (len(current) >= size or weight + cost > MAX_BATCH_BYTES):
            out.append(current)
            current, weight = [], 0
        current.append(task)
        weight += cost
    if current:
        out.append(current)
    return out


class Migration:
    """Moves the active tasks of ``source`` into ``target``; see the module doc."""

    def __init__(
        self,
        source: TaskStore,
        target: TaskStore,
        *,
        source_name: str,
        target_name: str,
        batch: int = DEFAULT_BATCH,
        now: Callable[[], float],
        progress: Progress = lambda done, total: None,
    ) -> None:
        self._source = source
        self._target = target
        self._ledger = ledger_name(source_name)
        self._batch = batch
        self._now = now
        self._progress = progress
        self.summary = Summary(source_name, target_name)

    async def run(self, *, dry_run: bool = False) -> Summary:
        started = self._now()
        summary = self.summary
        ids = await self._source.active_ids()
        mark = await self._target.migration_mark(self._ledger) or 0
        summary.total = len(ids)
        finished = [i for i in ids if i <= mark]
        pending = [i for i in ids if i > mark]
        now = int(self._now())
        if dry_run:
            for chunk in _chunks(pending, self._batch):
                for task in await self._source.export_tasks(chunk):
                    summary.by_class[task.task_class] += 1
                    summary.held += _running(task, now)
            summary.finished = len(finished)
            summary.seconds = self._now() - started
            return summary
        # What an interrupted run already copied only has to leave the source.
        for chunk in _chunks(finished, self._batch):
            tasks = await self._source.export_tasks(chunk)
            summary.finished += await self._source.delete_tasks(tasks)
            self._progress(summary.finished, summary.total)
        for chunk in _chunks(pending, self._batch):
            exported = await self._source.export_tasks(chunk)
            summary.held += sum(_running(task, now) for task in exported)
            for batch in _batches(exported, self._batch):
                await self._target.import_tasks(batch, self._ledger, batch[-1].id)
                await self._source.delete_tasks(batch)
                summary.moved += len(batch)
                summary.by_class.update(task.task_class for task in batch)
                self._progress(summary.finished + summary.moved, summary.total)
        await self._target.clear_migration_mark(self._ledger)
        summary.seconds = self._now() - started
        return summary


def _running(task: Task, now: int) -> bool:
    """Leased by a worker that may still be running it (a yield is not)."""
    return task.is_held(now) and task.lease_owner != YIELD_OWNER


def _chunks(ids: list[int], size: int) -> list[list[int]]:
    return [ids[start : start + size] for start in range(0, len(ids), size)]


# -- the command ------------------------------------------------------------------


def _batch_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 1 <= value <= MAX_BATCH:
        raise argparse.ArgumentTypeError(f"must be 1..{MAX_BATCH}: {text!r}")
    return value


EPILOG = """\
exit status: 0 done; 1 the run failed or was interrupted (run the same command
again to finish; nothing is lost or copied twice); 2 bad usage or a bad setting.
"""


def add_migrate_parser(verbs, *, wrap: Callable[[str], str]) -> argparse.ArgumentParser:
    parser = verbs.add_parser(
        "migrate",
        help="move every active task from one backend to another",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG,
        description=wrap(
            "Move every active task (class, payload, priority, PHIDs, failure count "
            "and time, delay or lease) from one backend's storage to another's, in "
            "batches, with the queue stopped: each batch is removed from the source "
            "only once the target holds it, and running the command again after an "
            "interruption finishes the job without copying anything twice. Tasks get "
            "new ids in the target; archived tasks stay where they are. Both "
            "backends' settings are read from the environment as gorge-taskqueue "
            "reads them (GORGE_TASKQUEUE_MYSQL_*, _NAMESPACE, _REDIS_*, "
            "_SQLITE_PATH). A progress bar is drawn on a terminal; a summary is "
            "printed at the end."
        ),
    )
    parser.add_argument(
        "--from",
        dest="source",
        choices=BACKENDS,
        required=True,
        help="the backend the tasks are in now",
    )
    parser.add_argument(
        "--to", dest="target", choices=BACKENDS, required=True, help="the backend to move them to"
    )
    parser.add_argument(
        "--batch",
        type=_batch_size,
        default=DEFAULT_BATCH,
        help=f"tasks per atomic step (1..{MAX_BATCH}, default {DEFAULT_BATCH})",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="count what would move, by class, and change nothing"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    return parser


def open_store(name: str, env: Mapping[str, str], reactor) -> TaskStore:
    """The backend ``name`` configured from ``env`` exactly as the daemon does."""
    from gorge.taskqueue.service import make_store

    settings = load_taskqueue_settings({**env, "GORGE_TASKQUEUE_BACKEND": name})
    return make_store(settings, reactor)


class ProgressBar:
    """``[#####.....] 5000/10000`` redrawn in place, only on a terminal."""

    WIDTH = 30

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._drawn = False

    def __call__(self, done: int, total: int) -> None:
        filled = self.WIDTH * done // total if total else self.WIDTH
        self._stream.write(f"\r[{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{total} tasks")
        self._stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self._stream.write("\n")
            self._stream.flush()


def _report(summary: Summary, dry_run: bool, as_json: bool, out: TextIO, err: TextIO) -> None:
    if summary.held:
        err.write(
            f"gorge queue migrate: warning: {summary.held} tasks are leased right now; "
            "is the queue stopped? their workers' reports will not find them\n"
        )
    if as_json:
        out.write(json.dumps({**summary.to_json(), "dryRun": dry_run}, indent=2) + "\n")
        return
    classes = ", ".join(f"{name} {count}" for name, count in sorted(summary.by_class.items()))
    if dry_run:
        out.write(
            f"would move {summary.total - summary.finished} tasks from {summary.source} "
            f"to {summary.target}" + (f" ({classes})" if classes else "") + "\n"
        )
        if summary.finished:
            out.write(
                f"{summary.finished} tasks are already in {summary.target} from an "
                f"interrupted run and would only be removed from {summary.source}\n"
            )
        return
    out.write(
        f"moved {summary.moved} tasks from {summary.source} to {summary.target} in "
        f"{summary.seconds:.1f}s" + (f" ({classes})" if classes else "") + "\n"
    )
    if summary.finished:
        out.write(
            f"finished an interrupted run: {summary.finished} tasks already in "
            f"{summary.target} were removed from {summary.source}\n"
        )


def run_migrate(args: argparse.Namespace, env: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    if args.source == args.target:
        err.write("gorge queue migrate: --from and --to must name different backends\n")
        return EXIT_USAGE
    from twisted.internet import reactor
    from twisted.internet.defer import Deferred

    try:
        source = open_store(args.source, env, reactor)
        target = open_store(args.target, env, reactor)
    except ConfigError as e:
        err.write(f"gorge queue migrate: {e}\n")
        return EXIT_USAGE
    bar = ProgressBar(err) if err.isatty() and not args.json else None
    migration = Migration(
        source,
        target,
        source_name=args.source,
        target_name=args.target,
        batch=args.batch,
        now=reactor.seconds,
        progress=bar if bar is not None else (lambda done, total: None),
    )
    outcome: dict[str, Any] = {}

    async def go() -> None:
        try:
            outcome["summary"] = await migration.run(dry_run=args.dry_run)
        except Exception as e:  # one line, whatever the backend raised
            outcome["error"] = f"{type(e).__name__}: {e}"
        finally:
            for store in (source, target):
                try:
                    await store.close()
                except Exception:
                    pass

    def interrupted() -> None:
        if "summary" not in outcome and "error" not in outcome:
            outcome["interrupted"] = True

    reactor.addSystemEventTrigger("before", "shutdown", interrupted)
    d = Deferred.fromCoroutine(go())
    d.addBoth(lambda _: reactor.stop())
    reactor.run()
    if bar is not None:
        bar.close()
    if "summary" in outcome:
        _report(outcome["summary"], args.dry_run, args.json, out, err)
        return EXIT_OK
    done = migration.summary.moved + migration.summary.finished
    reason = outcome.get("error", "interrupted")
    err.write(
        f"gorge queue migrate: {reason}; {done} of {migration.summary.total} tasks "
        f"moved so far; run the same command again to finish\n"
    )
    return EXIT_FAILED
