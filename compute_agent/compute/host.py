"""This host as every kind of move step sees it: the tracker (the claims,
on disk), the driver (the guests), and the steps the kinds of move share:
the guest defined from the store, the vGPU types written and cleared, the
devices given back, the move checked against the call that names it.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable

from compute_agent.claims.choice import InstanceSpec
from compute_agent.claims.model import (
    Assignment,
    Migration,
    MigrationRole,
    MigrationState,
    MoveKind,
    Owner,
)
from compute_agent.compute.checks import check_move_of, check_uuid
from compute_agent.compute.tracker import Tracker
from compute_agent.drivers.base import (
    DeviceKind,
    GuestDevice,
    GuestSpec,
    GuestState,
    device_resources,
)
from compute_agent.drivers.driver import ComputeDriver
from compute_agent.drivers.errors import DriverUnavailable, MdevError
from compute_agent.exception import DevicesInUse, InvalidRequest

LOG = logging.getLogger(__name__)


def in_guest(a: Assignment) -> bool:
    """Whether the guest's definition carries this assignment: the
    instance's own, except the host's resources, which have nothing to pin."""
    return a.owner is Owner.INSTANCE and a.kind is not DeviceKind.HOST_RESOURCES


def guest_spec(instance_uuid: str, spec: dict, rows: list[Assignment]) -> GuestSpec:
    """The guest as the driver defines it, from the instance's own
    (instance-owned) assignments."""
    devices = tuple(guest_device(a) for a in rows if in_guest(a))
    s = InstanceSpec.from_payload(spec)
    return GuestSpec(instance_uuid, s.name, s.vcpus, s.memory_mb, devices)


def guest_device(a: Assignment) -> GuestDevice:
    return GuestDevice(
        a.id, a.kind, a.device_id, a.amount,
        cpus=frozenset({int(a.device_id)}) if a.kind is DeviceKind.PCPU
        else frozenset(),
        detail=a.detail)


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


def live_conflicts(state: GuestState | None, rows: list[Assignment]) -> list[str]:
    """The devices among ``rows`` that a running guest still uses, by its
    live definition: by assignment id, or by the host resource itself."""
    if state is None or not state.running:
        return []
    return [f"{a.kind.value} {a.device_id}" for a in rows
            if a.id in state.live
            or device_resources(guest_device(a)) & state.live_resources]


def move_agrees(m: Migration, instance_uuid: str, roles: tuple[MigrationRole, ...],
                kinds: tuple[MoveKind, ...]) -> Migration:
    """``m``, once it is checked to move this instance, with this host
    playing one of ``roles`` in a move of one of ``kinds``."""
    check_move_of(m, instance_uuid)
    if m.role not in roles:
        raise InvalidRequest("migration_uuid", m.uuid,
                             f"this host is the move's {m.role.value}, not its "
                             f"{' or '.join(r.value for r in roles)}")
    if m.kind not in kinds:
        raise InvalidRequest("migration_uuid", m.uuid,
                             f"is a {m.kind.value}, not a "
                             f"{' or '.join(k.value for k in kinds)}")
    return m


class Host:
    """What every kind of move step shares. Devices are given back only once
    no running guest uses them: a guest whose devices change is stopped
    first, since libvirt cannot change a running guest's devices by
    redefining it."""

    def __init__(self, tracker: Tracker, driver: ComputeDriver,
                 remove_released_mdevs: bool = False) -> None:
        self.tracker = tracker
        self.driver = driver
        self.remove_released_mdevs = remove_released_mdevs

    def get_instance(self, instance_uuid: str) -> dict:
        spec, rows, moves = self.tracker.instance(instance_uuid)
        guest = self.driver.guest_state(instance_uuid)
        running = guest is not None and guest.running
        return {"uuid": instance_uuid, "spec": spec, "assignments": describe(rows),
                "migrations": [describe_migration(m) for m in moves],
                "running": running,
                # What the guest will start with, and what it runs with.
                "definition": self.driver.guest_definition(instance_uuid),
                "live_definition": (self.driver.guest_definition(instance_uuid, live=True)
                                    if running else None)}

    def read_guests(self) -> None:
        """What every guest on the host holds, read now and given to the
        tracker, before a claim chooses: none of it is chosen, whatever the
        store says. Cheap: the driver reads again only the guests that
        changed (docs/benchmarks.md)."""
        self.tracker.set_guests(self.driver.guest_holdings())

    def guest(self, instance_uuid: str) -> GuestSpec:
        spec, rows, _ = self.tracker.instance(instance_uuid)
        return guest_spec(instance_uuid, spec, rows)

    def redefine_guest(self, instance_uuid: str) -> None:
        """Define the guest again from the store; a running guest keeps its
        live devices until it is next started."""
        self.driver.update_guest(self.guest(instance_uuid))

    def run_with_store_devices(self, instance_uuid: str) -> None:
        """The guest runs with exactly the devices the store gives it: one
        running on others is stopped, then defined and started."""
        guest = self.guest(instance_uuid)
        state = self.driver.guest_state(instance_uuid)
        wanted = frozenset(d.assignment_id for d in guest.devices)
        if state is not None and state.running and state.live != wanted:
            self.driver.power_off(instance_uuid)
        self.driver.spawn(guest)

    def check_not_in_use(self, instance_uuid: str, rows: list[Assignment]) -> None:
        """Raise DevicesInUse, giving nothing back, when the instance's
        running guest still holds any of ``rows``."""
        busy = live_conflicts(self.driver.guest_state(instance_uuid), rows)
        if busy:
            raise DevicesInUse(instance_uuid, busy)

    def release_devices(self, released: list[Assignment]) -> None:
        if self.remove_released_mdevs:
            for a in released:
                if a.kind is DeviceKind.MDEV:
                    self.driver.remove_mdev(a.device_id)
        self.clear_vgpu_types(released)

    def take_vgpu_types(self, devices: Iterable[Assignment | GuestDevice]) -> None:
        """Each claimed vGPU VF given its type now, before the claim is
        answered: a VF the driver refuses fails the claim, whose caller
        gives it back."""
        for d in devices:
            if d.kind is DeviceKind.VGPU_VF:
                self.driver.set_vgpu_type(d.device_id, d.detail.mdev_type or "")

    def clear_vgpu_types(self, released: list[Assignment]) -> None:
        """A vGPU VF given back loses the type it was claimed with once no
        live assignment holds it (0 written; remove_released_mdevs does not
        apply: a type kept would narrow what its siblings can create); a
        VF with another type (a claim its driver refused) is left as it
        is. A refusal is logged: the VF then stays typed, and a claim of
        another type on it fails cleanly."""
        for a in released:
            if a.kind is not DeviceKind.VGPU_VF or self.tracker.holds(a.kind, a.device_id):
                continue
            try:
                self.driver.clear_vgpu_type(a.device_id, a.detail.mdev_type or "")
            except (MdevError, DriverUnavailable) as e:
                LOG.warning("vGPU VF %s given back keeps its type: %s", a.device_id, e)

    def claimed_by_move(self, m: Migration) -> list[Assignment]:
        """The devices a move claimed here for its instance; none once the
        instance is gone from this host (a retried revert)."""
        if not self.tracker.knows(m.instance_uuid):
            return []
        return self.migration_rows(m, Owner.INSTANCE)

    def claim_move(self, kind: MoveKind, migration_uuid: str, instance_uuid: str,
                   spec: dict, allocations: dict) -> list[Assignment]:
        """A resize's or an evacuation's claim at its destination, once the
        guests are read, its vGPU VFs typed before it is answered."""
        self.read_guests()
        rows = self.tracker.claim_move(kind, migration_uuid, instance_uuid, spec, allocations)
        try:
            self.take_vgpu_types(rows)
        except Exception:
            self._give_back_refused_move(migration_uuid)
            raise
        return rows

    def _give_back_refused_move(self, migration_uuid: str) -> None:
        """A move's claim whose vGPU VFs did not all take their types,
        given back whole: the store as before, the VFs written so far
        cleared."""
        m = self.tracker.migration(migration_uuid)
        claimed = self.claimed_by_move(m)
        if m.role is MigrationRole.DESTINATION and m.state is MigrationState.ACTIVE:
            self.tracker.withdraw_move(m.uuid)
        else:
            self.tracker.revert_move(m.uuid)
        self.clear_vgpu_types(claimed)

    def migration(self, migration_uuid: str, instance_uuid: str,
                  roles: tuple[MigrationRole, ...],
                  kinds: tuple[MoveKind, ...] = tuple(MoveKind)) -> Migration:
        """The migration, once it is known here, is of this instance, and
        this host plays one of ``roles`` in it; InvalidRequest otherwise."""
        return move_agrees(self.tracker.migration(migration_uuid), instance_uuid,
                           roles, kinds)

    def known_migration(self, migration_uuid: str, instance_uuid: str,
                        roles: tuple[MigrationRole, ...],
                        kinds: tuple[MoveKind, ...]) -> Migration | None:
        """Like migration, for a step that may be the first this host hears of
        the move: None when the migration is not known here yet."""
        migration_uuid = check_uuid(migration_uuid, "migration_uuid")
        try:
            m = self.tracker.migration(migration_uuid)
        except InvalidRequest:
            return None
        return move_agrees(m, instance_uuid, roles, kinds)

    def migration_rows(self, m: Migration, owner: Owner) -> list[Assignment]:
        _, rows, _ = self.tracker.instance(m.instance_uuid)
        return [a for a in rows if a.owner is owner and a.migration_uuid == m.uuid]
