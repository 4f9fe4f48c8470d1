"""The example budget of the HTTP fuzz properties: bounded in the suite,
larger when bench/fuzz/http_readers.py runs them with ``HTTP_FUZZ_SCALE``
set (read when a test module builds its settings)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings


def fuzz_settings(examples: int) -> settings:
    scale = int(os.environ.get("HTTP_FUZZ_SCALE") or 1)
    return settings(
        max_examples=examples * scale,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
