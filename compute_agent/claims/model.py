"""The claim model (pure): who holds a device (an assignment) and the moves that
pass devices between holders (migrations), with the closed sets of values
each takes.

The enums are str-valued: the store's text columns and the RPC answers
carry their values, the same strings as before they were typed.
"""
from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from compute_agent.drivers.base import DeviceDetail, DeviceKind

# Placement's allocations as the store's planners read them: consumer uuid
# -> provider uuid -> resource class -> amount.
Allocations = Mapping[str, Mapping[str, Mapping[str, int]]]


class Owner(str, enum.Enum):
    """Whom an assignment holds its device for. During a move the side
    being left is held by the migration (nova's allocation swap)."""

    INSTANCE = "instance"
    MIGRATION = "migration"


class AssignmentState(str, enum.Enum):
    CLAIMING = "claiming"  # chosen and recorded; the guest may not have it yet
    CLAIMED = "claimed"  # the guest has it
    RELEASED = "released"  # given back; kept only until its instance is forgotten

    @property
    def live(self) -> bool:
        """Whether the device is still held."""
        return self is not AssignmentState.RELEASED


class MoveKind(str, enum.Enum):
    RESIZE = "resize"  # resize and cold migration
    LIVE_MIGRATION = "live_migration"
    EVACUATION = "evacuation"


class MigrationRole(str, enum.Enum):
    """Which side of a move this host is."""

    SOURCE = "source"
    DESTINATION = "destination"
    BOTH = "both"  # a move within this host


class MigrationState(str, enum.Enum):
    # A live migration's source was told of the move (check_can_live_migrate_
    # source) before the conductor swapped the allocations; nothing has
    # started here: the instance still holds its devices, its guest runs.
    ANNOUNCED = "announced"
    ACTIVE = "active"
    FINISHED = "finished"  # the destination's guest runs with its new devices
    CONFIRMED = "confirmed"
    REVERTED = "reverted"


class UseState(str, enum.Enum):
    """A one-time-use device ([pci] device_spec one_time_use) once a claim
    chose it: used until it is cleaned (compute_agent/cleaning/), which gives it
    back; a failed cleaning keeps it until cleaned again or released by
    an operator."""

    USED = "used"
    CLEANING_FAILED = "cleaning_failed"


@dataclass(frozen=True)
class DeviceUse:
    """A one-time-use device not clean since a claim chose it, by its PCI
    address; ``reason``: why its last cleaning failed."""

    address: str
    state: UseState = UseState.USED
    reason: str = ""


@dataclass(frozen=True)
class Assignment:
    id: str
    consumer_uuid: str
    instance_uuid: str
    owner: Owner
    migration_uuid: str | None
    resource_class: str
    provider_uuid: str
    kind: DeviceKind
    device_id: str
    amount: int
    state: AssignmentState
    boot_id: str
    detail: DeviceDetail = field(default=DeviceDetail(), compare=False, hash=False)

    def with_(self, **changes: Any) -> Assignment:
        return replace(self, **changes)


def digest(value: object) -> str:
    """A digest of a JSON value, the same for equal values whatever the
    order of their keys: 128 bits of SHA-256."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class RequestDigest:
    """What the call that made a record (a build's instance, a move) asked
    for, recorded with it: a digest of each field of its payload, canonical
    and checked, the uuids that name the record aside. A later call naming
    the record is its retry only when every digest matches; the fields
    whose digests differ are what it changed. A spec is digested key by
    key, so that the field named is ``spec.vcpus``, not ``spec``."""

    digests: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, **fields: object) -> RequestDigest:
        flat: dict[str, object] = {}
        for name, value in fields.items():
            if name == "spec" and isinstance(value, dict):
                flat.update({f"spec.{k}": v for k, v in value.items()})
            else:
                flat[name] = value
        return cls(tuple(sorted((k, digest(v)) for k, v in flat.items())))

    def differing(self, asked: RequestDigest) -> list[str]:
        """The fields, sorted, that ``asked`` has other than this record."""
        mine, theirs = dict(self.digests), dict(asked.digests)
        return sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))

    def to_json(self) -> str:
        return json.dumps(dict(self.digests), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> RequestDigest | None:
        """None for a record made before requests were recorded (store
        schema 6)."""
        if text is None:
            return None
        return cls(tuple(sorted(json.loads(text).items())))


@dataclass(frozen=True)
class Migration:
    uuid: str
    instance_uuid: str
    kind: MoveKind
    role: MigrationRole
    state: MigrationState
    old_spec: dict[str, Any] | None = None  # the spec to restore on revert
    # The call that made the record here (None: made before schema 6).
    request: RequestDigest | None = None

    @property
    def open(self) -> bool:
        """Still in progress here. A destination whose guest runs with its
        new devices is settled (a revert can still come, and is honoured);
        a source keeps its old devices until confirm or revert, and owns
        an announced move's instance until the move starts or ends."""
        if self.role is MigrationRole.DESTINATION:
            return self.state is MigrationState.ACTIVE
        return self.state in (MigrationState.ANNOUNCED, MigrationState.ACTIVE,
                              MigrationState.FINISHED)
