"""Claims, pure: what can be assigned behind each provider, how a claim
request is checked, and which concrete devices it gets.

No I/O and no locks here: the tracker calls ``choose`` under its lock with
the set of devices that live assignments hold, and those that guests on the
host hold whatever the store says (compute_agent/claims/veto.py).
"""
from __future__ import annotations

import random
import uuid as uuid_lib
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar, Protocol

import os_resource_classes as orc

from compute_agent.drivers.base import DeviceDetail, DeviceKind, GuestDevice, HostResource, device_resources
from compute_agent.exception import ClaimFailed, InvalidRequest

MAX_AMOUNT = 1 << 20
# The classes a guest's vCPUs are allocated as: shared, and dedicated.
CPU_CLASSES = (orc.VCPU, orc.PCPU)


@dataclass(frozen=True)
class Slot:
    """One device that can be assigned whole."""

    device_id: str
    numa_node: int | None = None
    size_bytes: int = 0
    dev_path: str | None = None


@dataclass(frozen=True)
class Pool:
    """What stands behind one resource class of one provider.

    Exclusive pools hand out slots (a VF, a namespace, a pinned CPU, an
    mdev). Counted pools (VCPU, MEMORY_MB, DISK_GB) only record amounts:
    Placement already bounds them, and the guest needs just the cell."""

    provider_name: str
    resource_class: str
    kind: DeviceKind
    capacity: int
    slots: tuple[Slot, ...] = ()
    numa_node: int | None = None
    # MDEV pools: the parent GPU and type, to create mdevs beyond the slots.
    mdev_parent: str | None = None
    mdev_type: str | None = None
    # Devices out of service for their health (compute_agent/health/rules.py):
    # slots never chosen, and an MDEV pool whose parent is here creates no
    # mdev. Whoever holds one keeps it.
    unhealthy: frozenset[str] = frozenset()
    # One-time-use slots ([pci] device_spec one_time_use): a claim marks
    # them used, and used they are chosen no more until cleaned
    # (compute_agent/cleaning/).
    one_time_use: frozenset[str] = frozenset()

    @property
    def exclusive(self) -> bool:
        return not self.kind.counted

    @cached_property
    def ordered_slots(self) -> tuple[Slot, ...]:
        """The slots by device id: the order choices are made in."""
        return tuple(sorted(self.slots, key=lambda s: s.device_id))


@dataclass(frozen=True)
class Choice:
    provider_uuid: str
    resource_class: str
    kind: DeviceKind
    device_id: str
    amount: int = 1
    detail: DeviceDetail = field(default_factory=DeviceDetail)


def slot_detail(pool: Pool, slot: Slot) -> DeviceDetail:
    """What a guest definition needs of a device besides its id."""
    return DeviceDetail(slot.numa_node, slot.size_bytes or None, slot.dev_path,
                        pool.mdev_parent, pool.mdev_type)


def slot_resources(pool: Pool, slot: Slot) -> frozenset[HostResource]:
    """What a guest given this slot holds on the host, as a domain's XML
    names it: a PCI address, an mdev UUID, a namespace's device path, a
    host CPU."""
    cpus = frozenset({int(slot.device_id)}) if pool.kind is DeviceKind.PCPU else frozenset()
    return device_resources(GuestDevice("", pool.kind, slot.device_id, cpus=cpus,
                                        detail=slot_detail(pool, slot)))


class HeldDevice(Protocol):
    """What the held set reads of a device given back: a Choice or an
    Assignment."""

    @property
    def provider_uuid(self) -> str: ...
    @property
    def resource_class(self) -> str: ...
    @property
    def kind(self) -> DeviceKind: ...
    @property
    def device_id(self) -> str: ...


@dataclass(frozen=True)
class Wanted:
    provider_uuid: str
    resource_class: str
    amount: int


def parse_allocations(allocations: object, pools: Mapping[str, Mapping[str, Pool]],
                      field_name: str = "allocations") -> list[Wanted]:
    """Check a consumer's allocations (Placement's shape) against our pools.
    Raises InvalidRequest naming the field and the value."""
    if not isinstance(allocations, dict) or not allocations:
        raise InvalidRequest(field_name, allocations, "must be a non-empty object "
                             "of provider uuid -> {resources: {class: amount}}")
    wanted = []
    for provider, body in sorted(allocations.items()):
        where = f"{field_name}.{provider}"
        if provider not in pools:
            raise InvalidRequest(where, provider, "not a resource provider of this host")
        resources = body.get("resources") if isinstance(body, dict) else None
        if not isinstance(resources, dict) or not resources:
            raise InvalidRequest(f"{where}.resources", resources,
                                 "must be a non-empty object of class -> amount")
        for rc, amount in sorted(resources.items()):
            if not isinstance(rc, str) or not (rc in orc.STANDARDS or orc.is_custom(rc)):
                raise InvalidRequest(f"{where}.resources", rc, "unknown resource class")
            pool = pools[provider].get(rc)
            if pool is None:
                raise InvalidRequest(f"{where}.resources.{rc}", rc,
                                     "this provider has no inventory of that class")
            if (not isinstance(amount, int) or isinstance(amount, bool)
                    or not 0 < amount <= MAX_AMOUNT):
                raise InvalidRequest(f"{where}.resources.{rc}", amount,
                                     "must be a whole number from 1")
            if amount > pool.capacity:
                raise InvalidRequest(f"{where}.resources.{rc}", amount,
                                     f"more than the provider's {pool.capacity}")
            wanted.append(Wanted(provider, rc, amount))
    return wanted


