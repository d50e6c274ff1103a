"""Bugs the fault proxy found in the agent's dealings with Placement, each
reproduced with the one fault, at the one place, that showed it."""
from __future__ import annotations

import pytest

from compute_agent.testing.fault_proxy import FaultProxy, PlacementFault
from tests.functional.helpers import make_agent, placement_tree

HOST = {"disk_gb": 50, "numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 4096}]}


@pytest.fixture
def proxy(placement):
    with FaultProxy(placement.url) as p:
        yield p


def test_bug_a_conflict_on_creating_a_provider_crashed_the_cycle(tmp_path, placement, proxy):
    # The retry after a 409 re-read "the provider's" generation, and a
    # provider being created has none: AttributeError, a traceback a cycle.
    agent = make_agent(tmp_path, proxy.url, HOST)
    proxy.once(PlacementFault.CONFLICT, "POST", "/resource_providers")
    agent.update_provider_tree()
    assert proxy.injected == {PlacementFault.CONFLICT: 1}
    tree = placement_tree(placement.url, agent.policy.root_uuid)
    assert sorted(tree) == [agent.policy.host, f"{agent.policy.host}_numa_0"]
