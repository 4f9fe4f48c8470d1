"""Which handler runs which task class, and which classes we lease."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from twisted.internet.defer import Deferred

Handler = Callable[[dict, str | None], Deferred | Awaitable[Any] | Any]

PHP_CLASS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_CLASS_LENGTH = 64
FALLBACK_MARK = "*"


def is_php_class_name(name: Any) -> bool:
    return (
        isinstance(name, str)
        and len(name) <= MAX_CLASS_LENGTH
        and PHP_CLASS_NAME.fullmatch(name) is not None
    )


def parse_class_list(text: str) -> tuple[str, ...]:
    """Comma-separated, trimmed, empty items dropped, order and case kept."""
    items: list[str] = []
    for part in text.split(","):
        part = part.strip()
        if part and part not in items:
            items.append(part)
    return tuple(items)


class Registry:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._fallback: Handler | None = None

    def register(self, task_class: str, handler: Handler) -> None:
        self._handlers[task_class] = handler

    def set_fallback(self, handler: Handler) -> None:
        self._fallback = handler

    @property
    def has_fallback(self) -> bool:
        return self._fallback is not None

    def get(self, task_class: str) -> Handler | None:
        return self._handlers.get(task_class, self._fallback)

    def has(self, task_class: str) -> bool:
        return self.get(task_class) is not None

    def registered(self) -> list[str]:
        return sorted(self._handlers)

    def supported_classes(self) -> list[str]:
        return self.registered() + ([FALLBACK_MARK] if self._fallback is not None else [])


class LeasePlan:
    """The class filter applied to a registry: what to ask the queue for and
    what to run when the queue hands out something else anyway."""

    def __init__(self, registry: Registry, class_filter: tuple[str, ...]) -> None:
        self._registry = registry
        self._filter = frozenset(class_filter)
        if registry.has_fallback:
            self.task_classes: list[str] | None = sorted(self._filter) or None
        else:
            allowed = set(registry.registered())
            if self._filter:
                allowed &= self._filter
            self.task_classes = sorted(allowed)
        self.unrunnable_filter_entries = sorted(
            name for name in self._filter if not registry.has(name)
        )

    @property
    def empty(self) -> bool:
        return self.task_classes == []

    def runnable(self, task_class: str) -> bool:
        if self._filter and task_class not in self._filter:
            return False
        return self._registry.has(task_class)

    def classes_except(self, held_back: Callable[[str], bool]) -> list[str]:
        """What to ask for while the classes ``held_back`` names wait: always
        a list (asking for no class asks for every class), and with the
        fallback, only the classes registered by name."""
        wanted = self._registry.registered() if self.task_classes is None else self.task_classes
        return [name for name in wanted if self.runnable(name) and not held_back(name)]
