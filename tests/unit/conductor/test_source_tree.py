"""A move's source tree read from Placement
(compute_agent/conductor/source_tree.py), on a Placement stand-in that
answers GET /resource_providers (in_tree=, required=) and a provider's
traits as Placement documents them, and counts the requests."""
from __future__ import annotations

import uuid
from typing import Any

from compute_agent.conductor.source_tree import read_device_traits, read_source_tree
from compute_agent.moves.request import SourceProvider

ROOT, CELL0, PF, OTHER_CELL, GPU, OTHER_ROOT = (str(uuid.uuid4()) for _ in range(6))
NUMA = "HW_NUMA_ROOT"


class Placement:
    """Providers with their parents and traits; the read side of
    PlacementClient the source tree uses."""

    def __init__(self) -> None:
        self.providers: dict[str, tuple[str | None, frozenset[str]]] = {
            ROOT: (None, frozenset({"COMPUTE_NODE"})),
            CELL0: (ROOT, frozenset({NUMA})),
            PF: (CELL0, frozenset({"COMPUTE_MANAGED_PCI_DEVICE", "CUSTOM_PHYSNET_NET1"})),
            GPU: (ROOT, frozenset({"CUSTOM_MDEV_TYPE_NVIDIA_35"})),
            OTHER_ROOT: (None, frozenset({"COMPUTE_NODE"})),
            # Another host's cell: never in this tree.
            OTHER_CELL: (OTHER_ROOT, frozenset({NUMA})),
        }
        self.requests: list[str] = []

    def _root(self, uuid: str) -> str:
        parent = self.providers[uuid][0]
        return uuid if parent is None else self._root(parent)

    def _row(self, uuid: str) -> dict[str, Any]:
        # GET /resource_providers' fields (microversion 1.14+).
        return {"uuid": uuid, "name": f"rp-{uuid}", "generation": 1,
                "parent_provider_uuid": self.providers[uuid][0],
                "root_provider_uuid": self._root(uuid)}

    def get_tree(self, root_uuid: str) -> list[dict]:
        self.requests.append(f"GET /resource_providers?in_tree={root_uuid}")
        return [self._row(u) for u in self.providers if self._root(u) == root_uuid]

    def get_providers(self, **query: str) -> list[dict[str, Any]]:
        self.requests.append("GET /resource_providers?" + "&".join(
            f"{k}={v}" for k, v in sorted(query.items())))
        required = set(query.get("required", "").split(",")) - {""}
        return [self._row(u) for u, (_, traits) in self.providers.items()
                if self._root(u) == query.get("in_tree", self._root(u))
                and required <= traits]

    def get_traits(self, uuid: str) -> tuple[int, frozenset[str]]:
        self.requests.append(f"GET /resource_providers/{uuid}/traits")
        return 1, self.providers[uuid][1]


def test_the_tree_is_read_with_its_cells_marked_in_two_requests():
    placement = Placement()
    tree = read_source_tree(placement, ROOT)
    assert tree == {ROOT: SourceProvider(ROOT, None),
                    CELL0: SourceProvider(CELL0, ROOT, frozenset({NUMA})),
                    PF: SourceProvider(PF, CELL0),
                    GPU: SourceProvider(GPU, ROOT)}
    assert placement.requests == [
        f"GET /resource_providers?in_tree={ROOT}&required={NUMA}",
        f"GET /resource_providers?in_tree={ROOT}"]


def test_the_traits_of_the_device_providers_used_are_read_one_request_each():
    placement = Placement()
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
