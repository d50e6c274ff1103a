"""A move's destination request (pure): what an instance holds on its
source, as the groups of one ``GET /allocation_candidates``, for an
evacuation and a live migration alike.

Its allocations, provider by provider, say how much of each class it has
and which of them sit together under one NUMA cell: the request keeps each
device with its cell's CPUs and memory (``same_subtree``) and asks for the
traits that say what a device is, beyond its class.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import os_traits

# Traits of a device provider that say what its devices are, beyond their
# class, and so must hold at the destination too.
MEANINGFUL_TRAIT_PREFIXES = ("CUSTOM_MDEV_TYPE_", "CUSTOM_PHYSNET_")


@dataclass(frozen=True)
class SourceProvider:
    """One provider of the source's tree, as the request needs it."""

    uuid: str
    parent_uuid: str | None
    traits: frozenset[str] = frozenset()


@dataclass
class RequestGroup:
    resources: dict[str, int] = field(default_factory=dict)
    required: set[str] = field(default_factory=set)

    def param(self) -> str:
        return ",".join(f"{rc}:{n}" for rc, n in sorted(self.resources.items()))


@dataclass
class MoveRequest:
    """What the instance holds on the source, as allocation-candidate
    groups: the unsuffixed group (the root's classes), one group per NUMA
    cell it used (``_CELLn``, its CPUs and memory, HW_NUMA_ROOT required)
    and one per device provider (``_DEVn``), each device group tied to its
    cell's group by ``same_subtree``."""

    unsuffixed: RequestGroup = field(default_factory=RequestGroup)
    groups: dict[str, RequestGroup] = field(default_factory=dict)
    same_subtree: list[tuple[str, ...]] = field(default_factory=list)

    def query(self, in_tree: str | None = None, limit: int | None = None
              ) -> list[tuple[str, str]]:
        """GET /allocation_candidates parameters (microversion 1.36+)."""
        out: list[tuple[str, str]] = []
        if self.unsuffixed.resources:
            out.append(("resources", self.unsuffixed.param()))
            if in_tree:
                out.append(("in_tree", in_tree))
        for suffix, g in sorted(self.groups.items()):
            out.append((f"resources{suffix}", g.param()))
            if g.required:
                out.append((f"required{suffix}", ",".join(sorted(g.required))))
            # Per group: an unsuffixed in_tree alone would be a group
            # without resources, which Placement refuses (1.33+).
            if in_tree:
                out.append((f"in_tree{suffix}", in_tree))
        for tied in self.same_subtree:
            out.append(("same_subtree", ",".join(tied)))
        if self.groups:
            out.append(("group_policy", "none"))
        if limit:
            out.append(("limit", str(limit)))
        return out


def cell_of(uuid: str, providers: dict[str, SourceProvider]) -> str | None:
    """The NUMA-cell provider at or above ``uuid``, if any."""
    seen = set()
    at: str | None = uuid
    while at is not None and at in providers and at not in seen:
        seen.add(at)
        if os_traits.HW_NUMA_ROOT in providers[at].traits:
            return at
        at = providers[at].parent_uuid
    return None


def move_request(allocations: Mapping[str, Mapping[str, int]],
                 providers: dict[str, SourceProvider]) -> MoveRequest:
    """The request for ``allocations`` (provider uuid -> class -> amount on
    the source), ``providers`` being the source's tree. Raises ValueError
    naming a provider the tree does not have."""
    req = MoveRequest()
    cell_group: dict[str, str] = {}
    devices: list[tuple[str, str | None]] = []
    for rp, resources in sorted(allocations.items()):
        if rp not in providers:
            raise ValueError(f"allocations: provider {rp} is not in the source's tree")
        p = providers[rp]
        if p.parent_uuid is None:
            group = req.unsuffixed
        elif os_traits.HW_NUMA_ROOT in p.traits:
            suffix = cell_group.setdefault(rp, f"_CELL{len(cell_group)}")
            group = req.groups.setdefault(suffix, RequestGroup(
                required={os_traits.HW_NUMA_ROOT}))
        else:
            suffix = f"_DEV{len(devices)}"
            devices.append((suffix, cell_of(rp, providers)))
            group = req.groups.setdefault(suffix, RequestGroup(required={
                t for t in p.traits if t.startswith(MEANINGFUL_TRAIT_PREFIXES)}))
        for rc, n in resources.items():
            group.resources[rc] = group.resources.get(rc, 0) + n
    for suffix, cell in devices:
        if cell is not None and cell in cell_group:
            req.same_subtree.append((cell_group[cell], suffix))
    return req


def candidate_root(request: dict[str, Any], tree_of: dict[str, str]) -> str | None:
    """The host (root provider) an allocation request lands on, when all its
    providers are in one known tree."""
    roots = {tree_of.get(rp) for rp in request["allocations"]}
    return roots.pop() if len(roots) == 1 else None
