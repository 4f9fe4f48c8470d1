"""The ``/api/queue`` request parsers: a JSON body's fields, the query
string and the path, checked against the columns' limits; a malformed field
is a 400 (ApiError) naming it."""

from __future__ import annotations

import re
from typing import Any

from gorge.taskqueue.model import (
    DEFAULT_LIST_LIMIT,
    MAX_FOLLOWUPS,
    MAX_LEASE_LIMIT,
    MAX_LIST_LIMIT,
    MAX_OWNER_CHARS,
    MAX_PHID_BYTES,
    MAX_TASK_CLASS_CHARS,
    PRIORITY_DEFAULT,
    REPORT_COMPLETE,
    REPORT_FAIL,
    REPORT_OUTCOMES,
    RESULT_NAMES,
    UINT32_MAX,
    EnqueueRequest,
    Followup,
    Report,
)
from gorge.taskqueue.wakeup import MAX_WAIT
from gorge.web.envelope import ApiError, json_integer

INT64_MAX = 2**63 - 1
MISSING = object()


def bad_request(message: str) -> ApiError:
    return ApiError(400, "ERR_BAD_REQUEST", message)


def not_found() -> ApiError:
    return ApiError(404, "ERR_NOT_FOUND", "task not found")


def int_list(value: Any) -> list[int] | None:
    """A JSON list of integers (``7.0`` counts, ``true`` does not), or None."""
    if not isinstance(value, list):
        return None
    numbers = [json_integer(item) for item in value]
    if any(number is None for number in numbers):
        return None
    return [number for number in numbers if number is not None]


def field(body: dict, key: str) -> Any:
    value = body.get(key, MISSING)
    return MISSING if value is None else value


def int_field(
    body: dict, key: str, default: Any, *, minimum: int | None = 0, maximum: int = UINT32_MAX
) -> Any:
    value = field(body, key)
    if value is MISSING:
        return default
    value = json_integer(value)
    if value is None:
        raise bad_request(f"{key} must be an integer")
    if minimum is not None and value < minimum:
        raise bad_request(f"{key} must be >= {minimum}")
    if value > maximum:
        raise bad_request(f"{key} must be <= {maximum}")
    return value


def str_field(body: dict, key: str, default: Any) -> Any:
    value = field(body, key)
    if value is MISSING:
        return default
    if not isinstance(value, str):
        raise bad_request(f"{key} must be a string")
    return value


def task_id_field(body: dict) -> int:
    value = field(body, "taskID")
    if value is MISSING:
        raise bad_request("taskID is required")
    value = json_integer(value)
    if value is None:
        raise bad_request("taskID must be an integer")
    if value <= 0:
        raise bad_request("taskID is required")
    if value > INT64_MAX:
        raise bad_request("invalid task ID")
    return value


def id_list(body: dict, key: str, maximum: int = MAX_LEASE_LIMIT) -> list[int]:
    """A required, non-empty list of at most ``maximum`` integer task ids."""
    ids = field(body, key)
    if ids is MISSING or ids == []:
        raise bad_request(f"{key} is required")
    numbers = int_list(ids)
    if numbers is None:
        raise bad_request(f"{key} must be a list of integers")
    if len(numbers) > maximum:
        raise bad_request(f"{key} must have at most {maximum} ids")
    return numbers


def phid_field(body: dict, key: str) -> str | None:
    value = str_field(body, key, "")
    # The column is VARBINARY(64). A PHID is ASCII, so the limit is one a
    # document can state exactly (characters, not bytes of some encoding).
    if not value.isascii():
        raise bad_request(f"{key} must be ASCII (a PHID)")
    if len(value) > MAX_PHID_BYTES:
        raise bad_request(f"{key} must be at most {MAX_PHID_BYTES} characters")
    return value or None


def parse_enqueue(body: dict) -> EnqueueRequest:
    task_class = str_field(body, "taskClass", "")
    if task_class == "":
        raise bad_request("taskClass is required")
    if len(task_class) > MAX_TASK_CLASS_CHARS:
        raise bad_request(f"taskClass must be at most {MAX_TASK_CLASS_CHARS} characters")
    data = str_field(body, "data", "")
    priority = int_field(body, "priority", PRIORITY_DEFAULT)
    object_phid = phid_field(body, "objectPHID")
    container_phid = phid_field(body, "containerPHID")
    delay = int_field(body, "delayUntil", 0)
    return EnqueueRequest(
        task_class=task_class,
        data=data,
        priority=priority,
        object_phid=object_phid,
        container_phid=container_phid,
        delay_until=delay if delay > 0 else None,
    )


