"""The service tree every daemon is built as: named parts started in
order and stopped in reverse, each stop awaited."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, overload

from twisted.application.service import IService, Service
from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.logger import ILogObserver, LogLevel
from twisted.python.components import Componentized

from gorge.log.logger import Logger
from gorge.log.output import forward_stdlib_logging

T = TypeVar("T")

log = Logger()


class DaemonRoot(Service):
    """The top of a daemon's tree: what its ``makeService`` hands to twistd.

    twistd adds it to a new Application, and an ``ILogObserver`` component
    on that Application is twistd's own way for an application to choose its
    log observer (an explicit ``--logger`` still takes precedence). Setting
    :attr:`log_observer` makes a plain ``twistd -n gorge-X`` print gorge's
    lines at ``GORGE_LOG_LEVEL`` in ``GORGE_LOG_FORMAT``, through the one
    observer twistd starts, so no line is printed twice.
    """

    log_observer: ILogObserver | None = None

    def setServiceParent(self, parent: Any) -> None:
        if (
            self.log_observer is not None
            and isinstance(parent, Componentized)
            and parent.getComponent(ILogObserver) is None
        ):
            parent.setComponent(ILogObserver, self.log_observer)
            forward_stdlib_logging()
        super().setServiceParent(parent)


class OrderedService(Service):
    """Start children in order; stop them in reverse order, one at a time.

    Twisted's MultiService stops its children concurrently, which would close
    a database pool while a delivery is still writing its result.
    """

    def __init__(self, *children: IService, name: str | None = None) -> None:
        self._children = list(children)
        if name is not None:
            self.setName(name)

    def add(self, child: IService) -> None:
        self._children.append(child)

    def privilegedStartService(self) -> None:
        super().privilegedStartService()
        for child in self._children:  # binds ports before twistd drops privileges
            child.privilegedStartService()

    def startService(self) -> None:
        super().startService()
        for child in self._children:
            if not child.running:
                child.startService()

    def stopService(self) -> Deferred:
        super().stopService()
        return Deferred.fromCoroutine(self._stop_in_order())

    async def _stop_in_order(self) -> None:
        for child in reversed(self._children):
            if not child.running:
                continue
            try:
                await maybeDeferred(child.stopService)
            except Exception:
                log.failure("STOP_FAILED child={child}", level=LogLevel.error, child=repr(child))


class ServiceTree(DaemonRoot, OrderedService):
    """A daemon's service tree, built one named child at a time.

    Children start in the order they were added and stop in reverse, one at
    a time (:class:`OrderedService`). So a tree lists what must outlive the
    rest first (pools, stores) and what must stop first last (the loop that
    takes new work, the listener). Each child, and each part that is no
    child (the site, a metrics registry), is reachable by name through
    :meth:`part`.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self._parts: dict[str, Any] = {}

    def add(  # type: ignore[override]  # named children, unlike OrderedService.add
        self,
        name: str,
        child: IService | None = None,
        *,
        start: Callable[[], object] | None = None,
        stop: Callable[[], object] | None = None,
        part: Any = None,
    ) -> IService:
        """Add the child ``name``: ``child`` itself, or a step made of a
        ``start`` and a ``stop`` callable (``stop`` may return a Deferred or
        be a coroutine function; the tree waits for it). :meth:`part` then
        returns ``part``, or the child when there is none."""
        if child is None:
            child = FunctionService(start=start, stop=stop)
        elif start is not None or stop is not None:
            raise TypeError(f"{name}: give a child service or start/stop callables, not both")
        child.setName(name)
        self.keep(name, child if part is None else part)
        OrderedService.add(self, child)
        return child

    def keep(self, name: str, part: Any) -> None:
        """Make ``part`` reachable as :meth:`part` ``(name)`` without it being a child."""
        if name in self._parts:
            raise ValueError(f"{self.name} already has a part named {name!r}")
        self._parts[name] = part

    @overload
    def part(self, name: str) -> Any: ...

    @overload
    def part(self, name: str, kind: type[T]) -> T: ...

    def part(self, name: str, kind: type | None = None) -> Any:
        """The part called ``name``; with ``kind``, checked to be one."""
        try:
            found = self._parts[name]
        except KeyError:
            raise KeyError(
                f"{self.name} has no part {name!r} (it has: {', '.join(sorted(self._parts))})"
            ) from None
        if kind is not None and not isinstance(found, kind):
            raise TypeError(
                f"{self.name} part {name!r} is a {type(found).__name__}, not a {kind.__name__}"
            )
        return found

    def has_part(self, name: str) -> bool:
        return name in self._parts

    def __repr__(self) -> str:
        return f"<ServiceTree {self.name}>"


class FunctionService(Service):
    """An IService whose start and stop are plain callables.

    ``stop`` may return a Deferred (or a coroutine's Deferred); the ordered
    parent waits for it before stopping the previous child.
    """

    def __init__(
        self,
        start: Callable[[], object] | None = None,
        stop: Callable[[], object] | None = None,
        name: str | None = None,
    ) -> None:
        self._start = start
        self._stop = stop
        if name is not None:
            self.setName(name)

    def startService(self) -> None:
        super().startService()
        if self._start is not None:
            self._start()

    def stopService(self) -> Deferred | None:
        super().stopService()
        if self._stop is None:
            return succeed(None)
        return maybeDeferred(self._stop)

    def __repr__(self) -> str:
        return f"<FunctionService {self.name}>"
