"""Rebuilding a lost store from what outlived it (pure).

Two records survive a lost store: each guest's definition, whose metadata
names for every device its assignment id, kind and device id (a VF's or
PCI device's address, an mdev's UUID, a namespace, a pinned CPU, a NUMA
cell), and Placement's allocations, which name for every consumer the
provider and class of each amount. Matching a guest's device to the one
allocation whose provider's pool holds that device gives back the
assignment row: provider, class, kind, device, amount.

What they do not hold, and so what is not rebuilt: moves in flight (a
migration's record, its source devices and old flavor), builds not yet
defined as a guest, and assignments in state "claiming". Any of those
shows up as an allocation no guest explains, or a guest no allocation
explains, and the rebuild is refused, changing nothing. Which of a cell's
two counted rows (VCPU, MEMORY_MB) carried which id is not recorded
either; those ids only label amounts, and are paired in sorted order.
Root DISK_GB rows never reach a guest's metadata and get new ids.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from agent.claim_model import Assignment, AssignmentState, Owner
from agent.claims import Pool, slot_detail
from agent.exception import AgentError
from drivers.base import DeviceDetail, DeviceKind, GuestDevice, GuestSpec

# consumer uuid -> provider uuid -> resource class -> amount
Allocations = Mapping[str, Mapping[str, Mapping[str, int]]]


class RebuildRefused(AgentError):
    """What cannot be rebuilt, one problem a line; nothing was written."""

    def __init__(self, problems: list[str]):
        super().__init__(problems)
        self.problems = problems

    def __str__(self) -> str:
        return "\n".join(self.problems)


@dataclass(frozen=True)
class RebuiltStore:
    instances: dict[str, dict]  # uuid -> spec payload
    assignments: list[Assignment]


def plan_rebuild(guests: Mapping[str, GuestSpec], allocations: Allocations,
                 pools: Mapping[str, Mapping[str, Pool]], boot_id: str,
                 new_id: Callable[[], str]) -> RebuiltStore:
    """The store's rows, or RebuildRefused listing everything that cannot
    be mapped."""
    problems: list[str] = []
    for consumer in sorted(set(allocations) - set(guests)):
        problems.append(f"consumer {consumer}: holds allocations on this host's "
                        "providers but no guest of ours is defined for it (a move "
                        "or a build in flight?)")
    for uuid in sorted(set(guests) - set(allocations)):
        problems.append(f"guest {uuid}: no allocation on this host's providers "
                        "in Placement")
    instances: dict[str, dict] = {}
    rows: list[Assignment] = []
    for uuid in sorted(set(guests) & set(allocations)):
        guest = guests[uuid]
        found = _guest_rows(guest, allocations[uuid], pools, boot_id, new_id, problems)
        instances[uuid] = {"name": guest.name, "vcpus": guest.vcpus,
                           "memory_mb": guest.memory_mb}
        rows.extend(found)
    if problems:
        raise RebuildRefused(problems)
    return RebuiltStore(instances, sorted(rows, key=lambda a: a.id))


def _guest_rows(guest: GuestSpec, allocation: Mapping[str, Mapping[str, int]],
                pools: Mapping[str, Mapping[str, Pool]], boot_id: str,
                new_id: Callable[[], str], problems: list[str]) -> list[Assignment]:
    where = f"guest {guest.instance_uuid}"
    left: dict[tuple[str, str], int] = {}
    for provider, resources in allocation.items():
        for rc, amount in resources.items():
            if rc not in pools.get(provider, {}):
                problems.append(f"{where}: allocation of {amount} {rc} on provider "
                                f"{provider}, which has no such pool on this host")
            else:
                left[(provider, rc)] = amount
    rows: list[Assignment] = []

    def row(key: tuple[str, str], assignment_id: str, device_id: str, amount: int,
            slot=None) -> None:
        pool = pools[key[0]][key[1]]
        detail = (slot_detail(pool, slot) if slot else
                  DeviceDetail(pool.numa_node, mdev_parent=pool.mdev_parent,
                               mdev_type=pool.mdev_type))
        rows.append(Assignment(assignment_id, guest.instance_uuid, guest.instance_uuid,
                               Owner.INSTANCE, None, key[1], key[0], pool.kind, device_id,
                               amount, AssignmentState.CLAIMED, boot_id, detail))

    counted: list[GuestDevice] = []
    for device in guest.devices:
        if device.kind is DeviceKind.NUMA:
            counted.append(device)
            continue
        matches = [(key, slot) for key in left
                   if left[key] > 0 and pools[key[0]][key[1]].kind is device.kind
                   for slot in pools[key[0]][key[1]].slots
                   if slot.device_id == device.device_id]
        if len(matches) != 1:
            problems.append(f"{where}: {device.kind.value} {device.device_id} "
                            f"(assignment {device.assignment_id}) matches "
                            f"{len(matches)} of its allocations' devices, not one")
            continue
        key, slot = matches[0]
        left[key] -= 1
        row(key, device.assignment_id, device.device_id, 1, slot)

    for cell in sorted({d.device_id for d in counted}):
        ids = sorted(d.assignment_id for d in counted if d.device_id == cell)
        keys = sorted(k for k in left if left[k] > 0
                      and pools[k[0]][k[1]].kind is DeviceKind.NUMA
                      and str(pools[k[0]][k[1]].numa_node) == cell)
        if len(ids) != len(keys):
            problems.append(f"{where}: {len(ids)} NUMA cell {cell} entries in its "
                            f"metadata, {len(keys)} counted allocations on that cell")
            continue
        for assignment_id, key in zip(ids, keys):
            row(key, assignment_id, cell, left.pop(key))

    for key, amount in sorted(left.items()):
        pool = pools[key[0]][key[1]]
        if amount and pool.kind is DeviceKind.NUMA and pool.numa_node is None:
            row(key, new_id(), "host", amount)  # root inventory: never in a guest
        elif amount:
            problems.append(f"{where}: {amount} {key[1]} allocated on provider "
                            f"{key[0]} that its metadata does not account for")
    return rows
