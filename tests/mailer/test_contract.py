"""Contract fixtures replayed through the real site."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_twisted

from tests.mailer.conftest import contract_env, make_harness
from tests.support.contract import crashes, fixture_files, replay
from tests.support.logcapture import logged_events

FIXTURES = fixture_files(Path(__file__).parent / "contract")


def test_fixture_directory_is_not_empty():
    assert len(FIXTURES) == 11


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
@pytest_twisted.ensureDeferred
async def test_contract(path):
    with logged_events() as events:
        await replay(make_harness(contract_env()).client, path)
    assert crashes(events) == []
