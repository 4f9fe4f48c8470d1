"""The per-hook lock's name is the one Phorge's own PhabricatorGlobalLock derives
(real Phorge code, run by php), so gorge-webhook and a Phorge worker exclude each
other on one hook (docs/webhook.md, "Order and replicas")."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gorge.webhook.hooklock import digest_to_length, lock_name
from gorge_testing.phorge import find_checkout

SCRIPT = Path(__file__).with_name("php") / "lock_name.php"

NAMESPACES = ["phabricator", "phorge", "p", "a_very_long_namespace_name_of_a_site", "mp123x4"]
HOOKS = [
    "PHID-HWBH-abcdefghijklmnopqrst",
    "PHID-HWBH-00000000000000000001",
    "PHID-HWBH-x",
    "PHID-HWBH-" + "z" * 54,
]


def _phorge_names(namespace: str, hooks: list[str]) -> list[str]:
    checkout, why_not = find_checkout()
    if checkout is None:
        pytest.skip(why_not or "no Phorge checkout")
    out = subprocess.run(
        [checkout.php, str(SCRIPT), str(checkout.root), namespace, *hooks],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.splitlines()


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_the_lock_name_is_phorges(namespace):
    assert [lock_name(namespace, hook) for hook in HOOKS] == _phorge_names(namespace, HOOKS)


@settings(max_examples=200)
@given(st.text(min_size=0, max_size=80))
def test_digest_to_length_keeps_a_prefix_and_twelve_digest_characters(text):
    digest = digest_to_length(text, 20)
    prefix, _, tail = digest.rpartition("-")
    assert prefix == text[:7] and len(tail) == 12
