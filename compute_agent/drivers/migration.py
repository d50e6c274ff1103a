"""What a destination claimed for an incoming live migration: for each
device of the guest on the source, the device that takes its place on the
destination. Pure data with a strict JSON-friendly form, because it travels
between agents over RPC; the driver rewrites the guest's definition from it.

Each move names both sides whole (assignment id, kind, device id, and the
detail a definition needs: a namespace's backing path, an mdev's parent and
type, a pinned CPU's number), so the source can check that the target was
made for the devices its guest holds now, and the rewrite needs nothing else.
"""
from __future__ import annotations

import json
import uuid as uuid_lib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from compute_agent.drivers.base import (
    DeviceDetail,
    DeviceKind,
    GuestDevice,
    GuestSpec,
    HostResource,
    device_resources,
)
from compute_agent.drivers.errors import InvalidMigrationTarget

_DEVICE_KEYS = frozenset({"assignment_id", "kind", "device_id", "amount", "cpus",
                          "detail"})


def device_to_dict(device: GuestDevice) -> dict:
    """A guest device as JSON-friendly values; ``cpus`` sorted, ``detail``
    only its known fields."""
    return {"assignment_id": device.assignment_id,
            "kind": DeviceKind(device.kind).value,
            "device_id": device.device_id,
            "amount": device.amount,
            "cpus": sorted(device.cpus),
            "detail": _detail_to_dict(device.detail)}


def device_from_dict(obj: object, field: str) -> GuestDevice:
    """Read what ``device_to_dict`` wrote. Raises InvalidMigrationTarget
    naming the first field that is missing, unknown or of the wrong type."""
    body = _object(obj, field, _DEVICE_KEYS)
    try:
        kind = DeviceKind(body["kind"])
    except ValueError:
        raise InvalidMigrationTarget(f"{field}.kind", body["kind"],
                                     f"not one of {[k.value for k in DeviceKind]}"
                                     ) from None
    amount = body["amount"]
    if type(amount) is not int or amount < 1:
        raise InvalidMigrationTarget(f"{field}.amount", amount,
                                     "must be a whole number from 1")
    cpus = body["cpus"]
    if not isinstance(cpus, list) or any(type(c) is not int or c < 0 for c in cpus):
        raise InvalidMigrationTarget(f"{field}.cpus", cpus,
                                     "must be a list of CPU numbers")
    if len(set(cpus)) != len(cpus):
        raise InvalidMigrationTarget(f"{field}.cpus", cpus, "names a CPU twice")
    if (kind is DeviceKind.PCPU) != bool(cpus):
        raise InvalidMigrationTarget(f"{field}.cpus", cpus,
                                     "pinned CPUs (kind pcpu) name their CPUs; "
                                     "no other kind has any")
    return GuestDevice(_name(body["assignment_id"], f"{field}.assignment_id"), kind,
                       _name(body["device_id"], f"{field}.device_id"), amount,
                       frozenset(cpus), _detail_from_dict(body["detail"],
                                                          f"{field}.detail"))


@dataclass(frozen=True)
class ClaimedDevice:
    """One device as a side of a move holds it, with the resource class it
    was allocated under: what pairs a source's device with a destination's."""

    resource_class: str
    device: GuestDevice

    def to_dict(self) -> dict:
        return {"resource_class": self.resource_class,
                "device": device_to_dict(self.device)}

    @classmethod
    def from_dict(cls, obj: object, field: str) -> ClaimedDevice:
        body = _object(obj, field, frozenset({"resource_class", "device"}))
        return cls(_name(body["resource_class"], f"{field}.resource_class"),
                   device_from_dict(body["device"], f"{field}.device"))


@dataclass(frozen=True)
class DeviceMove:
    """A device of the guest on the source and the one that replaces it."""

    source: GuestDevice
    destination: GuestDevice

    def to_dict(self) -> dict:
        return {"source": device_to_dict(self.source),
                "destination": device_to_dict(self.destination)}

    @classmethod
    def from_dict(cls, obj: object, field: str) -> DeviceMove:
        body = _object(obj, field, frozenset({"source", "destination"}))
        return cls(device_from_dict(body["source"], f"{field}.source"),
                   device_from_dict(body["destination"], f"{field}.destination"))


@dataclass(frozen=True)
class LiveMigrationTarget:
    """Every device of one guest, moved. A source assignment appears once."""

    instance_uuid: str
    moves: tuple[DeviceMove, ...] = ()

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for i, move in enumerate(self.moves):
            if move.source.assignment_id in seen:
                raise InvalidMigrationTarget(
                    f"moves[{i}].source.assignment_id", move.source.assignment_id,
                    "moved twice")
            seen.add(move.source.assignment_id)

    def destination_resources(self) -> frozenset[HostResource]:
        """What the guest holds exclusively on the destination once moved."""
        return frozenset().union(*(device_resources(m.destination)
                                   for m in self.moves))

    def to_dict(self) -> dict:
        return {"instance_uuid": self.instance_uuid,
                "moves": [m.to_dict() for m in self.moves]}

    @classmethod
    def from_dict(cls, obj: object, field: str = "target") -> LiveMigrationTarget:
        """Raises InvalidMigrationTarget naming the first bad field."""
        body = _object(obj, field, frozenset({"instance_uuid", "moves"}))
        instance_uuid = body["instance_uuid"]
        try:
            canonical = str(uuid_lib.UUID(instance_uuid))
        except (TypeError, ValueError, AttributeError):
            canonical = None
        if canonical != instance_uuid:
            raise InvalidMigrationTarget(f"{field}.instance_uuid", instance_uuid,
                                         "must be a UUID in canonical form")
        moves = body["moves"]
        if not isinstance(moves, list):
            raise InvalidMigrationTarget(f"{field}.moves", moves, "must be a list")
        parsed = tuple(DeviceMove.from_dict(m, f"{field}.moves[{i}]")
                       for i, m in enumerate(moves))
        try:
            return cls(instance_uuid, parsed)
        except InvalidMigrationTarget as e:
            raise InvalidMigrationTarget(f"{field}.{e.field}", e.value,
                                         "moved twice") from None

    @classmethod
    def identity(cls, instance_uuid: str,
                 devices: Iterable[GuestDevice]) -> LiveMigrationTarget:
        """Every device in its own place: a move that changes nothing."""
        return cls(instance_uuid, tuple(DeviceMove(d, d) for d in devices))


