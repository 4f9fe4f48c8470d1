"""Real-Phorge tests: see conftest.py."""

import pytest


def setup_module():
    # Package-level, so that without a Phorge checkout the whole directory is
    # skipped with a single reason (and no fixture, MariaDB included, starts).
    from tests.phorge.site import HOW_TO_RUN, find_checkout

    checkout, problem = find_checkout()
    if checkout is None and problem is None:
        pytest.skip(HOW_TO_RUN)
