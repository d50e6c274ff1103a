"""What each conductor request does on this host: claim under the tracker's
lock, then drive the hypervisor outside it, then record the outcome.

Every step is idempotent, keyed on the instance and migration uuids, so a
conductor may retry after a timeout. Placement allocations stay the
conductor's business, as in nova.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from agent.claim_model import (Assignment, Migration, MigrationRole, MigrationState,
                               MoveKind, Owner)
from agent.claims import InstanceSpec
from agent.exception import DevicesInUse, InvalidRequest, MoveInProgress
from agent.tracker import Tracker, check_uuid
from drivers.base import (ComputeDriver, DeviceKind, GuestDevice, GuestSpec, GuestState,
                          device_resources)

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


def move_agrees(m: Migration, instance_uuid, roles: tuple[MigrationRole, ...],
                kinds: tuple[MoveKind, ...]) -> Migration:
    """``m``, once it is checked to move this instance, with this host
    playing one of ``roles`` in a move of one of ``kinds``."""
    instance_uuid = check_uuid(instance_uuid, "instance_uuid")
    if m.instance_uuid != instance_uuid:
        raise InvalidRequest("instance_uuid", instance_uuid,
                             f"migration {m.uuid} moves instance {m.instance_uuid}")
    if m.role not in roles:
        raise InvalidRequest("migration_uuid", m.uuid,
                             f"this host is the move's {m.role.value}, not its "
                             f"{' or '.join(r.value for r in roles)}")
    if m.kind not in kinds:
        raise InvalidRequest("migration_uuid", m.uuid,
                             f"is a {m.kind.value}, not a "
                             f"{' or '.join(k.value for k in kinds)}")
    return m


class ComputeManager:
    """Each move step first checks that the migration, the instance and
    this host's part in the move agree, and only then changes anything.
    Devices are given back only once no running guest uses them: a guest
    whose devices change is stopped first, since libvirt cannot change a
    running guest's devices by redefining it."""

    def __init__(self, tracker: Tracker, driver: ComputeDriver,
                 remove_released_mdevs: bool = False):
        self.tracker = tracker
        self.driver = driver
        self.remove_released_mdevs = remove_released_mdevs
        # The evacuations some thread is building now (finish_rebuild).
        self._rebuilding: set[str] = set()
        self._rebuilding_lock = threading.Lock()

    # --- views ----------------------------------------------------------

    def get_instance(self, instance_uuid) -> dict:
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

    def redefine_guest(self, instance_uuid: str) -> None:
        """Define the guest again from the store; a running guest keeps its
        live devices until it is next started."""
        self.driver.update_guest(self._guest(instance_uuid))

    def _guest(self, instance_uuid: str) -> GuestSpec:
        spec, rows, _ = self.tracker.instance(instance_uuid)
        return guest_spec(instance_uuid, spec, rows)

    def _run_with_store_devices(self, instance_uuid: str) -> None:
        """The guest runs with exactly the devices the store gives it: one
        running on others is stopped, then defined and started."""
        guest = self._guest(instance_uuid)
        state = self.driver.guest_state(instance_uuid)
        wanted = frozenset(d.assignment_id for d in guest.devices)
        if state is not None and state.running and state.live != wanted:
            self.driver.power_off(instance_uuid)
        self.driver.spawn(guest)

    def _check_not_in_use(self, instance_uuid: str, rows: list[Assignment]) -> None:
        """Raise DevicesInUse, giving nothing back, when the instance's
        running guest still holds any of ``rows``."""
        busy = live_conflicts(self.driver.guest_state(instance_uuid), rows)
        if busy:
            raise DevicesInUse(instance_uuid, busy)

    def _release_devices(self, released: list[Assignment]) -> None:
        if self.remove_released_mdevs:
            for a in released:
                if a.kind is DeviceKind.MDEV:
                    self.driver.remove_mdev(a.device_id)

    def _move(self, migration_uuid, instance_uuid, roles: tuple[MigrationRole, ...],
              kinds: tuple[MoveKind, ...] = tuple(MoveKind)) -> Migration:
        """The migration, once it is known here, is of this instance, and
        this host plays one of ``roles`` in it; InvalidRequest otherwise."""
        return move_agrees(self.tracker.migration(migration_uuid), instance_uuid,
                           roles, kinds)

    def _known_move(self, migration_uuid, instance_uuid,
                    roles: tuple[MigrationRole, ...],
                    kinds: tuple[MoveKind, ...]) -> Migration | None:
        """Like _move, for a step that may be the first this host hears of
        the move: None when the migration is not known here yet."""
        migration_uuid = check_uuid(migration_uuid, "migration_uuid")
        try:
            m = self.tracker.migration(migration_uuid)
        except InvalidRequest:
            return None
        return move_agrees(m, instance_uuid, roles, kinds)

    def _migration_rows(self, m: Migration, owner: Owner) -> list[Assignment]:
        _, rows, _ = self.tracker.instance(m.instance_uuid)
        return [a for a in rows if a.owner is owner and a.migration_uuid == m.uuid]

    # --- build and delete -----------------------------------------------

    def build_instance(self, instance_uuid, spec, allocations) -> dict:
        self.tracker.claim_build(instance_uuid, spec, allocations)
        try:
            self.driver.spawn(self._guest(instance_uuid))
        except Exception as e:
            # The caller gets the error; its traceback is logged where it is
            # answered (the RPC layer), once.
            LOG.warning("Spawning %s failed (%s); giving its devices back",
                        instance_uuid, e)
            self.driver.destroy(instance_uuid)
            self._release_devices(self.tracker.release_instance(instance_uuid))
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
        """Source: the migration takes over the instance's devices here, and
        the guest stops (nova's migrate_disk_and_power_off)."""
        self._known_move(migration_uuid, instance_uuid,
                         (MigrationRole.SOURCE, MigrationRole.BOTH), (MoveKind.RESIZE,))
        rows = self.tracker.begin_move_source(MoveKind.RESIZE, migration_uuid,
                                              instance_uuid)
        self.driver.power_off(instance_uuid)
        return {"migration_uuid": migration_uuid, "assignments": describe(rows)}

    def finish_resize(self, migration_uuid, instance_uuid) -> dict:
        """Destination: the guest runs with its new devices."""
        m = self._move(migration_uuid, instance_uuid,
                       (MigrationRole.DESTINATION, MigrationRole.BOTH), (MoveKind.RESIZE,))
        if m.state is MigrationState.REVERTED:
            raise InvalidRequest("migration_uuid", m.uuid, "this move was reverted")
        self._run_with_store_devices(m.instance_uuid)
        self.tracker.finish_move(m.uuid)
        return self.get_instance(m.instance_uuid)

    def confirm_resize(self, migration_uuid, instance_uuid) -> dict:
        """Source: give back the old devices; a guest that left is removed
        first. On the same host the guest must already run on its new
        devices."""
        m = self._move(migration_uuid, instance_uuid, tuple(MigrationRole))
        if m.role is MigrationRole.SOURCE:
            self.driver.destroy(m.instance_uuid)
        elif m.state not in (MigrationState.CONFIRMED, MigrationState.REVERTED):
            self._check_not_in_use(m.instance_uuid,
                                   self._migration_rows(m, Owner.MIGRATION))
        self._release_devices(self.tracker.confirm_move(m.uuid))
        return {"migration_uuid": m.uuid, "state": "confirmed"}

    def revert_resize(self, migration_uuid, instance_uuid) -> dict:
        """Either side: new devices back, old ones to the instance. A guest
        running on the new devices stops before they are given back."""
        m = self._move(migration_uuid, instance_uuid, tuple(MigrationRole))
        return self._revert(m)

    def _revert(self, m: Migration) -> dict:
        if m.role is MigrationRole.DESTINATION:
            self.driver.destroy(m.instance_uuid)
            self._release_devices(self.tracker.revert_move(m.uuid))
            return {"migration_uuid": m.uuid, "instance": None}
        if m.state not in (MigrationState.CONFIRMED, MigrationState.REVERTED):
            new = self._migration_rows(m, Owner.INSTANCE)
            if live_conflicts(self.driver.guest_state(m.instance_uuid), new):
                self.driver.power_off(m.instance_uuid)
                # Read again: a guest still on them keeps them.
                self._check_not_in_use(m.instance_uuid, new)
        self.tracker.revert_move(m.uuid)
        self._run_with_store_devices(m.instance_uuid)
        return {"migration_uuid": m.uuid, "instance": self.get_instance(m.instance_uuid)}

    # --- live migration -------------------------------------------------

    def check_can_live_migrate_destination(self, migration_uuid, instance_uuid, spec,
                                           allocations) -> dict:
        """Destination: claim now; the source needs these devices to
        rewrite the guest's XML."""
        self._known_move(migration_uuid, instance_uuid, (MigrationRole.DESTINATION,),
                         (MoveKind.LIVE_MIGRATION,))
        self.tracker.claim_move(MoveKind.LIVE_MIGRATION, migration_uuid, instance_uuid,
                                spec, allocations)
        guest = self._guest(instance_uuid)
        return {"migration_uuid": migration_uuid,
                "devices": [{"assignment_id": d.assignment_id, "kind": d.kind.value,
                             "device_id": d.device_id} for d in guest.devices]}

    def live_migrate(self, migration_uuid, instance_uuid) -> dict:
        """Source: hand the devices to the migration. Once the conductor
        reports success, confirm_resize on the source gives them back."""
        self._known_move(migration_uuid, instance_uuid, (MigrationRole.SOURCE,),
                         (MoveKind.LIVE_MIGRATION,))
        rows = self.tracker.begin_move_source(MoveKind.LIVE_MIGRATION, migration_uuid,
                                              instance_uuid)
        return {"migration_uuid": migration_uuid, "assignments": describe(rows)}

    def post_live_migration_at_destination(self, migration_uuid, instance_uuid) -> dict:
        """Destination: the guest runs here, defined with our devices. There
        is no going back after this, so the move is settled here too."""
        m = self._move(migration_uuid, instance_uuid, (MigrationRole.DESTINATION,),
                       (MoveKind.LIVE_MIGRATION,))
        if m.state is MigrationState.REVERTED:
            raise InvalidRequest("migration_uuid", m.uuid, "this move was rolled back")
        self._run_with_store_devices(m.instance_uuid)
        self.tracker.finish_move(m.uuid)
        self.tracker.confirm_move(m.uuid)
        return self.get_instance(m.instance_uuid)

    def rollback_live_migration_at_destination(self, migration_uuid,
                                               instance_uuid) -> dict:
        m = self._move(migration_uuid, instance_uuid, (MigrationRole.DESTINATION,),
                       (MoveKind.LIVE_MIGRATION,))
        return self._revert(m)

    # --- evacuation -----------------------------------------------------

    def accept_rebuild(self, migration_uuid, instance_uuid, spec, allocations,
                       fence: Callable[[], None] | None = None) -> dict:
        """Destination of an evacuation: from the answer on, this host alone
        owns the rebuild. ``fence`` (raising when the source is up) is asked
        before a first accept, never on a retry of one. The migration record
        and the claim are on disk before this returns; the guest is built by
        finish_rebuild (here, or by resume_rebuilds after a crash). An
        instance that already runs here is not evacuated here."""
        known = self._known_move(migration_uuid, instance_uuid,
                                 (MigrationRole.DESTINATION,), (MoveKind.EVACUATION,))
        if known is None:
            if not self.tracker.knows(instance_uuid) \
                    and self.driver.guest_state(instance_uuid) is not None:
                # An instance the store knows is refused by the claim, once
                # its allocations are checked; a guest it does not know, here.
                raise InvalidRequest("instance_uuid", instance_uuid,
                                     "has a guest on this host; an evacuation "
                                     "rebuilds it on another")
            if fence is not None:
                fence()
        rows = self.tracker.claim_move(MoveKind.EVACUATION, migration_uuid,
                                       instance_uuid, spec, allocations)
        return {"migration_uuid": migration_uuid, "instance_uuid": instance_uuid,
                "accepted": True, "assignments": describe(rows)}

    def finish_rebuild(self, migration_uuid) -> dict | None:
        """Build the accepted instance's guest on its claimed devices and
        settle the move. One at a time per move: None when another thread
        is at it already."""
        m = self.tracker.migration(migration_uuid)
        with self._rebuilding_lock:
            if m.uuid in self._rebuilding:
                return None
            self._rebuilding.add(m.uuid)
        try:
            m = self.tracker.migration(m.uuid)  # as it is now that it is ours
            if m.state in UNSETTLED:
                self._run_with_store_devices(m.instance_uuid)
                self.tracker.finish_move(m.uuid)
                self.tracker.confirm_move(m.uuid)
            return self.get_instance(m.instance_uuid)
        finally:
            with self._rebuilding_lock:
                self._rebuilding.discard(m.uuid)

    def rebuild_instance(self, migration_uuid, instance_uuid, spec, allocations,
                         fence: Callable[[], None] | None = None) -> dict:
        """Accept, build and settle in one call (API 1.0's rebuild)."""
        self.accept_rebuild(migration_uuid, instance_uuid, spec, allocations, fence)
        done = self.finish_rebuild(migration_uuid)
        if done is None:  # another thread is building it: let it finish
            raise MoveInProgress(instance_uuid, migration_uuid)
        return done

    def resume_rebuilds(self) -> list[str]:
        """Build every accepted rebuild that no thread is building: after a
        crash, a restart, or a spawn that failed. Returns the moves resumed;
        each failure is logged, and the next pass tries again."""
        _, _, moves = self.tracker.snapshot()
        with self._rebuilding_lock:
            todo = interrupted_rebuilds(moves.values(), self._rebuilding)
        done = []
        for m in todo:
            try:
                if self.finish_rebuild(m.uuid) is not None:
                    LOG.info("Evacuation %s of instance %s resumed: guest built, "
                             "move completed", m.uuid, m.instance_uuid)
                    done.append(m.uuid)
            except Exception as e:  # one rebuild must not stop the others
                LOG.warning("Evacuation %s of instance %s not resumed yet: %s",
                            m.uuid, m.instance_uuid, e)
        return done


# An evacuation's destination settles its move in two commits, finish then
# confirm; a crash may fall between them.
UNSETTLED = (MigrationState.ACTIVE, MigrationState.FINISHED)


def interrupted_rebuilds(moves, in_flight: set[str]) -> list[Migration]:
    """The evacuations accepted here, not yet settled, that no thread builds."""
    return sorted((m for m in moves
                   if m.kind is MoveKind.EVACUATION and m.role is MigrationRole.DESTINATION
                   and m.state in UNSETTLED and m.uuid not in in_flight),
                  key=lambda m: m.uuid)
