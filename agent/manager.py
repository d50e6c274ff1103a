"""What each conductor request does on this host: claim under the tracker's
lock, then drive the hypervisor outside it, then record the outcome.

Every step is idempotent, keyed on the instance and migration uuids, so a
conductor may retry after a timeout. Placement allocations stay the
conductor's business, as in nova.
"""
from __future__ import annotations

import logging

from agent.claim_model import Assignment, Migration, MigrationRole, MoveKind, Owner
from agent.claims import InstanceSpec
from agent.tracker import Tracker
from drivers.base import ComputeDriver, DeviceKind, GuestDevice, GuestSpec

LOG = logging.getLogger(__name__)


def in_guest(a: Assignment) -> bool:
    """Whether the guest's definition carries this assignment: the
    instance's own, except the host's resources, which have nothing to pin."""
    return a.owner is Owner.INSTANCE and a.kind is not DeviceKind.HOST_RESOURCES


def guest_spec(instance_uuid: str, spec: dict, rows: list[Assignment]) -> GuestSpec:
    """The guest as the driver defines it, from the instance's own
    (instance-owned) assignments."""
    devices = []
    for a in filter(in_guest, rows):
        devices.append(GuestDevice(
            a.id, a.kind, a.device_id, a.amount,
            cpus=frozenset({int(a.device_id)}) if a.kind is DeviceKind.PCPU
            else frozenset(),
            detail=a.detail))
    s = InstanceSpec.from_payload(spec)
    return GuestSpec(instance_uuid, s.name, s.vcpus, s.memory_mb, tuple(devices))


def kind_on_the_wire(kind: DeviceKind) -> str:
    """RPC answers (version 1.0) name the host's resources as they did
    before these had a kind of their own: NUMA, with device id 'host'."""
    return DeviceKind.NUMA.value if kind is DeviceKind.HOST_RESOURCES else kind.value


def describe(assignments: list[Assignment]) -> list[dict]:
    return [{"id": a.id, "owner": a.owner.value, "consumer_uuid": a.consumer_uuid,
             "migration_uuid": a.migration_uuid, "resource_class": a.resource_class,
             "provider_uuid": a.provider_uuid, "kind": kind_on_the_wire(a.kind),
             "device_id": a.device_id, "amount": a.amount, "state": a.state.value}
            for a in assignments]


def describe_migration(m: Migration) -> dict:
    return {"uuid": m.uuid, "kind": m.kind.value, "role": m.role.value,
            "state": m.state.value}


