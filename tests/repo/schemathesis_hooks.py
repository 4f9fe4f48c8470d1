"""What the schemathesis run against the daemons (tests/repo/test_openapi.py)
is told beyond the documents, loaded through SCHEMATHESIS_HOOKS.

Two rules of gorge-taskqueue's API tie one parameter to another, which
OpenAPI cannot say: the ``X-Lease-Owner`` header and the ``leaseOwner`` body
field, both given, must name the same owner (else 400: a client bug worth
naming rather than guessing which one it meant), and a lease call with
``wait`` is held up to that many seconds while nothing is runnable. The
first is kept by making a request that gives both valid owners give the same
one; the second by holding a lease call at most a second, so the run stays
bounded in time with no limit on answer times (a long-poll is meant to take
its while). Invalid values are left as generated: they must still be refused.
"""

from __future__ import annotations

from typing import Any

import schemathesis

OWNER_HEADER = "X-Lease-Owner"
MAX_OWNER_CHARS = 64
LONGEST_WAIT = 1.0


def _valid_owner(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_OWNER_CHARS


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
    if not case.path.startswith("/api/queue/") or not isinstance(case.body, dict):
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
