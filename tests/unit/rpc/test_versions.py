"""The RPC API's ledger of versions (pure)."""
from __future__ import annotations

import pytest

from compute_agent.rpc import versions as rpc_versions


def test_the_ledger_is_in_order_and_says_what_each_version_added():
    numbers = [tuple(map(int, v.number.split("."))) for v in rpc_versions.VERSIONS]
    assert numbers == sorted(set(numbers))
    assert all(v.added for v in rpc_versions.VERSIONS)


def test_a_version_the_ledger_lists_is_known_and_another_is_refused():
    assert rpc_versions.known("1.1") == "1.1"
    with pytest.raises(ValueError, match="RPC API version 1.99 is not in the ledger"):
        rpc_versions.known("1.99")
