"""Adopting a host that nova-compute ran until today (pure).

At the agent's first start on such a host there is no store, nova's
consumers hold allocations on the tree nova registered, and nova's guests
run without our metadata. Before any claim can run, each guest's devices
(hostdev PCI addresses and VFs, mdev UUIDs, nvdimm backing paths, pinned
CPUs), read from its domain, become assignments of its instance: the same
rows a completed build leaves (state claimed, owner the instance).

A device the guest holds maps to the pool slot with that device on the
provider its allocation names (compute_agent/store/rebuild.py's GuestRows, shared
with the rebuild of a lost store). Nova's root inventory the model puts
elsewhere (VCPU, MEMORY_MB, PCPU on NUMA cells) stays where Placement has
it: a pinned CPU is found in the model's PCPU pools, counted classes become
amounts of the host; heal moves them later.

Only devices of the model's pools count ("allowlisted"): a guest's other
hostdevs, and CPUs outside the dedicated set (nova pins a shared guest's
vCPUs to the whole shared set), are nothing the agent hands out.

Refused, listing every problem and writing nothing: an allocation no
guest explains (a move in flight), a device that maps to no pool of its
allocations, a running guest holding a device but no allocation, and two
guests holding one device. A stopped guest with no allocation is not
imported (it holds nothing until started, and nova is gone); it is named
in ``skipped``.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from compute_agent.claims.choice import Pool
from compute_agent.claims.model import Allocations
from compute_agent.drivers.base import DeviceKind, ForeignGuest, HostResource, HostResourceKind
from compute_agent.store.errors import AdoptionRefused
from compute_agent.store.rebuild import GuestRows, HeldDevice, RebuiltStore, RowSource


@dataclass(frozen=True)
class AdoptionPlan:
    store: RebuiltStore
    skipped: list[str] = field(default_factory=list)  # guests not imported, why


_KINDS = {
    HostResourceKind.PCI_ADDRESS: frozenset({DeviceKind.PCI, DeviceKind.VF}),
    HostResourceKind.MDEV_UUID: frozenset({DeviceKind.MDEV}),
    HostResourceKind.BACKING_PATH: frozenset({DeviceKind.PMEM}),
    HostResourceKind.HOST_CPU: frozenset({DeviceKind.PCPU}),
}


def held_device(resource: HostResource) -> HeldDevice:
    """A resource a domain holds, as the pools' slots name devices: a
    namespace by its device path, the others by their id."""
    return HeldDevice(_KINDS[resource.kind], resource.id,
                      by_path=resource.kind is HostResourceKind.BACKING_PATH)


def is_allowlisted(resource: HostResource, pools: Mapping[str, Mapping[str, Pool]]) -> bool:
    """A device of one of the model's pools: something a claim could hand out."""
    held = held_device(resource)
    return any(held.is_slot(pool, slot) for by_rc in pools.values()
               for pool in by_rc.values() if pool.exclusive for slot in pool.slots)


def _ordered(resources) -> list[HostResource]:
    return sorted(resources, key=lambda r: (r.kind.value, r.id))


def shared_devices(guests: Mapping[str, ForeignGuest],
                   pools: Mapping[str, Mapping[str, Pool]]) -> list[str]:
    """One line per allowlisted device that two or more guests hold."""
    holders: dict[HostResource, list[str]] = defaultdict(list)
    for uuid, guest in sorted(guests.items()):
        for resource in guest.resources:
            if is_allowlisted(resource, pools):
                holders[resource].append(uuid)
    return [f"{r.kind.value} {r.id}: held by {len(holders[r])} guests "
            f"({', '.join(holders[r])})" for r in _ordered(holders) if len(holders[r]) > 1]


def plan_adoption(guests: Mapping[str, ForeignGuest], allocations: Allocations,
                  rows_from: RowSource) -> AdoptionPlan:
    """The store's rows for the foreign guests, or AdoptionRefused listing
    every problem. ``allocations``: every consumer's on this host's tree."""
    pools = rows_from.pools
    problems = shared_devices(guests, pools)
    for consumer in sorted(set(allocations) - set(guests)):
        problems.append(f"consumer {consumer}: holds allocations on this host's "
                        "providers but no guest is defined for it (a move in flight?)")
    instances: dict[str, dict] = {}
    rows = []
    skipped: list[str] = []
    for uuid, guest in sorted(guests.items()):
        allowlisted = [r for r in _ordered(guest.resources) if is_allowlisted(r, pools)]
        if uuid not in allocations:
            shown = ", ".join(f"{r.kind.value} {r.id}" for r in allowlisted)
            if guest.running and allowlisted:
                problems.append(f"guest {uuid} ({guest.name}): runs holding {shown} "
                                "but has no allocation on this host's providers")
            else:
                skipped.append(f"guest {uuid} ({guest.name}): "
                               f"{'running' if guest.running else 'stopped'}, no "
                               "allocation on this host's providers: not imported"
                               + (f"; its definition names {shown}" if shown else ""))
            continue
        matched = GuestRows(uuid, allocations[uuid], rows_from, problems, stranded=True)
        for resource in allowlisted:
            matched.device(held_device(resource))
        if not guest.running:
            for resource in _ordered(guest.resources):
                if (resource.kind is HostResourceKind.MDEV_UUID
                        and resource not in allowlisted):
                    matched.new_mdev(held_device(resource))
        instances[uuid] = {"name": guest.name, "vcpus": guest.vcpus,
                           "memory_mb": guest.memory_mb}
        rows.extend(matched.rest(cells_too=True))
    if problems:
        raise AdoptionRefused(problems)
    return AdoptionPlan(RebuiltStore(instances, sorted(rows, key=lambda a: a.id)), skipped)
