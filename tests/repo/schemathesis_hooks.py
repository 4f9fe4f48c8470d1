"""What the schemathesis run against the daemons (tests/repo/test_openapi.py)
is told beyond the documents, loaded through SCHEMATHESIS_HOOKS.

Some rules tie one parameter to another, which OpenAPI cannot say:

* gorge-taskqueue: the ``X-Lease-Owner`` header and the ``leaseOwner`` body
  field, both given, must name the same owner (else 400: a client bug worth
  naming rather than guessing which one it meant). A request that gives two
  valid owners is made to give the same one.
* gorge-webhook: a range replay's ``until`` must be above its ``since``
  (else 400: the range is backwards). A request with two valid bounds in
  the wrong order is made to ask for one second.

And a lease call with ``wait`` is held up to that many seconds while nothing
is runnable: it is held at most a second here, so the run stays bounded in
time with no limit on answer times (a long-poll is meant to take its while).

Invalid values are left as generated: they must still be refused.
"""

from __future__ import annotations

from typing import Any

import schemathesis

OWNER_HEADER = "X-Lease-Owner"
MAX_OWNER_CHARS = 64
LONGEST_WAIT = 1.0
MAX_ID = 4294967295


def _valid_owner(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_OWNER_CHARS


def _second(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and float(value).is_integer()
        and 0 <= value <= MAX_ID
    )


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    if not isinstance(case.body, dict):
        return
    if case.path == "/api/webhook/requests/retry":
        since, until = case.body.get("since"), case.body.get("until")
        if _second(since) and _second(until) and until <= since:
            case.body["until"] = int(since) + 1
        return
    if not case.path.startswith("/api/queue/"):
        return
    headers = case.headers or {}
    header = next((v for k, v in headers.items() if k.lower() == OWNER_HEADER.lower()), None)
    owner = case.body.get("leaseOwner")
    if isinstance(header, str) and _valid_owner(owner):
        # What the queue reads: the field's bytes (sent as Latin-1) as UTF-8,
        # without the whitespace HTTP strips around a field value.
        read = header.encode("latin-1", "replace").decode("utf-8", "replace").strip()
        if _valid_owner(read) and read != owner:
            case.body["leaseOwner"] = read
    wait = case.body.get("wait")
    if (
        case.path == "/api/queue/lease"
        and isinstance(wait, (int, float))
        and not isinstance(wait, bool)
        and LONGEST_WAIT < wait <= 30
    ):
        case.body["wait"] = LONGEST_WAIT
