"""One-time-use devices and the tree (pure: the uses in, a tree out; the
uses are the tracker's, the cleaning compute_agent/cleaning/run.py's).

A ``[pci] device_spec`` entry saying ``one_time_use`` (nova's key, 2025.2)
marks its devices: a claim that chooses one records it used (in the same
commit), and used it is never chosen again until it is clean. What a used
device takes out of scheduling (``apply_uses``):

- a whole device (a PF or a plain PCI device): its provider's inventory is
  wholly reserved from the claim on, while a guest holds it and after, as
  nova does;
- a VF (beyond nova, which leaves VFs out): one unit of its PF's provider
  once no guest holds it (while held, its allocation counts it already).

It is clean again when its cleaning command succeeds or an operator
releases it (``compute-agent-manage device release``). A cleaning that
failed adds ``CUSTOM_HW_DEVICE_CLEANING_FAILED`` to the provider.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from compute_agent.claims.choice import Pool
from compute_agent.claims.model import DeviceUse, UseState
from compute_agent.drivers.base import DeviceKind
from compute_agent.tree.host_tree import BuiltTree
from compute_agent.tree.ownership import CLEANING_FAILED_TRAIT
from compute_agent.tree.provider_tree import Provider, ProviderTree


def units_out(pool: Pool, used: frozenset[str], held: frozenset[str]) -> int:
    """How many of the pool's units its used devices take out of
    scheduling: all of a whole device's; one per VF no one holds (a VF
    its health took out already counts there)."""
    mine = pool.one_time_use & used
    if not mine:
        return 0
    if pool.kind is DeviceKind.PCI:
        return pool.capacity
    return len(mine - held - pool.unhealthy)


def apply_uses(built: BuiltTree, uses: Iterable[tuple[DeviceUse, bool]]) -> BuiltTree:
    """``built`` with the used one-time-use devices' units reserved and a
    failed cleaning's trait; ``uses``: each use with whether a live
    assignment holds its device. ``built`` itself is left as it was."""
    uses = list(uses)
    if not uses:
        return built
    used = frozenset(u.address for u, _ in uses)
    held = frozenset(u.address for u, h in uses if h)
    failed = frozenset(u.address for u, _ in uses if u.state is UseState.CLEANING_FAILED)
    changed: dict[str, Provider] = {}
    for pool in built.pools:
        out = units_out(pool, used, held)
        if not out:
            continue
        provider = changed.get(pool.provider_name) or built.tree.named(pool.provider_name)
        record = provider.inventories[pool.resource_class]
        reserved = (record["total"] if pool.kind is DeviceKind.PCI
                    else min(record["total"], record.get("reserved", 0) + out))
        marks = {CLEANING_FAILED_TRAIT} if pool.one_time_use & failed else set()
        changed[provider.name] = replace(
            provider,
            inventories={**provider.inventories, pool.resource_class: {
                **record, "reserved": max(record.get("reserved", 0), reserved)}},
            traits=provider.traits | marks)
    if not changed:
        return built
    return replace(built, tree=ProviderTree(changed.get(p.name, p) for p in built.tree))
