"""A throwaway Phorge for the real-Phorge tests: the harness itself lives in
gorge_testing.phorge (bench/phorge.py runs on it too); this module adds what
only the tests need."""

from __future__ import annotations

from typing import Any

import pytest_twisted
from twisted.internet.defer import Deferred

from gorge_testing.phorge import (  # noqa: F401 - the tests' names for the harness
    BOUND,
    CHECKOUT_SCRIPT,
    ROOT_VARIABLE,
    STEP,
    Background,
    Checkout,
    PhorgeError,
    PhorgeSite,
    find_checkout,
    until,
)
from tests.support.paths import REPO_ROOT

HOW_TO_RUN = (
    f"real-Phorge tests skipped: no Phorge checkout; make the pinned one with "
    f"{CHECKOUT_SCRIPT} [--phorge GIT --arcanist GIT], or set {ROOT_VARIABLE} "
    "to a Phorge checkout with arcanist/ beside it"
)
# gorge's Phorge extension library, loaded into every test instance.
LIBRARY = REPO_ROOT / "phorge" / "src"


def wait(coroutine) -> Any:
    """Run a coroutine on the reactor from a fixture."""
    return pytest_twisted.blockon(Deferred.fromCoroutine(coroutine))