def parse_followups(body: dict) -> tuple[Followup, ...]:
    """A success report's follow-up tasks (docs/taskqueue.md, Follow-up
    tasks): each entry validated exactly as an enqueue, a bad one answered
    with its index, so nothing is archived for a list that cannot be stored."""
    items = field(body, "followups")
    if items is MISSING:
        return ()
    if not isinstance(items, list):
        raise bad_request("followups must be a list of objects")
    if len(items) > MAX_FOLLOWUPS:
        raise bad_request(f"followups must have at most {MAX_FOLLOWUPS} entries, got {len(items)}")
    followups = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise bad_request(f"followups[{index}] must be an object")
        try:
            request = parse_enqueue(item)
        except ApiError as e:
            raise bad_request(f"followups[{index}]: {e.message}") from None
        # No priority (or null): the parent's, which only the store reads.
        inherits = field(item, "priority") is MISSING
        followups.append(Followup(request, inherits_priority=inherits))
    return tuple(followups)


def permanent_field(body: dict) -> bool:
    permanent = field(body, "permanent")
    if permanent is MISSING:
        return False
    if not isinstance(permanent, bool):
        raise bad_request("permanent must be a boolean")
    return permanent


def parse_report(item: Any, retry_wait: int) -> Report:
    """One entry of a batched report: the fields its single call takes."""
    if not isinstance(item, dict):
        raise bad_request("each report must be an object")
    task_id = task_id_field(item)
    outcome = field(item, "outcome")
    if outcome not in REPORT_OUTCOMES:
        raise bad_request("outcome must be one of " + ", ".join(REPORT_OUTCOMES))
    if outcome == REPORT_COMPLETE:
        duration = int_field(item, "duration", 0, maximum=INT64_MAX)
        return Report(task_id, outcome, duration=duration, followups=parse_followups(item))
    if outcome == REPORT_FAIL:
        permanent = permanent_field(item)
        wait = int_field(item, "retryWait", retry_wait)
        message = str_field(item, "message", "")
        return Report(task_id, outcome, permanent=permanent, retry_wait=wait, message=message)
    return Report(task_id, outcome, duration=int_field(item, "duration", 0, minimum=None))


def parse_wait(body: dict) -> float:
    """Seconds a lease call may be held while nothing is runnable (0: answer at once)."""
    value = field(body, "wait")
    if value is MISSING:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request("wait must be a number of seconds")
    if not 0 <= value <= MAX_WAIT:
        raise bad_request(f"wait must be between 0 and {MAX_WAIT} seconds")
    return float(value)


def parse_task_classes(body: dict) -> list[str] | None:
    value = field(body, "taskClasses")
    if value is MISSING:
        return None
    if not isinstance(value, list):
        raise bad_request("taskClasses must be a list of strings")
    for item in value:
        if not isinstance(item, str):
            raise bad_request("taskClasses must be a list of strings")
    return value or None


def header_text(request, name: bytes) -> str:
    raw = request.getHeader(name)
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else (raw or "")


def fence_owner(request, body: dict) -> str | None:
    """The lease owner a result report is fenced by, or None (unfenced, r4).

    Given as the ``X-Lease-Owner`` header (as on lease) or the ``leaseOwner``
    body field; empty counts as absent.  Both given and different is a
    client bug worth a 400 rather than a guess.
    """
    header = header_text(request, b"x-lease-owner")
    field = str_field(body, "leaseOwner", "")
    if header and field and header != field:
        raise bad_request("leaseOwner and X-Lease-Owner name different owners")
    owner = field or header
    if len(owner) > MAX_OWNER_CHARS:
        raise bad_request(f"leaseOwner must be at most {MAX_OWNER_CHARS} characters")
    return owner or None


_DECIMAL = re.compile(rb"[+-]?[0-9]+")


def query_int(request, name: bytes) -> int | None:
    """An optional sign and ASCII digits, as the reference's Atoi reads them;
    anything else (``1_0``, surrounding spaces) is unparsable."""
    values = request.args.get(name)
    if not values or not _DECIMAL.fullmatch(values[0]):
        return None
    return int(values[0], 10)


