"""The hypervisor's veto, pure: a device that a guest defined or running on
this host holds is never chosen for a claim, whatever the store says; and
which of those holdings the store does not explain, for reconciliation to
report.

The store is the agent's record of what it gave; the guests' domains are
what is held. A store that forgot builds it had acknowledged (a write-ahead
log emptied after a crash, an older copy put back) would otherwise hand a
forgotten guest's devices to the next build: one device, two guests. The
veto lifts only when no guest holds the device any more (the guest deleted,
undefined, or redefined without it), and a device held by a guest the store
knows is held in the store too.
"""
from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from compute_agent.claims.choice import Pool, slot_resources
from compute_agent.drivers.base import GuestHolding, HostResource, HostResourceKind


def vetoed_resources(guests: Mapping[str, GuestHolding]) -> frozenset[HostResource]:
    """Every host resource a guest here holds, ours or another manager's,
    running or only defined: none is chosen for a claim."""
    return frozenset().union(*(g.resources for g in guests.values()))


def assignable_resources(pools: Mapping[str, Mapping[str, Pool]]) -> frozenset[HostResource]:
    """What the agent's pools can hand out, as guests' domains name it."""
    return frozenset(r for by_class in pools.values() for pool in by_class.values()
                     for slot in pool.slots for r in slot_resources(pool, slot))


class Unexplained(str, enum.Enum):
    """Why the store does not explain a device a guest holds."""

    GUEST_UNKNOWN = "guest_unknown"  # the store does not know the guest's instance
    GIVEN_TO_ANOTHER = "given_to_another"  # the store gives it to another instance
    GIVEN_TO_NONE = "given_to_none"  # the store knows the guest, not this device of it


@dataclass(frozen=True)
class StrayHolding:
    """A device a guest holds that the store does not give its instance."""

    guest: str  # the guest's uuid: its instance's
    ours: bool  # the guest carries our metadata
    running: bool
    device: HostResource
    why: Unexplained
    given_to: tuple[str, ...] = ()  # the instances the store gives it to instead


def stray_holdings(guests: Mapping[str, GuestHolding],
                   given: Mapping[HostResource, Collection[str]],
                   instances: Collection[str],
                   assignable: frozenset[HostResource]) -> list[StrayHolding]:
    """The devices the agent hands out (``assignable``) that a guest holds
    and the store does not give the guest's instance. ``given``: each
    device the store's live assignments hold -> their instances;
    ``instances``: the instances the store knows. Sorted by guest, then
    device."""
    out = []
    for uuid in sorted(guests):
        guest = guests[uuid]
        for device in sorted(guest.resources & assignable, key=_order):
            holders = frozenset(given.get(device, ()))
            if uuid in holders:
                continue
            if holders:
                why = Unexplained.GIVEN_TO_ANOTHER
            elif uuid in instances:
                why = Unexplained.GIVEN_TO_NONE
            else:
                why = Unexplained.GUEST_UNKNOWN
            out.append(StrayHolding(uuid, guest.ours, guest.running, device, why,
                                    tuple(sorted(holders))))
    return out


def _order(resource: HostResource) -> tuple[str, str]:
    return resource.kind.value, resource.id


RESOURCE_NAMES = {HostResourceKind.PCI_ADDRESS: "PCI device",
                  HostResourceKind.MDEV_UUID: "mdev",
                  HostResourceKind.BACKING_PATH: "nvdimm backing",
                  HostResourceKind.HOST_CPU: "host CPU"}


def describe_stray(stray: StrayHolding) -> str:
    """One phrase for the report: the device, who holds it, what the store
    says."""
    guest = (f"{'running' if stray.running else 'defined'} guest "
             f"{'of ours' if stray.ours else 'of another manager'}")
    device = f"{RESOURCE_NAMES[stray.device.kind]} {stray.device.id}"
    if stray.why is Unexplained.GIVEN_TO_ANOTHER:
        store = f"the store gives it to instance {', '.join(stray.given_to)}"
    elif stray.why is Unexplained.GIVEN_TO_NONE:
        store = "the store gives it to no instance"
    else:
        store = "the store does not know this guest"
    return f"{device} held by this {guest}; {store}"
