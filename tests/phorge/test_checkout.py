"""The Phorge the real-Phorge tests run on is the one the repository pins
(``phorge/tested-with``, the commits the docs name as tested), or, when an
operator points GORGE_PHORGE_ROOT at another, the run says which it is."""

from __future__ import annotations

import pytest

from gorge_testing.phorge import pinned_commits


def test_the_checkout_is_the_pinned_one_or_says_which_it_is(phorge_checkout):
    pinned = pinned_commits()
    used = phorge_checkout.commits()
    if phorge_checkout.source == "the cache":
        # The cache is only ever filled at the pinned commits.
        assert used == pinned
    elif used != pinned:
        pytest.skip(f"testing another Phorge than the pinned one: {phorge_checkout.describe()}")
    assert used == pinned
