"""A move's source tree read from Placement
(compute_agent/conductor/source_tree.py), on the Placement stand-in of placements.py, which
answers GET /resource_providers (in_tree=, required=) and a provider's
traits as Placement documents them, and counts the requests."""
from __future__ import annotations

import uuid

from compute_agent.conductor.source_tree import read_device_traits, read_source_tree
from compute_agent.moves.request import SourceProvider
from tests.unit.conductor.placements import Placement

ROOT, CELL0, PF, OTHER_CELL, GPU, OTHER_ROOT = (str(uuid.uuid4()) for _ in range(6))
NUMA = "HW_NUMA_ROOT"


def two_hosts() -> Placement:
    """A host's tree, and another host's beside it."""
    placement = Placement()
    placement.add(ROOT, "h1", None, frozenset({"COMPUTE_NODE"}))
    placement.add(CELL0, "h1_numa_0", ROOT, frozenset({NUMA}))
    placement.add(PF, "h1_PF", CELL0, frozenset({"COMPUTE_MANAGED_PCI_DEVICE",
                                                 "CUSTOM_PHYSNET_NET1"}))
    placement.add(GPU, "h1_GPU", ROOT, frozenset({"CUSTOM_MDEV_TYPE_NVIDIA_35"}))
    placement.add(OTHER_ROOT, "h2", None, frozenset({"COMPUTE_NODE"}))
    # Another host's cell: never in this tree.
    placement.add(OTHER_CELL, "h2_numa_0", OTHER_ROOT, frozenset({NUMA}))
    return placement


def test_the_tree_is_read_with_its_cells_marked_in_two_requests():
    placement = two_hosts()
    tree = read_source_tree(placement, ROOT)
    assert tree == {ROOT: SourceProvider(ROOT, None),
                    CELL0: SourceProvider(CELL0, ROOT, frozenset({NUMA})),
                    PF: SourceProvider(PF, CELL0),
                    GPU: SourceProvider(GPU, ROOT)}
    assert placement.requests == [
        f"GET /resource_providers?in_tree={ROOT}&required={NUMA}",
        f"GET /resource_providers?in_tree={ROOT}"]


def test_the_traits_of_the_device_providers_used_are_read_one_request_each():
    placement = two_hosts()
    tree = read_source_tree(placement, ROOT)
    placement.requests.clear()
    # The root and a cell say nothing of a device: not read.
    read_device_traits(placement, tree, [ROOT, CELL0, PF])
    assert placement.requests == [f"GET /resource_providers/{PF}/traits"]
    assert tree[PF] == SourceProvider(PF, CELL0, frozenset({
        "COMPUTE_MANAGED_PCI_DEVICE", "CUSTOM_PHYSNET_NET1"}))
    # A device the instance does not use keeps no traits.
    assert tree[GPU] == SourceProvider(GPU, ROOT)
    assert tree[ROOT] == SourceProvider(ROOT, None)
    assert tree[CELL0] == SourceProvider(CELL0, ROOT, frozenset({NUMA}))
