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

The matching of a guest's devices to its allocations (``GuestRows``) is
shared with adoption (compute_agent/store/adoption.py), which reads the devices from a
foreign guest's domain instead of from our metadata.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from compute_agent.claims.choice import Choice, Pool, Slot, slot_detail
from compute_agent.claims.model import Allocations, Assignment, AssignmentState, Owner
from compute_agent.drivers.base import DeviceDetail, DeviceKind, GuestDevice, GuestSpec
from compute_agent.store.errors import RebuildRefused


@dataclass(frozen=True)
class RebuiltStore:
    instances: dict[str, dict]  # uuid -> spec payload
    assignments: list[Assignment]


@dataclass(frozen=True)
class HeldDevice:
    """A device a guest holds, as the guest names it: our metadata's entry
    (a rebuild), or a resource its domain holds (an adoption)."""

    kinds: frozenset[DeviceKind]
    device_id: str  # a slot's device id, or with ``by_path`` its device path
    by_path: bool = False
    assignment_id: str | None = None  # None: the row gets a new id

    def is_slot(self, pool: Pool, slot: Slot) -> bool:
        return pool.kind in self.kinds and self.device_id == (
            slot.dev_path if self.by_path else slot.device_id)

    def describe(self) -> str:
        kinds = "/".join(sorted(k.value for k in self.kinds))
        held = f"{kinds} {self.device_id}"
        return held + (f" (assignment {self.assignment_id})" if self.assignment_id else "")


@dataclass(frozen=True)
class RowSource:
    """What the rows made for this host's guests come from besides the
    guests and their allocations: the model's pools, by provider uuid; the
    host's boot id, which the rows carry; and where a row that needs a new
    assignment id gets it."""

    pools: Mapping[str, Mapping[str, Pool]]
    boot_id: str
    new_id: Callable[[], str]


# The classes the agent counts and Placement bounds: an allocation of one
# on a provider the model no longer gives it to is an amount, of no device.
COUNTED_CLASSES = frozenset({"VCPU", "MEMORY_MB", "DISK_GB"})