def device_identity(kind: DeviceKind, device_id: str) -> tuple[str, str]:
    """What makes a device one device on this host, whatever provider or
    class it was claimed under (a NIC whose class changed, a device whose
    provider moved with the tree mode): its PCI address, whole device or
    VF alike (a vGPU VF too); its mdev UUID; its namespace; its CPU number."""
    return ("pci" if kind in (DeviceKind.PCI, DeviceKind.VF, DeviceKind.VGPU_VF)
            else kind.value, device_id)


@dataclass
class HeldDevices:
    """Devices held by live assignments: each by its identity on the host,
    which is what makes it exclusive, and per (provider uuid, class), which
    is what a pool has given out."""

    by_pool: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    devices: set[tuple[str, str]] = field(default_factory=set)

    def held(self, provider_uuid: str, rc: str) -> set[str]:
        return self.by_pool.setdefault((provider_uuid, rc), set())

    def is_held(self, kind: DeviceKind, device_id: str) -> bool:
        return device_identity(kind, device_id) in self.devices

    def take(self, items: Iterable[HeldDevice]) -> None:
        """``items``: choices or assignments."""
        for c in items:
            if not c.kind.counted:
                self.held(c.provider_uuid, c.resource_class).add(c.device_id)
                self.devices.add(device_identity(c.kind, c.device_id))

    def give_back(self, items: Iterable[HeldDevice]) -> None:
        """``items``: choices or assignments."""
        for c in items:
            if not c.kind.counted:
                self.held(c.provider_uuid, c.resource_class).discard(c.device_id)
                self.devices.discard(device_identity(c.kind, c.device_id))


def new_mdev_uuid() -> str:
    # From the process's PRNG (seeded from the OS, reseeded at fork): an
    # mdev's name needs to be unique on this host, not secret, and
    # os.urandom would drop the GIL inside the tracker's lock, so that
    # 32 claimers queue on it.
    return str(uuid_lib.UUID(int=random.getrandbits(128), version=4))


def counted_device_id(pool: Pool) -> str:
    """The device id every claim from a counted pool records: its NUMA
    cell, or "host" for amounts of no cell."""
    return "host" if pool.numa_node is None else str(pool.numa_node)


@dataclass(frozen=True)
class Taken:
    """What no claim may be given now: the devices live assignments hold
    (``held``), whatever the host's guests hold, the store aside
    (``vetoed``: compute_agent/claims/veto.py), and the devices not cleaned
    since their last use (``used``), which keep out while their pool says
    they are one-time-use."""

    held: HeldDevices = field(default_factory=HeldDevices)
    vetoed: frozenset[HostResource] = frozenset()
    used: Container[str] = frozenset()


def _choose_from(pool: Pool, wanted: Wanted, taken: Taken, earlier: set[str],
                 prefer_numa: int | None) -> list[Choice]:
    """``earlier``: devices of this pool chosen earlier in the same claim."""
    provider_uuid, amount = wanted.provider_uuid, wanted.amount
    held, vetoed, used = taken.held, taken.vetoed, taken.used
    if not pool.exclusive:
        return [Choice(provider_uuid, pool.resource_class, pool.kind,
                       counted_device_id(pool), amount, DeviceDetail(pool.numa_node))]
    # NUMA-local first, then the others; each in the order of device ids.
    local: list[Slot] = []
    others: list[Slot] = []
    for s in pool.ordered_slots:
        if (s.device_id not in earlier and s.device_id not in pool.unhealthy
                and not (s.device_id in pool.one_time_use and s.device_id in used)
                and not held.is_held(pool.kind, s.device_id)
                and not (vetoed and slot_resources(pool, s) & vetoed)):
            (local if s.numa_node == prefer_numa else others).append(s)
            if len(local) == amount:
                break
    chosen = [Choice(provider_uuid, pool.resource_class, pool.kind, s.device_id, 1,
                     slot_detail(pool, s))
              for s in (local + others)[:amount]]
    if pool.kind is not DeviceKind.MDEV or len(chosen) == amount:
        return _met(chosen, provider_uuid, pool, amount)
    # An mdev that does not exist yet is created, within the capacity
    # Placement was told about; existing free ones always go first. An
    # mdev a guest holds that the store does not takes its unit too.
    vetoed_only = sum(1 for s in pool.slots if not held.is_held(pool.kind, s.device_id)
                      and vetoed and slot_resources(pool, s) & vetoed)
    room = (pool.capacity - len(held.held(provider_uuid, pool.resource_class))
            - len(earlier) - len(chosen) - vetoed_only)
    while len(chosen) < amount and room > 0 and pool.mdev_parent not in pool.unhealthy:
        chosen.append(Choice(provider_uuid, pool.resource_class, pool.kind,
                             new_mdev_uuid(), 1,
                             DeviceDetail(pool.numa_node, mdev_parent=pool.mdev_parent,
                                          mdev_type=pool.mdev_type)))
        room -= 1
    return _met(chosen, provider_uuid, pool, amount)