# Result names and Phorge's numbers alike.
RESULT_FILTERS = {**RESULT_NAMES, **{str(v): v for v in RESULT_NAMES.values()}}


def query_text(request, name: bytes) -> str | None:
    values = request.args.get(name)
    if not values:
        return None
    try:
        return values[0].decode("utf-8")
    except UnicodeDecodeError:
        raise bad_request(f"{name.decode()} must be UTF-8") from None


def query_task_ids(request, name: bytes) -> frozenset[int] | None:
    """Task ids in decimal separated by commas (no signs, spaces or empty
    parts; 400 otherwise), or None when the parameter is absent or empty."""
    text = query_text(request, name)
    if not text:
        return None
    parts = text.split(",")
    if not all(part.isascii() and part.isdigit() for part in parts):
        raise bad_request(f"{name.decode()} must be task ids separated by commas")
    return frozenset(int(part) for part in parts)


def query_flag(request, name: bytes) -> bool | None:
    """``true`` or ``false``, or None when absent or empty; 400 otherwise."""
    text = query_text(request, name)
    if text not in (None, "", "true", "false"):
        raise bad_request(f"{name.decode()} must be true or false")
    return None if not text else text == "true"


def page(request) -> tuple[int, int]:
    """``limit`` (absent/unparsable/<= 0: 100, at most 1000) and ``offset``
    (absent/unparsable/negative: 0) of a list endpoint."""
    limit = query_int(request, b"limit")
    if limit is None or limit <= 0:
        limit = DEFAULT_LIST_LIMIT
    limit = min(limit, MAX_LIST_LIMIT)
    offset = query_int(request, b"offset")
    offset = 0 if offset is None or offset < 0 else min(offset, INT64_MAX)
    return limit, offset


def path_id(text: str) -> int:
    """A task id in a path: base-10 64-bit with an optional sign, as the
    reference's ParseInt reads it (400 otherwise); ids no column can hold are
    simply not found."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not (digits.isascii() and digits.isdigit()):
        raise bad_request("invalid task ID")
    parsed = int(text, 10)
    if not -(2**63) <= parsed <= INT64_MAX:
        raise bad_request("invalid task ID")
    if not 0 < parsed <= UINT32_MAX:
        raise not_found()
    return parsed


def entry_owner(item: Any, default: str | None) -> str | None:
    """The lease owner one entry of a batched call is fenced by: its own
    ``leaseOwner`` when it names one (a worker fences per lease, and one batch
    carries tasks of several leases), else the call's."""
    if not isinstance(item, dict):
        return default
    owner = str_field(item, "leaseOwner", "")
    if len(owner) > MAX_OWNER_CHARS:
        raise bad_request(f"leaseOwner must be at most {MAX_OWNER_CHARS} characters")
    return owner or default


def lease_seconds_field(body: dict, limit: int) -> int:
    """The lease a lease call asks for (``leaseDuration``), capped by the
    queue's own: a worker that renews often asks for a short one, so its
    tasks are leasable again soon after it dies; a caller that does not ask
    gets the queue's."""
    value = field(body, "leaseDuration")
    if value is MISSING:
        return limit
    seconds = json_integer(value)
    if seconds is None or seconds < 1:
        raise bad_request("leaseDuration must be a positive integer (seconds)")
    return min(seconds, limit)


def parse_leases(body: dict, default: str | None) -> list[tuple[int, str | None]]:
    """Renew's ``leases`` (each ``{"taskID", "leaseOwner"}``, the owner
    defaulting to the call's) or, without it, ``taskIDs`` under the call's
    owner: the (id, owner) pairs to renew, in order."""
    leases = field(body, "leases")
    if leases is MISSING:
        return [(task_id, default) for task_id in id_list(body, "taskIDs")]
    if not isinstance(leases, list) or leases == []:
        raise bad_request("leases must be a non-empty list of {taskID, leaseOwner} objects")
    if len(leases) > MAX_LEASE_LIMIT:
        raise bad_request(f"leases must have at most {MAX_LEASE_LIMIT} entries")
    pairs: list[tuple[int, str | None]] = []
    for item in leases:
        task_id = json_integer(item.get("taskID")) if isinstance(item, dict) else None
        if task_id is None:
            raise bad_request("each lease must be an object with an integer taskID")
        pairs.append((task_id, entry_owner(item, default)))
    return pairs
