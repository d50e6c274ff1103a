"""Reserved until healed as the update loop applies it
(compute_agent/heal/hold.py): usages read from Placement only for the
providers a class moves off, through the agent's view of allocations
(read again only once it may have changed), and the host's state said
once when it becomes unhealed and once when it is healed."""
from __future__ import annotations

import dataclasses
import logging

import pytest

from compute_agent.heal.hold import UnhealedHold
from compute_agent.placement.allocations import AllocationView
from compute_agent.tree.provider_tree import ProviderTree
from tests.unit.clocks import FakeClock
from tests.unit.heal.test_rules import CELL0, CELL1, PF, ROOT, flat, nested
from tests.unit.placement.test_allocations import FakeClient

CONSUMER = "0f6f3c1e-8a55-4c3c-9b43-1d2b7b7f0a01"


@pytest.fixture
def client() -> FakeClient:
    c = FakeClient()
    c.allocations = {ROOT: {CONSUMER: {"resources": {"VCPU": 2}}}, PF: {}}
    return c


@pytest.fixture
def hold(client: FakeClient) -> UnhealedHold:
    return UnhealedHold(AllocationView(client, refresh_interval=60, clock=FakeClock()))


def reserved(tree: ProviderTree, uuid: str, rc: str) -> tuple[int, int]:
    record = tree.get(uuid).inventories[rc]
    return record["reserved"], record["total"]


def root_written(tree: ProviderTree) -> ProviderTree:
    """``tree`` once allocations were written on its root: Placement moved
    the root's generation."""
    return ProviderTree([dataclasses.replace(p, generation=(p.generation or 0) + 1)
                         if p.uuid == ROOT else p for p in tree])


def test_a_class_used_where_it_was_keeps_it_there_and_reserves_its_new_homes(hold, client):
    """The flat tree's VCPU, used on the root, moves to the NUMA cells:
    the root keeps it, the cells report it fully reserved; memory, unused,
    goes live at once."""
    held = hold.hold(flat(), nested(), lambda p: True)
    assert held.get(ROOT).inventories["VCPU"] == flat().get(ROOT).inventories["VCPU"]
    for cell in (CELL0, CELL1):
        assert reserved(held, cell, "VCPU") == (4, 4)
        assert reserved(held, cell, "MEMORY_MB") == (0, 2048)
    # Only the provider a class moves off was read.
    assert client.reads == [ROOT]


def test_a_class_nobody_uses_goes_live_at_once(hold, client):
    client.allocations[ROOT] = {}
    model = nested()
    assert hold.hold(flat(), model, lambda p: True) is model


def test_nothing_is_read_when_no_class_moves(hold, client):
    model = flat()
    assert hold.hold(flat(), model, lambda p: True) is model
    assert client.reads == []


def test_only_our_providers_are_held(hold, client):
    """Another service's provider in the tree keeps what it has: its
    inventories are not ours to move, nor its usages ours to read."""
    model = nested()
    assert hold.hold(flat(), model, lambda p: p.uuid != ROOT) is model
    assert client.reads == []


def test_usages_are_read_again_only_once_the_providers_generation_moved(hold, client):
    current = flat()
    hold.hold(current, nested(), lambda p: True)
    hold.hold(current, nested(), lambda p: True)
    assert client.reads == [ROOT]
    # Healed meanwhile; Placement moved the root's generation (allocations
    # written on it, as heal's reshape writes them).
    client.allocations[ROOT] = {}
    held = hold.hold(root_written(current), nested(), lambda p: True)
    assert client.reads == [ROOT, ROOT]
    assert reserved(held, CELL0, "VCPU") == (0, 4)


def test_the_host_says_once_that_it_is_unhealed_and_once_that_it_is_healed(hold, client,
                                                                           caplog):
    caplog.set_level(logging.INFO, logger="compute_agent.heal.hold")
    current = flat()
    for _ in range(2):
        hold.hold(current, nested(), lambda p: True)
    client.allocations[ROOT] = {}
    for _ in range(2):
        hold.hold(root_written(current), nested(), lambda p: True)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "Host unhealed for VCPU: consumers still hold 2 VCPU on h; the "
                          "new providers of these classes stay fully reserved until "
                          "'compute-agent-manage heal' moves the allocations"),
        (logging.INFO, "Host healed: the provider tree is the model's")]


def test_a_host_never_unhealed_says_nothing(hold, client, caplog):
    caplog.set_level(logging.INFO, logger="compute_agent.heal.hold")
    client.allocations[ROOT] = {}
    hold.hold(flat(), nested(), lambda p: True)
    assert caplog.records == []