class GuestRows:
    """One guest's assignment rows, matched against its allocation on this
    host's providers; what does not match is added to ``problems``.

    ``stranded``: an allocation of a class on a provider whose model pool
    is elsewhere (nova's root VCPU or PCPU, before heal moves it) stays
    where Placement has it; a device it holds is looked up in the model's
    pools of that class, and a counted class is an amount of the host."""

    def __init__(self, instance_uuid: str, allocation: Mapping[str, Mapping[str, int]],
                 rows_from: RowSource, problems: list[str], stranded: bool = False):
        self.instance_uuid = instance_uuid
        self.where = f"guest {instance_uuid}"
        self.rows_from = rows_from
        self.pools = rows_from.pools
        self.problems = problems
        self.stranded = stranded
        self.rows: list[Assignment] = []
        self.left: dict[tuple[str, str], int] = {}
        for provider, resources in allocation.items():
            for rc, amount in resources.items():
                if rc in self.pools.get(provider, {}) or (
                        stranded and (rc in COUNTED_CLASSES or self._homes(rc))):
                    self.left[(provider, rc)] = amount
                else:
                    problems.append(f"{self.where}: allocation of {amount} {rc} on "
                                    f"provider {provider}, which has no such pool on "
                                    "this host")

    def _homes(self, rc: str) -> list[Pool]:
        return [by_rc[rc] for by_rc in self.pools.values() if rc in by_rc]

    def _pools_of(self, key: tuple[str, str]) -> list[Pool]:
        pool = self.pools.get(key[0], {}).get(key[1])
        return [pool] if pool is not None else self._homes(key[1])

    def _add(self, matched: Choice, assignment_id: str | None) -> None:
        """The row of a device or amount ``matched`` to its allocation;
        ``assignment_id`` None: a new one."""
        self.rows.append(Assignment(
            assignment_id or self.rows_from.new_id(), self.instance_uuid, self.instance_uuid,
            Owner.INSTANCE, None, matched.resource_class, matched.provider_uuid,
            matched.kind, matched.device_id, matched.amount, AssignmentState.CLAIMED,
            self.rows_from.boot_id, matched.detail))

    def device(self, held: HeldDevice) -> None:
        """The one allocation whose pools hold this device."""
        matches = [(key, pool, slot) for key in self.left if self.left[key] > 0
                   for pool in self._pools_of(key) if pool.exclusive
                   for slot in pool.slots if held.is_slot(pool, slot)]
        if len(matches) != 1:
            self.problems.append(f"{self.where}: {held.describe()} matches "
                                 f"{len(matches)} of its allocations' devices, not one")
            return
        key, pool, slot = matches[0]
        self.left[key] -= 1
        self._add(Choice(*key, pool.kind, slot.device_id, 1, slot_detail(pool, slot)),
                  held.assignment_id)

    def new_mdev(self, held: HeldDevice) -> bool:
        """An mdev that no longer exists (a host reboot removes them) of a
        stopped guest: it is created again at its start, from the one mdev
        pool its allocation names. False when there is not exactly one."""
        keys = [key for key in self.left if self.left[key] > 0
                for pool in self._pools_of(key) if pool.kind is DeviceKind.MDEV]
        if len(keys) != 1:
            return False
        pool = self._pools_of(keys[0])[0]
        self.left[keys[0]] -= 1
        self._add(Choice(*keys[0], DeviceKind.MDEV, held.device_id, 1,
                         DeviceDetail(pool.numa_node, mdev_parent=pool.mdev_parent,
                                      mdev_type=pool.mdev_type)), held.assignment_id)
        return True

    def cells(self, entries: list[GuestDevice]) -> None:
        """Our metadata's NUMA entries: each cell's ids label its counted
        allocations, paired in sorted order."""
        for cell in sorted({d.device_id for d in entries}):
            ids = sorted(d.assignment_id for d in entries if d.device_id == cell)
            keys = sorted(k for k in self.left if self.left[k] > 0
                          and (pool := self.pools.get(k[0], {}).get(k[1])) is not None
                          and pool.kind is DeviceKind.NUMA
                          and str(pool.numa_node) == cell)
            if len(ids) != len(keys):
                self.problems.append(f"{self.where}: {len(ids)} NUMA cell {cell} entries "
                                     f"in its metadata, {len(keys)} counted allocations "
                                     "on that cell")
                continue
            for assignment_id, key in zip(ids, keys):
                pool = self.pools[key[0]][key[1]]
                self._add(Choice(*key, DeviceKind.NUMA, cell, self.left.pop(key),
                                 DeviceDetail(pool.numa_node)), assignment_id)

    def rest(self, cells_too: bool) -> list[Assignment]:
        """Every amount left: the host's counted resources (and with
        ``cells_too`` a cell's) become rows; any other is a problem. The
        rows, sorted by id."""
        for key, amount in sorted(self.left.items()):
            if not amount:
                continue
            pool = self.pools.get(key[0], {}).get(key[1])
            if (pool is None and key[1] in COUNTED_CLASSES) or (
                    pool is not None and pool.kind.counted and pool.numa_node is None):
                self._add(Choice(*key, DeviceKind.HOST_RESOURCES, "host", amount), None)
            elif cells_too and pool is not None and pool.kind is DeviceKind.NUMA:
                self._add(Choice(*key, DeviceKind.NUMA, str(pool.numa_node), amount,
                                 DeviceDetail(pool.numa_node)), None)
            else:
                self.problems.append(f"{self.where}: {amount} {key[1]} allocated on "
                                     f"provider {key[0]} that no device it holds "
                                     "accounts for")
        return self.rows


def plan_rebuild(guests: Mapping[str, GuestSpec], allocations: Allocations,
                 rows_from: RowSource) -> RebuiltStore:
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
        matched = GuestRows(uuid, allocations[uuid], rows_from, problems)
        for device in guest.devices:
            if device.kind is not DeviceKind.NUMA:
                matched.device(HeldDevice(frozenset({device.kind}), device.device_id,
                                          assignment_id=device.assignment_id))
        matched.cells([d for d in guest.devices if d.kind is DeviceKind.NUMA])
        instances[uuid] = {"name": guest.name, "vcpus": guest.vcpus,
                           "memory_mb": guest.memory_mb}
        rows.extend(matched.rest(cells_too=False))
    if problems:
        raise RebuildRefused(problems)
    return RebuiltStore(instances, sorted(rows, key=lambda a: a.id))