def moved_guest(guest: GuestSpec, target: LiveMigrationTarget) -> GuestSpec:
    """The guest as it runs on the destination: each of its devices replaced
    by its move's destination device. Raises InvalidMigrationTarget when the
    target is another guest's, or its sources are not exactly the guest's
    devices (a target made for devices the guest no longer holds)."""
    if target.instance_uuid != guest.instance_uuid:
        raise InvalidMigrationTarget("target.instance_uuid", target.instance_uuid,
                                     f"the guest is {guest.instance_uuid}")
    moves = {m.source.assignment_id: m for m in target.moves}
    for i, device in enumerate(guest.devices):
        move = moves.get(device.assignment_id)
        if move is None or move.source != device:
            raise InvalidMigrationTarget(
                f"guest.devices[{i}]", device.assignment_id,
                "no move of the target replaces this device as the guest holds it")
    held = {d.assignment_id for d in guest.devices}
    extra = sorted(set(moves) - held)
    if extra:
        raise InvalidMigrationTarget("target.moves", extra[0],
                                     "moves a device the guest does not hold")
    return GuestSpec(guest.instance_uuid, guest.name, guest.vcpus, guest.memory_mb,
                     tuple(moves[d.assignment_id].destination for d in guest.devices))


def pair_devices(instance_uuid: str, source: Sequence[ClaimedDevice],
                 destination: Sequence[ClaimedDevice]) -> LiveMigrationTarget:
    """Each source device with the destination's device of the same resource
    class and kind: within one class and kind, in the order of their device
    ids (CPU and cell numbers as numbers), so the i-th pinned CPU stays the
    i-th. Raises InvalidMigrationTarget when a class and kind has not as
    many devices on both sides, or paired devices differ in amount."""
    sources = _grouped(source)
    destinations = _grouped(destination)
    moves = []
    for key in sorted(sources.keys() | destinations.keys()):
        here, there = sources.get(key, []), destinations.get(key, [])
        if len(here) != len(there):
            raise InvalidMigrationTarget(
                "destination", f"{key[0]} {key[1]}",
                f"the source holds {len(here)} of it, the destination "
                f"claimed {len(there)}")
        for s, d in zip(here, there):
            if s.amount != d.amount:
                raise InvalidMigrationTarget(
                    "destination", f"{key[0]} {key[1]} {d.device_id}",
                    f"amount {d.amount} for the source's {s.amount}")
            moves.append(DeviceMove(s, d))
    return LiveMigrationTarget(instance_uuid, tuple(moves))


def _grouped(devices: Sequence[ClaimedDevice]
             ) -> dict[tuple[str, str], list[GuestDevice]]:
    groups: dict[tuple[str, str], list[GuestDevice]] = {}
    for c in devices:
        groups.setdefault((c.resource_class, DeviceKind(c.device.kind).value),
                          []).append(c.device)
    return {key: sorted(group, key=lambda d: _id_order(d.device_id))
            for key, group in groups.items()}


def _id_order(device_id: str) -> tuple[int, int, str]:
    return (0, int(device_id), "") if device_id.isdigit() else (1, 0, device_id)


def _object(obj: object, field: str, keys: frozenset[str]) -> dict:
    if not isinstance(obj, dict):
        raise InvalidMigrationTarget(field, obj, "must be an object")
    unknown = sorted(set(obj) - keys, key=str)
    if unknown:
        raise InvalidMigrationTarget(f"{field}.{unknown[0]}", obj[unknown[0]],
                                     f"unknown key; the keys are {sorted(keys)}")
    missing = sorted(keys - set(obj))
    if missing:
        raise InvalidMigrationTarget(f"{field}.{missing[0]}", None, "missing")
    return obj


def _name(value: object, field: str) -> str:
    if not isinstance(value, str) or not value or value.strip() != value \
            or not value.isprintable():
        raise InvalidMigrationTarget(field, value,
                                     "must be non-empty printable text without "
                                     "surrounding blanks")
    return value


def _detail_to_dict(detail: DeviceDetail) -> dict:
    return {name: value for name, value in vars(detail).items()
            if value is not None}


def _detail_from_dict(obj: object, field: str) -> DeviceDetail:
    if not isinstance(obj, dict):
        raise InvalidMigrationTarget(field, obj, "must be an object")
    try:
        # DeviceDetail's own reader checks each field's name and type.
        return DeviceDetail.from_json(json.dumps(obj))
    except ValueError as e:
        raise InvalidMigrationTarget(field, obj, str(e)) from None
