"""The store follows Placement: assignment rows moved to where a reshape
put their allocations. Pure rules, no I/O (compute_agent/heal/run.py reads and
writes).

Heal moves allocations (VCPU and MEMORY_MB from the root to a NUMA cell, a
namespace from the flat pmem provider to its cell's, a VF under a new
class) in one ``POST /reshaper``; the store's rows must then name the same
provider and class, or the next claim, release or mode switch works from
stale rows. Heal rewrites them right after the reshaper; because it can be
killed in between, a rerun of heal and the agent's start-up apply the same
rule to every row, so the store converges whatever the interruption.

The rule, for one live row of a consumer whose allocations on our tree
are known: when its (provider, class) holds none of the consumer's
allocation, it moves to the one provider of the model that both holds the
row's device (a counted row's class) and holds the consumer's allocation of
that class. No such provider, or more than one, or more rows than the
allocation's amount: the row is reported as unaligned and left alone.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from compute_agent.claims.choice import Pool, Slot, counted_device_id, slot_detail
from compute_agent.claims.model import Allocations, Assignment
from compute_agent.drivers.base import DeviceDetail, DeviceKind

Pools = Mapping[str, Mapping[str, Pool]]  # provider uuid -> class -> pool


@dataclass(frozen=True)
class Unaligned:
    row: Assignment
    reason: str

    def __str__(self) -> str:
        a = self.row
        return (f"assignment {a.id} of {a.consumer_uuid} ({a.resource_class} "
                f"{a.kind.value} {a.device_id} on {a.provider_uuid}): {self.reason}")


@dataclass
class Realignment:
    moved: list[tuple[Assignment, Assignment]] = field(default_factory=list)  # old, new
    unaligned: list[Unaligned] = field(default_factory=list)


class DeviceIndex:
    """Where the model has each device, each GPU's mdevs and each counted
    class: built once, so that aligning many rows stays linear."""

    def __init__(self, pools: Pools):
        self.pools = pools
        self.slots: dict[tuple[DeviceKind, str], tuple[str, Pool, Slot]] = {}
        self.mdev_pools: dict[tuple[str | None, str | None], tuple[str, Pool]] = {}
        self.counted: dict[str, list[tuple[str, Pool]]] = defaultdict(list)
        for uuid, by_rc in sorted(pools.items()):
            for rc, pool in sorted(by_rc.items()):
                if pool.kind.counted:
                    self.counted[rc].append((uuid, pool))
                for slot in pool.slots:
                    self.slots[(pool.kind, slot.device_id)] = (uuid, pool, slot)
                if pool.mdev_parent is not None:
                    self.mdev_pools[(pool.mdev_parent, pool.mdev_type)] = (uuid, pool)

    def homes_of(self, a: Assignment) -> list[tuple[str, Pool]]:
        """Where the model has the row's device: the pool whose slots hold
        it (an mdev not created yet is no slot: the pool of its GPU and
        type); for a counted row (CPU, memory, disk), every counted pool of
        its class."""
        if a.kind.counted:
            return list(self.counted.get(a.resource_class, ()))
        found = self.slots.get((a.kind, a.device_id))
        if found is not None:
            return [found[:2]]
        if a.kind is DeviceKind.MDEV:
            mdev = self.mdev_pools.get((a.detail.mdev_parent, a.detail.mdev_type))
            return [mdev] if mdev is not None else []
        return []

    def in_place(self, a: Assignment) -> bool:
        """The model puts the row where it is."""
        return any(uuid == a.provider_uuid and pool.resource_class == a.resource_class
                   and pool.kind is a.kind for uuid, pool in self.homes_of(a))


def misplaced(rows: list[Assignment], index: DeviceIndex) -> list[Assignment]:
    """The rows the model does not put where they are: only these can need
    aligning; the others are where the model says."""
    return [a for a in rows if not index.in_place(a)]


def realign(rows: list[Assignment], allocations: Allocations,
            index: DeviceIndex) -> Realignment:
    """The rows of ``rows`` to move, and those that cannot be placed (module
    docstring). A consumer absent from ``allocations`` is left alone: that
    Placement holds nothing of it here is reconciliation's business."""
    out = Realignment()
    by_consumer: dict[str, list[Assignment]] = defaultdict(list)
    for a in rows:
        by_consumer[a.consumer_uuid].append(a)
    for consumer, mine in sorted(by_consumer.items()):
        held = allocations.get(consumer)
        if not held:
            continue
        moved = []
        kept: dict[tuple[str, str], int] = defaultdict(int)
        for a in mine:
            if held.get(a.provider_uuid, {}).get(a.resource_class, 0) > 0:
                kept[(a.provider_uuid, a.resource_class)] += a.amount
                continue
            homes = [(uuid, pool) for uuid, pool in index.homes_of(a)
                     if held.get(uuid, {}).get(pool.resource_class, 0) > 0]
            if len(homes) == 1:
                moved.append((a, moved_row(a, *homes[0])))
            elif not homes:
                out.unaligned.append(Unaligned(a, "no provider of the model holds both "
                                                  "its device and the consumer's "
                                                  "allocation of it"))
            else:
                out.unaligned.append(Unaligned(a, f"{len(homes)} providers hold the "
                                                  "consumer's allocation of it: "
                                                  f"{', '.join(u for u, _ in homes)}"))
        out.moved += _within_amounts(moved, kept, held, out.unaligned)
    return out


def moved_row(a: Assignment, uuid: str, pool: Pool) -> Assignment:
    """The row as a claim from ``pool`` would have recorded it."""
    if pool.kind.counted:
        return a.with_(provider_uuid=uuid, resource_class=pool.resource_class,
                       kind=pool.kind, device_id=counted_device_id(pool),
                       detail=DeviceDetail(pool.numa_node))
    slot = next((s for s in pool.slots if s.device_id == a.device_id), None)
    return a.with_(provider_uuid=uuid, resource_class=pool.resource_class,
                   detail=a.detail if slot is None else slot_detail(pool, slot))


def _within_amounts(moved: list[tuple[Assignment, Assignment]],
                    kept: dict[tuple[str, str], int], held: Mapping[str, Mapping[str, int]],
                    unaligned: list[Unaligned]) -> list[tuple[Assignment, Assignment]]:
    """The moves that leave no (provider, class) with rows for more than
    the consumer holds there; the moves into one that would are unaligned."""
    into: dict[tuple[str, str], list[tuple[Assignment, Assignment]]] = defaultdict(list)
    for old, new in moved:
        into[(new.provider_uuid, new.resource_class)].append((old, new))
    out = []
    for (uuid, rc), pairs in sorted(into.items()):
        allocated = held[uuid][rc]
        rows_amount = kept[(uuid, rc)] + sum(new.amount for _, new in pairs)
        if rows_amount <= allocated:
            out += pairs
            continue
        unaligned += [Unaligned(old, f"its store rows would hold {rows_amount} {rc} on "
                                     f"{uuid}, where the consumer holds {allocated}")
                      for old, _ in pairs]
    return out
