"""The ``test`` backend: accepts everything, delivers
nothing, and fails on demand. Contract fixtures and dispatcher tests use it.

State lives on the instance for the process lifetime and is shared by all
requests: ``attempts`` counts every call, ``accepted`` counts acceptances
(``messageId`` is ``test-<accepted>``), ``messages`` records what was
accepted (after truncation). ``reset()`` clears all three.
"""

from __future__ import annotations

from typing import Any

from gorge.mailer.backends.base import BackendEntry
from gorge.mailer.message import Message
from gorge.mailer.outcome import Outcome

FAIL_MODES = ("", "permanent", "temporary", "unknown", "backend", "unscoped")

_OUTCOMES = {
    "permanent": Outcome.rejected_message,
    "temporary": Outcome.transient,
    "unknown": Outcome.unknown,
    "backend": Outcome.rejected_backend,
    "unscoped": Outcome.rejected_unscoped,
}


class TestBackend:
    __test__ = False  # not a pytest test class despite the name

    def __init__(self, key: str, priority: int, fail: str = "", fail_times: int = 0) -> None:
        self.key = key
        self.type = "test"
        self.priority = priority
        self.fail = fail
        self.fail_times = fail_times
        self.attempts = 0
        self.accepted = 0
        self.messages: list[Message] = []

    def reset(self) -> None:
        self.attempts = 0
        self.accepted = 0
        self.messages = []

    async def send(self, message: Message, *, deadline: float) -> Outcome:
        self.attempts += 1
        if self.fail and (self.fail_times == 0 or self.attempts <= self.fail_times):
            cause = f"test: injected {self.fail} failure on attempt {self.attempts}"
            return _OUTCOMES[self.fail](cause)
        self.accepted += 1
        self.messages.append(message)
        return Outcome.accepted(f"test-{self.accepted}")


#: The option keys this backend reads; others are ignored (logged at debug).
OPTIONS = frozenset(("fail", "fail-times"))


def build(entry: BackendEntry, *, reactor: Any = None, http_client: Any = None) -> TestBackend:
    fail = entry.choice("fail", "", FAIL_MODES)
    fail_times = entry.int("fail-times", 0, min=0)
    return TestBackend(entry.key, entry.priority, fail=fail, fail_times=fail_times)