def _met(chosen: list[Choice], provider_uuid: str, pool: Pool, amount: int) -> list[Choice]:
    if len(chosen) < amount:
        raise ClaimFailed(provider_uuid, pool.resource_class, amount, len(chosen))
    return chosen


def instance_cell(wanted: list[Wanted], pools: Mapping[str, Mapping[str, Pool]]
                  ) -> int | None:
    """The cell the instance's CPUs and memory come from; failing that, the
    cell of any device it asked for."""
    located = [pools[w.provider_uuid][w.resource_class] for w in wanted]
    located = [p for p in located if p.numa_node is not None]
    compute = [p for p in located if p.kind in (DeviceKind.NUMA, DeviceKind.PCPU)]
    return next((p.numa_node for p in compute + located), None)


def choose(wanted: list[Wanted], pools: Mapping[str, Mapping[str, Pool]],
           taken: Taken, prefer_numa: int | None = None) -> list[Choice]:
    """Concrete devices for every wanted amount, none of them ``taken``
    (which is not changed), or ClaimFailed naming the first resource that
    cannot be met."""
    if prefer_numa is None:
        prefer_numa = instance_cell(wanted, pools)
    out: list[Choice] = []
    for w in wanted:
        pool = pools[w.provider_uuid][w.resource_class]
        # Rare: the same pool named twice.
        earlier = {c.device_id for c in out
                   if (c.provider_uuid, c.resource_class) == (w.provider_uuid,
                                                              w.resource_class)}
        out.extend(_choose_from(pool, w, taken, earlier, prefer_numa))
    return out


@dataclass(frozen=True)
class InstanceSpec:
    """What the agent needs to know of an instance besides its devices."""

    name: str
    vcpus: int
    memory_mb: int

    LIMITS: ClassVar[dict[str, int]] = {"vcpus": 4096, "memory_mb": 1 << 24}

    @classmethod
    def from_payload(cls, payload: object, field_name: str = "spec") -> InstanceSpec:
        if not isinstance(payload, dict):
            raise InvalidRequest(field_name, payload, "must be an object")
        name = payload.get("name")
        if not isinstance(name, str) or not 0 < len(name) <= 255 or not name.isprintable():
            raise InvalidRequest(f"{field_name}.name", name,
                                 "must be 1 to 255 printable characters")
        values: dict[str, int] = {}
        for key, limit in cls.LIMITS.items():
            value = payload.get(key)
            if (not isinstance(value, int) or isinstance(value, bool)
                    or not 0 < value <= limit):
                raise InvalidRequest(f"{field_name}.{key}", value,
                                     f"must be a whole number from 1 to {limit}")
            values[key] = value
        return cls(name, **values)

    def to_payload(self) -> dict[str, Any]:
        return {"name": self.name, "vcpus": self.vcpus, "memory_mb": self.memory_mb}


def carried(resources: Iterable[Mapping[str, int]]) -> tuple[int, int]:
    """The vCPUs (VCPU plus PCPU) and the memory (MEMORY_MB) that
    allocations carry, summed over their providers, each given as its
    class -> amount: wherever the tree mode puts them (the root, NUMA
    cells, both)."""
    vcpus = memory_mb = 0
    for by_class in resources:
        vcpus += sum(by_class.get(rc, 0) for rc in CPU_CLASSES)
        memory_mb += by_class.get(orc.MEMORY_MB, 0)
    return vcpus, memory_mb


def check_spec_carried(spec: InstanceSpec, resources: Iterable[Mapping[str, int]]
                       ) -> None:
    """A spec asks for the vCPUs and memory its allocations carry, no more
    and no less: the guest is defined from the spec and Placement counts
    the allocations, so any difference is CPU or memory that Placement does
    not know is in use, or holds for nothing. InvalidRequest names the
    fields that differ, their values and what the allocations carry."""
    vcpus, memory_mb = carried(resources)
    differ = [(name, mine, theirs, classes) for name, mine, theirs, classes in (
        ("spec.vcpus", spec.vcpus, vcpus, "VCPU plus PCPU"),
        ("spec.memory_mb", spec.memory_mb, memory_mb, "MEMORY_MB")) if mine != theirs]
    if differ:
        raise InvalidRequest(
            ", ".join(d[0] for d in differ), None,
            "must equal what the allocations carry on this host's providers: "
            + ", ".join(f"{classes} {theirs}" for _, _, theirs, classes in differ),
            ", ".join(str(d[1]) for d in differ))