class ComputeManager:
    def __init__(self, tracker: Tracker, driver: ComputeDriver,
                 remove_released_mdevs: bool = False):
        self.tracker = tracker
        self.driver = driver
        self.remove_released_mdevs = remove_released_mdevs

    # --- views ----------------------------------------------------------

    def get_instance(self, instance_uuid) -> dict:
        spec, rows, moves = self.tracker.instance(instance_uuid)
        return {"uuid": instance_uuid, "spec": spec, "assignments": describe(rows),
                "migrations": [describe_migration(m) for m in moves],
                "running": self.driver.guest_is_running(instance_uuid),
                "definition": self.driver.guest_definition(instance_uuid)}

    def redefine_guest(self, instance_uuid: str) -> None:
        """Define the guest again from the store, keeping it running."""
        self.driver.update_guest(self._guest(instance_uuid))

    def _guest(self, instance_uuid: str) -> GuestSpec:
        spec, rows, _ = self.tracker.instance(instance_uuid)
        return guest_spec(instance_uuid, spec, rows)

    def _release_devices(self, released: list[Assignment]) -> None:
        if self.remove_released_mdevs:
            for a in released:
                if a.kind is DeviceKind.MDEV:
                    self.driver.remove_mdev(a.device_id)

    # --- build and delete -----------------------------------------------

    def build_instance(self, instance_uuid, spec, allocations) -> dict:
        self.tracker.claim_build(instance_uuid, spec, allocations)
        try:
            self.driver.spawn(self._guest(instance_uuid))
        except Exception:
            LOG.exception("Spawning %s failed; giving its devices back", instance_uuid)
            self._release_devices(self.tracker.release_instance(instance_uuid))
            self.driver.destroy(instance_uuid)
            raise
        self.tracker.complete(instance_uuid)
        return self.get_instance(instance_uuid)

    def delete_instance(self, instance_uuid) -> dict:
        self.driver.destroy(instance_uuid)
        self._release_devices(self.tracker.release_instance(instance_uuid))
        return {"uuid": instance_uuid, "deleted": True}

    # --- resize and cold migration --------------------------------------

    def prep_resize(self, migration_uuid, instance_uuid, spec, allocations) -> dict:
        """Destination: claim the new flavor's devices."""
        rows = self.tracker.claim_move(MoveKind.RESIZE, migration_uuid, instance_uuid,
                                       spec, allocations)
        return {"migration_uuid": migration_uuid, "assignments": describe(rows)}

    def resize_instance(self, migration_uuid, instance_uuid) -> dict:
        """Source: the migration takes over the instance's devices here."""
        rows = self.tracker.begin_move_source(MoveKind.RESIZE, migration_uuid,
                                              instance_uuid)
        return {"migration_uuid": migration_uuid, "assignments": describe(rows)}

    def finish_resize(self, migration_uuid, instance_uuid) -> dict:
        """Destination: the guest gets its new devices."""
        self.driver.spawn(self._guest(instance_uuid))
        self.tracker.finish_move(migration_uuid)
        return self.get_instance(instance_uuid)

    def confirm_resize(self, migration_uuid, instance_uuid) -> dict:
        """Source: give back the old devices; a guest that left is removed."""
        left = self.tracker.migration(migration_uuid).role is MigrationRole.SOURCE
        self._release_devices(self.tracker.confirm_move(migration_uuid))
        if left:
            self.driver.destroy(instance_uuid)
        return {"migration_uuid": migration_uuid, "state": "confirmed"}

    def revert_resize(self, migration_uuid, instance_uuid) -> dict:
        """Either side: new devices back, old ones to the instance."""
        role = self.tracker.migration(migration_uuid).role
        self.tracker.revert_move(migration_uuid)
        if role is MigrationRole.DESTINATION:
            self.driver.destroy(instance_uuid)
            return {"migration_uuid": migration_uuid, "instance": None}
        self.driver.spawn(self._guest(instance_uuid))
        return {"migration_uuid": migration_uuid,
                "instance": self.get_instance(instance_uuid)}

    # --- live migration -------------------------------------------------

    def check_can_live_migrate_destination(self, migration_uuid, instance_uuid, spec,
                                           allocations) -> dict:
        """Destination: claim now; the source needs these devices to
        rewrite the guest's XML."""
        self.tracker.claim_move(MoveKind.LIVE_MIGRATION, migration_uuid, instance_uuid,
                                spec, allocations)
        guest = self._guest(instance_uuid)
        return {"migration_uuid": migration_uuid,
                "devices": [{"assignment_id": d.assignment_id, "kind": d.kind.value,
                             "device_id": d.device_id} for d in guest.devices]}

    def live_migrate(self, migration_uuid, instance_uuid) -> dict:
        """Source: hand the devices to the migration. Once the conductor
        reports success, confirm_resize on the source gives them back."""
        rows = self.tracker.begin_move_source(MoveKind.LIVE_MIGRATION, migration_uuid,
                                              instance_uuid)
        return {"migration_uuid": migration_uuid, "assignments": describe(rows)}

    def post_live_migration_at_destination(self, migration_uuid, instance_uuid) -> dict:
        """Destination: the guest runs here, defined with our devices. There
        is no going back after this, so the move is settled here too."""
        self.driver.spawn(self._guest(instance_uuid))
        self.tracker.finish_move(migration_uuid)
        self.tracker.confirm_move(migration_uuid)
        return self.get_instance(instance_uuid)

    def rollback_live_migration_at_destination(self, migration_uuid,
                                               instance_uuid) -> dict:
        return self.revert_resize(migration_uuid, instance_uuid)

    # --- evacuation -----------------------------------------------------

    def rebuild_instance(self, migration_uuid, instance_uuid, spec, allocations) -> dict:
        """Destination of an evacuation: claimed under a migration record
        that is on disk before anything else happens, so a crash resumes
        here; then the guest is built and the move completed."""
        self.tracker.claim_move(MoveKind.EVACUATION, migration_uuid, instance_uuid,
                                spec, allocations)
        self.driver.spawn(self._guest(instance_uuid))
        self.tracker.finish_move(migration_uuid)
        self.tracker.confirm_move(migration_uuid)
        return self.get_instance(instance_uuid)
