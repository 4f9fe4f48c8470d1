"""Prometheus metric types whose ``labels()`` is a dictionary lookup.

prometheus_client validates the label names, converts every value and takes
a lock on each ``labels()`` call; on a path that counts every task that was a
few percent of a daemon's time. These subclasses remember each child under
the arguments it was asked for, so only the first call per label set pays.
Children are never removed here (nothing calls ``remove()`` or ``clear()``)."""

from __future__ import annotations

from typing import Any

import prometheus_client

__all__ = ["Counter", "Gauge", "Histogram"]


class _RememberedChildren:
    def labels(self, *values: Any, **names: Any) -> Any:
        key = tuple(sorted(names.items())) if names else values
        children = self.__dict__.setdefault("_gorge_children", {})
        child = children.get(key)
        if child is None:
            child = children[key] = super().labels(*values, **names)  # type: ignore[misc]
        return child


class Counter(_RememberedChildren, prometheus_client.Counter):
    pass


class Gauge(_RememberedChildren, prometheus_client.Gauge):
    pass


class Histogram(_RememberedChildren, prometheus_client.Histogram):
    pass
