"""The Redis queue's Lua scripts (gorge/taskqueue/lua/), and what they answer.

Every change that touches more than one key runs as one script, so a
concurrent caller never sees half of it.  "now" is the server's clock
(``TIME``, sampled by the store: :class:`gorge.db.clock.RedisClock`),
passed to the scripts.

A script file names the shared parts (``lua/parts/``) it builds on in its
first line, ``--! parts: prelude helpers``; :func:`load_scripts` reads each
file once, puts its parts before it and the report rule's table in place of
``@REPORT_RULE@``, and registers the result as a
:class:`gorge.db.redis.LuaScript`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from importlib import resources
from typing import Any

from gorge.db.redis import LuaScript
from gorge.taskqueue.model import (
    ACTIVE_NOT_ARCHIVED,
    ARCHIVED_NOT_ACTIVE,
    NOT_LEASED,
    REPORT_FAIL,
    SUCCEEDED,
    InvalidArgument,
    Report,
    ReportResult,
    check_u32,
)
from gorge.taskqueue.redis_layout import children_of
from gorge.taskqueue.report_rule import verdict_table
from gorge.taskqueue.store import LeaseConflict, TaskNotFound, TaskStateError

# A script's answer for a fenced call whose owner no longer holds the task.
CONFLICT = "!conflict"
# A batched report's answer for a computed expiry out of range, and for an
# id that is not active (and no replay applies).
OUT_OF_RANGE = "!range"
NOT_FOUND = "!notfound"

_PARTS_LINE = "--! parts:"
_RULE_MARK = "@REPORT_RULE@"


@dataclass(frozen=True)
class RedisScripts:
    """One registered script per file of gorge/taskqueue/lua/, named after it."""

    enqueue: LuaScript
    lease: LuaScript
    give_back: LuaScript
    archive: LuaScript
    fail_temporary: LuaScript
    yield_task: LuaScript
    report: LuaScript
    awaken: LuaScript
    renew: LuaScript
    list_archived: LuaScript
    requeue: LuaScript
    delay: LuaScript
    set_priority: LuaScript
    free: LuaScript
    retry: LuaScript
    export_tasks: LuaScript
    import_tasks: LuaScript
    delete_tasks: LuaScript
    stats: LuaScript
    oldest_waiting: LuaScript
    wake_check: LuaScript
    list_tasks: LuaScript
    get_task: LuaScript


def script_names() -> list[str]:
    """The file names (without ``.lua``) of every script, in field order."""
    return [f.name for f in fields(RedisScripts)]


def script_source(name: str) -> str:
    """The full text of script ``name``: its parts, then its own file."""
    lua = resources.files(__package__).joinpath("lua")
    own = lua.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    first, _, rest = own.partition("\n")
    if not first.startswith(_PARTS_LINE):
        return own
    parts = [
        lua.joinpath("parts", f"{part}.lua").read_text(encoding="utf-8")
        for part in first[len(_PARTS_LINE) :].split()
    ]
    source = "".join(parts) + rest
    if _RULE_MARK in source:
        # The keys and verdicts are plain words: no quote to escape in Lua.
        source = source.replace(_RULE_MARK, json.dumps(verdict_table(), sort_keys=True))
    return source


def load_scripts() -> RedisScripts:
    """Every script, read and registered (not sent: the first run loads it)."""
    return RedisScripts(*(LuaScript(script_source(name)) for name in script_names()))


# What the operator scripts answer when the task is in the wrong state.
_STATE_REFUSALS = {
    "archived": ARCHIVED_NOT_ACTIVE,
    "not_leased": NOT_LEASED,
    "active": ACTIVE_NOT_ARCHIVED,
    "succeeded": SUCCEEDED,
}


def raise_refusal(task_id: int, reply: Any) -> None:
    """Raise what a script's nil or CONFLICT answer means."""
    if not reply:
        raise TaskNotFound(task_id)
    if reply == CONFLICT:
        raise LeaseConflict(task_id)


def raise_state_refusal(task_id: int, reply: Any) -> None:
    """Raise what an operator script's nil or wrong-state answer means."""
    if not reply:
        raise TaskNotFound(task_id)
    if reply in _STATE_REFUSALS:
        raise TaskStateError(task_id, _STATE_REFUSALS[reply])


def expiry_or_marker(expires: int) -> str:
    """A computed expiry as the report script takes it: OUT_OF_RANGE if it
    does not fit the column."""
    try:
        return str(check_u32("expires", expires))
    except InvalidArgument:
        return OUT_OF_RANGE


def report_result(report: Report, answer: Any, now: int) -> ReportResult:
    """One answer of the report script as the store's result."""
    task_id = report.task_id
    if isinstance(answer, list):
        task_class, priority, ids = answer
        children = children_of(report.followups, int(priority), ids, now)
        return ReportResult(task_id, task_class, None, children)
    if answer == NOT_FOUND:
        return ReportResult(task_id, error=TaskNotFound(task_id))
    if answer == CONFLICT:
        return ReportResult(task_id, error=LeaseConflict(task_id))
    if answer == OUT_OF_RANGE:
        field = "retryWait" if report.outcome == REPORT_FAIL else "duration"
        return ReportResult(task_id, error=InvalidArgument(field, f"{field} is too large"))
    return ReportResult(task_id, answer)
