"""What each conductor request does on this host: claim under the tracker's
lock, then drive the hypervisor outside it, then record the outcome.

Every step is idempotent, keyed on the instance and migration uuids, so a
conductor may retry after a timeout. Placement allocations stay the
conductor's business, as in nova.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from compute_agent.claims.choice import InstanceSpec
from compute_agent.claims.model import (
    Assignment,
    Migration,
    MigrationRole,
    MigrationState,
    MoveKind,
    Owner,
    RequestDigest,
)
from compute_agent.compute.tracker import Tracker, check_move_of, check_retry, check_uuid
from compute_agent.drivers.base import (
    DeviceKind,
    GuestDevice,
    GuestSpec,
    GuestState,
    MigrationFailure,
    device_resources,
)
from compute_agent.drivers.driver import ComputeDriver
from compute_agent.drivers.errors import (
    DriverUnavailable,
    InvalidMigrationTarget,
    LiveMigrationError,
    MdevError,
)
from compute_agent.drivers.migration import ClaimedDevice, LiveMigrationTarget, pair_devices
from compute_agent.exception import (
    DevicesInUse,
    InvalidRequest,
    LiveMigrationFailed,
    LiveMigrationRefused,
    MoveInProgress,
    RetryMismatch,
)
from compute_agent.moves.evacuation import evacuation_name_free_again
from compute_agent.moves.live_migration import (
    live_migratable_devices,
    mdev_refusals,
    mdev_type_refusals,
    pci_refusals,
)
from compute_agent.tree.device_spec import DeviceSpec

LOG = logging.getLogger(__name__)

# How often a resumed live migration looks whether the hypervisor still runs
# the migration this agent started before a restart.
EARLIER_MIGRATION_POLL_SECONDS = 0.5


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


def held_by_the_guest(a: Assignment, migration_uuid: str, moves: list[Migration]) -> bool:
    """Whether ``a`` is a device the guest holds, for the live migration
    ``migration_uuid`` to move: the instance's own (those a settled move
    brought here keep naming it: a cross-host resize's destination is never
    told of the confirm), or what the migration took over here."""
    if a.owner is Owner.MIGRATION:
        return a.migration_uuid == migration_uuid
    return a.migration_uuid is None or not any(m.uuid == a.migration_uuid and m.open
                                                for m in moves)


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


# The step that ends a move, by the state it leaves the move in.
ENDING_STEPS = {MigrationState.CONFIRMED: "confirm_resize",
                MigrationState.REVERTED: "revert_resize"}


def check_not_ended_otherwise(m: Migration, ends_as: MigrationState) -> None:
    """A move ends once, confirmed or reverted: the other step on a move
    ended one way is not a retry of that step, and is refused (answered
    from the record, it would claim a confirm that was a revert)."""
    if m.state in ENDING_STEPS and m.state is not ends_as:
        raise RetryMismatch(m.uuid, ["method"],
                            f"move {m.uuid} was {m.state.value} here "
                            f"({ENDING_STEPS[m.state]}), not {ends_as.value}")


class ComputeManager:
    """Each move step first checks that the migration, the instance and
    this host's part in the move agree, and only then changes anything.
    Devices are given back only once no running guest uses them: a guest
    whose devices change is stopped first, since libvirt cannot change a
    running guest's devices by redefining it."""

    def __init__(self, tracker: Tracker, driver: ComputeDriver,
                 remove_released_mdevs: bool = False,
                 device_specs: tuple[DeviceSpec, ...] = ()):
        self.tracker = tracker
        self.driver = driver
        self.remove_released_mdevs = remove_released_mdevs
        # [pci] device_spec: which whole devices may live-migrate.
        self.device_specs = device_specs
        self._lock = threading.Lock()
        # Live migrations this process is running as their source, and the
        # mdevs each incoming one created here (removed if it rolls back).
        self._migrating: set[str] = set()
        self._created_mdevs: dict[str, list[str]] = {}
        # The evacuations some thread is building now (finish_rebuild).
        self._rebuilding: set[str] = set()
        self._rebuilding_lock = threading.Lock()
        # The instances some thread is accepting for an evacuation now
        # (accept_rebuild): their allocations are here already, the
        # conductor's swap, while the fence waits the source out.
        self._accepting: set[str] = set()

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
        self._clear_vgpu_types(released)

    def _take_vgpu_types(self, devices) -> None:
        """Each claimed vGPU VF (``devices``: assignments or guest devices)
        given its type now, before the claim is answered: a VF the driver
        refuses fails the claim, whose caller gives it back."""
        for d in devices:
            if d.kind is DeviceKind.VGPU_VF:
                self.driver.set_vgpu_type(d.device_id, d.detail.mdev_type or "")

    def _clear_vgpu_types(self, released) -> None:
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

    def _claimed_by_move(self, m: Migration) -> list[Assignment]:
        """The devices a move claimed here for its instance; none once the
        instance is gone from this host (a retried revert)."""
        if not self.tracker.knows(m.instance_uuid):
            return []
        return self._migration_rows(m, Owner.INSTANCE)

    def _give_back_refused_move(self, migration_uuid: str) -> None:
        """A move's claim whose vGPU VFs did not all take their types,
        given back whole: the store as before, the VFs written so far
        cleared."""
        m = self.tracker.migration(migration_uuid)
        claimed = self._claimed_by_move(m)
        if m.role is MigrationRole.DESTINATION and m.state is MigrationState.ACTIVE:
            self.tracker.withdraw_move(m.uuid)
        else:
            self.tracker.revert_move(m.uuid)
        self._clear_vgpu_types(claimed)

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

    def read_guests(self) -> None:
        """What every guest on the host holds, read now and given to the
        tracker, before a claim chooses: none of it is chosen, whatever the
        store says. Cheap: the driver reads again only the guests that
        changed (docs/benchmarks.md)."""
        self.tracker.set_guests(self.driver.guest_holdings())

    def build_instance(self, instance_uuid, spec, allocations) -> dict:
        self.read_guests()
        self.tracker.claim_build(instance_uuid, spec, allocations)
        try:
            self.driver.spawn(self._guest(instance_uuid))
        except Exception as e:
            # The caller gets the error; its traceback is logged where it is
            # answered (the RPC layer), once.
            self._undo_failed_spawn(instance_uuid, e)
            raise
        self.tracker.complete(instance_uuid)
        return self.get_instance(instance_uuid)

    def _undo_failed_spawn(self, instance_uuid: str, error: Exception) -> None:
        """The guest of a failed spawn removed and its devices given back;
        but while the hypervisor does not answer, whether a guest was
        defined or even runs is unknown: the claim then stays, building,
        until the conductor's retry completes it or its delete gives it
        back (a device given back under a running guest would be handed
        out twice)."""
        try:
            self.driver.destroy(instance_uuid)
        except DriverUnavailable:
            LOG.warning("Spawning %s failed (%s); the hypervisor cannot say whether its "
                        "guest exists: its claim stays until the build is retried or the "
                        "instance deleted", instance_uuid, error)
            return
        LOG.warning("Spawning %s failed (%s); giving its devices back", instance_uuid, error)
        self._release_devices(self.tracker.release_instance(instance_uuid))

    def delete_instance(self, instance_uuid) -> dict:
        self.driver.destroy(instance_uuid)
        self._release_devices(self.tracker.release_instance(instance_uuid))
        return {"uuid": instance_uuid, "deleted": True}

    # --- resize and cold migration --------------------------------------

    def prep_resize(self, migration_uuid, instance_uuid, spec, allocations) -> dict:
        """Destination: claim the new flavor's devices."""
        self._known_move(migration_uuid, instance_uuid, tuple(MigrationRole),
                         (MoveKind.RESIZE,))
        self.read_guests()
        rows = self.tracker.claim_move(MoveKind.RESIZE, migration_uuid, instance_uuid,
                                       spec, allocations)
        try:
            self._take_vgpu_types(rows)
        except Exception:
            self._give_back_refused_move(migration_uuid)
            raise
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
        check_not_ended_otherwise(m, MigrationState.CONFIRMED)
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
        check_not_ended_otherwise(m, MigrationState.REVERTED)
        return self._revert(m)

    def _revert(self, m: Migration) -> dict:
        if m.role is MigrationRole.DESTINATION:
            self.driver.destroy(m.instance_uuid)
            claimed = self._claimed_by_move(m)
            self._release_devices(self.tracker.revert_move(m.uuid))
            self._clear_vgpu_types(claimed)
            return {"migration_uuid": m.uuid, "instance": None}
        if m.state not in (MigrationState.CONFIRMED, MigrationState.REVERTED):
            new = self._migration_rows(m, Owner.INSTANCE)
            if live_conflicts(self.driver.guest_state(m.instance_uuid), new):
                self.driver.power_off(m.instance_uuid)
                # Read again: a guest still on them keeps them.
                self._check_not_in_use(m.instance_uuid, new)
        claimed = self._claimed_by_move(m)
        self.tracker.revert_move(m.uuid)
        self._clear_vgpu_types(claimed)
        self._run_with_store_devices(m.instance_uuid)
        return {"migration_uuid": m.uuid, "instance": self.get_instance(m.instance_uuid)}

    # --- live migration -------------------------------------------------
    # The conductor (compute_agent.rpcapi.live_migrate_instance) drives: the source
    # records the move it is told of, before the allocations are swapped;
    # the destination claims and answers what it claimed; the source pairs
    # its devices with those, migrates the running guest and gives its
    # devices back once the hypervisor reports the guest gone; the
    # destination then settles its claim. On failure both sides roll back.

    def check_can_live_migrate_source(self, migration_uuid, instance_uuid,
                                      destination_host: str) -> dict:
        """Source, before the conductor swaps the allocations: refuse what
        cannot move from here (no such instance, a guest that does not run,
        a device that cannot migrate, another move), else record the move
        as announced, on disk before the answer. From then on the instance
        is this move's: a restart neither gives it up nor finds the
        migration's allocations unexplained. Nothing moves yet."""
        asked = RequestDigest.of(destination_host=destination_host)
        m = self._known_move(migration_uuid, instance_uuid, (MigrationRole.SOURCE,),
                             (MoveKind.LIVE_MIGRATION,))
        if m is not None:
            if m.state is MigrationState.REVERTED:
                raise InvalidRequest("migration_uuid", m.uuid, "this live migration "
                                     "was rolled back; start another")
            check_retry(m.request, asked, m.uuid,
                        f"move {m.uuid} was announced here by an earlier call")
            return {"migration_uuid": m.uuid, "state": m.state.value}
        _, rows, _ = self.tracker.instance(instance_uuid)
        state = self.driver.guest_state(instance_uuid)
        if state is None or not state.running:
            raise InvalidRequest("instance_uuid", instance_uuid,
                                 "its guest does not run here; a live migration "
                                 "moves a running guest")
        refusals = self._pci_refusals("source", [guest_device(a) for a in rows
                                                 if in_guest(a)])
        if refusals:
            raise LiveMigrationRefused(instance_uuid, MigrationRole.SOURCE, refusals)
        m = self.tracker.announce_move_source(MoveKind.LIVE_MIGRATION, migration_uuid,
                                              instance_uuid, asked)
        LOG.info("Live migration %s of instance %s to %s announced", m.uuid,
                 m.instance_uuid, destination_host)
        return {"migration_uuid": m.uuid, "state": m.state.value}

    def rollback_live_migration_at_source(self, migration_uuid, instance_uuid) -> dict:
        """Source: end the move; the instance keeps its devices here and its
        guest runs on. Refused once the guest has left (the move
        happened) or while this host is migrating it. A move never heard
        of here needs nothing: answered as rolled back."""
        m = self._known_move(migration_uuid, instance_uuid, (MigrationRole.SOURCE,),
                             (MoveKind.LIVE_MIGRATION,))
        if m is None:
            return {"migration_uuid": migration_uuid, "state": "rolled_back"}
        if m.state is MigrationState.CONFIRMED:
            raise InvalidRequest("migration_uuid", m.uuid, "the guest left this host: "
                                 "the live migration happened")
        with self._lock:
            if m.uuid in self._migrating:
                raise MoveInProgress(m.instance_uuid, m.uuid)
            if m.state is MigrationState.ACTIVE \
                    and self.driver.guest_state(m.instance_uuid) is None:
                raise InvalidRequest("migration_uuid", m.uuid,
                                     "the guest is no longer here: the live "
                                     "migration happened; live_migrate again to "
                                     "give its devices back")
            self.tracker.revert_move(m.uuid)
        LOG.info("Live migration %s of instance %s rolled back at the source",
                 m.uuid, m.instance_uuid)
        return {"migration_uuid": m.uuid, "state": "rolled_back"}

    def check_can_live_migrate_destination(self, migration_uuid, instance_uuid, spec,
                                           allocations) -> dict:
        """Destination: claim, run the pre-check on what was claimed, and
        create the claimed mdevs (libvirt migrates an mdev only into one
        that exists). A refusal gives the claim back whole. Answers the
        claimed devices, which the source rewrites the guest for, and
        where its hypervisor is reached."""
        known = self._known_move(migration_uuid, instance_uuid,
                                 (MigrationRole.DESTINATION,), (MoveKind.LIVE_MIGRATION,))
        if known is None and self.tracker.knows(instance_uuid):
            raise InvalidRequest("instance_uuid", instance_uuid,
                                 "is on this host already; a live migration moves "
                                 "it to another")
        self.read_guests()
        rows = self.tracker.claim_move(MoveKind.LIVE_MIGRATION, migration_uuid,
                                       instance_uuid, spec, allocations)
        claimed = [a for a in rows if in_guest(a)]
        try:
            self._prepare_incoming(migration_uuid, instance_uuid,
                                   [guest_device(a) for a in claimed])
        except Exception:
            self._give_back_incoming(migration_uuid, withdraw=known is None)
            raise
        return {"migration_uuid": migration_uuid,
                "devices": [{"assignment_id": a.id, "kind": a.kind.value,
                             "device_id": a.device_id} for a in claimed],
                # Since 1.2: what live_migrate's ``destination`` takes.
                "claimed": [ClaimedDevice(a.resource_class, guest_device(a)).to_dict()
                            for a in claimed],
                "migration_uri": self.driver.migration_uri()}

    def _prepare_incoming(self, migration_uuid: str, instance_uuid: str,
                          devices: list[GuestDevice]) -> None:
        refusals = self._pci_refusals("destination", devices)
        if refusals:
            raise LiveMigrationRefused(instance_uuid, MigrationRole.DESTINATION, refusals)
        self._take_vgpu_types(devices)
        mdevs = [d for d in devices if d.kind is DeviceKind.MDEV]
        if not mdevs:
            return
        existing = {m.uuid for m in self.driver.get_host_inventory().mdevs}
        for d in mdevs:
            if d.device_id not in existing and d.detail.mdev_parent and d.detail.mdev_type:
                self.driver.ensure_mdev(d.device_id, d.detail.mdev_parent,
                                        d.detail.mdev_type)
                with self._lock:
                    self._created_mdevs.setdefault(migration_uuid, []).append(d.device_id)
        refusals = mdev_refusals(
            mdevs, frozenset(m.uuid for m in self.driver.get_host_inventory().mdevs))
        if refusals:
            raise LiveMigrationRefused(instance_uuid, MigrationRole.DESTINATION, refusals)

    def _give_back_incoming(self, migration_uuid: str, withdraw: bool = False) -> None:
        """The destination's claim released, and the mdevs made for it
        removed; the guest never ran here. ``withdraw``: the claim was made
        by the call now refused, which leaves no record of it."""
        m = self.tracker.migration(migration_uuid)
        claimed = self._claimed_by_move(m)
        if withdraw:
            self.tracker.withdraw_move(migration_uuid)
        else:
            self.tracker.revert_move(migration_uuid)
        self._clear_vgpu_types(claimed)
        with self._lock:
            created = self._created_mdevs.pop(migration_uuid, [])
        for mdev in created:
            self.driver.remove_mdev(mdev)

    def _pci_refusals(self, side: str, devices: list[GuestDevice]) -> list[str]:
        """The whole devices (PCI, VF) among ``devices`` that this host's
        [pci] device_spec does not mark live_migratable."""
        if not any(d.kind in (DeviceKind.PCI, DeviceKind.VF) for d in devices):
            return []
        marked = live_migratable_devices(self.device_specs,
                                         self.driver.get_host_inventory().pci_devices)
        return pci_refusals(side, devices, marked)

    def live_migrate(self, migration_uuid, instance_uuid, destination=None) -> dict:
        """Source: pair the guest's devices with those the destination
        claimed, run the pre-check, record the move (on disk before the
        guest moves), migrate the running guest, and give the devices back
        once the hypervisor reports it gone from here. On failure the guest
        and its devices stay here and LiveMigrationFailed says why."""
        if destination is None:
            raise InvalidRequest(
                "destination", None, "missing: since API 1.2 the source migrates the "
                "guest itself and needs the destination's answer to "
                "check_can_live_migrate_destination (claimed, migration_uri); a 1.0 "
                "caller cannot drive a live migration")
        m = self._known_move(migration_uuid, instance_uuid, (MigrationRole.SOURCE,),
                             (MoveKind.LIVE_MIGRATION,))
        if m is not None and m.state is MigrationState.CONFIRMED:
            return {"migration_uuid": m.uuid, "state": "migrated"}
        with self._lock:
            if migration_uuid in self._migrating:
                raise MoveInProgress(instance_uuid, migration_uuid)
            self._migrating.add(migration_uuid)
        try:
            # Read again now that no rollback can come between (it takes
            # the same lock to check _migrating).
            if m is not None and self.tracker.migration(m.uuid).state \
                    is MigrationState.REVERTED:
                raise InvalidRequest("migration_uuid", m.uuid, "this live migration "
                                     "failed or was rolled back, and the guest "
                                     "stayed here; start another")
            # A move the source was only told of (announced) starts now; one
            # that started before a restart resumes.
            return self._migrate_out(
                migration_uuid, instance_uuid, destination,
                resumed=m is not None and m.state is not MigrationState.ANNOUNCED)
        finally:
            with self._lock:
                self._migrating.discard(migration_uuid)

    def _migrate_out(self, migration_uuid: str, instance_uuid: str, destination: dict,
                     resumed: bool) -> dict:
        target, uri = self._target(migration_uuid, instance_uuid, destination)
        refusals = (self._pci_refusals("source", [m.source for m in target.moves])
                    + mdev_type_refusals(target))
        if refusals:
            raise LiveMigrationRefused(instance_uuid, MigrationRole.SOURCE, refusals)
        self.tracker.begin_move_source(MoveKind.LIVE_MIGRATION, migration_uuid,
                                       instance_uuid)
        if resumed:
            self._wait_for_earlier_migration(migration_uuid, instance_uuid)
        # A move an earlier call of ours left open (the agent restarted
        # mid-way) whose guest has left already needs no migration.
        if not (resumed and self.driver.guest_state(instance_uuid) is None):
            try:
                self.driver.live_migrate(instance_uuid, uri, target)
            except LiveMigrationError as e:
                if e.cause is not MigrationFailure.OUTCOME_UNKNOWN:
                    self.tracker.revert_move(migration_uuid)
                raise LiveMigrationFailed(instance_uuid, migration_uuid, e.cause.value,
                                          str(e)) from None
        if self.driver.guest_state(instance_uuid) is not None:
            raise LiveMigrationFailed(
                instance_uuid, migration_uuid, MigrationFailure.OUTCOME_UNKNOWN.value,
                "the hypervisor reported the migration done, yet the guest is "
                "still here")
        self._release_devices(self.tracker.confirm_move(migration_uuid))
        return {"migration_uuid": migration_uuid, "state": "migrated"}

    def _wait_for_earlier_migration(self, migration_uuid: str, instance_uuid: str
                                    ) -> None:
        """The migration an earlier process of this agent started may still
        run: libvirt carries a peer-to-peer migration on after its caller
        died. Migrating again meanwhile is refused ("another migration job
        is already running"), which says nothing of where the guest ends
        up: its end is waited for, then the guest's place tells."""
        if not self.driver.migrating_out(instance_uuid):
            return
        LOG.info("Live migration %s of instance %s: resumed while the hypervisor still "
                 "runs the migration started before this agent's restart; waiting for "
                 "it to end", migration_uuid, instance_uuid)
        while self.driver.migrating_out(instance_uuid):
            time.sleep(EARLIER_MIGRATION_POLL_SECONDS)

    def _target(self, migration_uuid: str, instance_uuid: str, destination: dict
                ) -> tuple[LiveMigrationTarget, str]:
        """The guest's devices here paired with the destination's, and the
        destination's URI. InvalidRequest names the field in the way."""
        _, rows, moves = self.tracker.instance(instance_uuid)
        own = [ClaimedDevice(a.resource_class, guest_device(a)) for a in rows
               if a.kind is not DeviceKind.HOST_RESOURCES
               and held_by_the_guest(a, migration_uuid, moves)]
        try:
            claimed = destination["claimed"]
            if not isinstance(claimed, list):
                raise InvalidMigrationTarget("destination.claimed", claimed,
                                             "must be a list")
            theirs = [ClaimedDevice.from_dict(c, f"destination.claimed[{i}]")
                      for i, c in enumerate(claimed)]
            return (pair_devices(instance_uuid, own, theirs),
                    destination["migration_uri"])
        except InvalidMigrationTarget as e:
            raise InvalidRequest(e.field, e.value, str(e)) from None

    def post_live_migration_at_destination(self, migration_uuid, instance_uuid) -> dict:
        """Destination: the guest runs here, live, with the devices this
        host claimed (the source rewrote it for them); the claim is settled
        and the guest left running as it is. There is no going back after
        this, so the move is confirmed here too."""
        m = self._move(migration_uuid, instance_uuid, (MigrationRole.DESTINATION,),
                       (MoveKind.LIVE_MIGRATION,))
        if m.state is MigrationState.REVERTED:
            raise InvalidRequest("migration_uuid", m.uuid, "this move was rolled back")
        wanted = frozenset(d.assignment_id for d in self._guest(m.instance_uuid).devices)
        state = self.driver.guest_state(m.instance_uuid)
        if state is None or not state.running or state.live != wanted:
            raise InvalidRequest("migration_uuid", m.uuid,
                                 "the guest does not run here on the devices this "
                                 "host claimed: the migration has not happened; "
                                 "roll it back")
        self.tracker.finish_move(m.uuid)
        self.tracker.confirm_move(m.uuid)
        with self._lock:
            self._created_mdevs.pop(m.uuid, None)
        return self.get_instance(m.instance_uuid)

    def rollback_live_migration_at_destination(self, migration_uuid,
                                               instance_uuid) -> dict:
        """Destination: give back what the check claimed and the mdevs it
        created. Refused once the guest runs here: it has no other copy."""
        m = self._move(migration_uuid, instance_uuid, (MigrationRole.DESTINATION,),
                       (MoveKind.LIVE_MIGRATION,))
        if m.state is MigrationState.CONFIRMED:
            raise InvalidRequest("migration_uuid", m.uuid, "this move was settled "
                                 "here: the guest runs on this host")
        if m.state is not MigrationState.REVERTED:
            state = self.driver.guest_state(m.instance_uuid)
            if state is not None and state.running:
                raise InvalidRequest("migration_uuid", m.uuid,
                                     "the guest runs on this host: the migration "
                                     "happened; post_live_migration_at_destination "
                                     "settles it")
            # A guest defined here but not running is a leftover of the move.
            self.driver.destroy(m.instance_uuid)
        self._give_back_incoming(m.uuid)
        return {"migration_uuid": m.uuid, "instance": None}

    # --- evacuation -----------------------------------------------------

    def accept_rebuild(self, migration_uuid, instance_uuid, spec, allocations,
                       fence: Callable[[], None] | None = None) -> dict:
        """Destination of an evacuation: from the answer on, this host alone
        owns the rebuild. ``fence`` (raising when the source is up) is asked
        before a first accept, never on a retry of one. The migration record
        and the claim are on disk before this returns; the guest is built by
        finish_rebuild (here, or by resume_rebuilds after a crash). An
        instance that already runs here is not evacuated here."""
        with self._rebuilding_lock:
            self._accepting.add(instance_uuid)
        try:
            known = self._known_move(migration_uuid, instance_uuid,
                                     (MigrationRole.DESTINATION,), (MoveKind.EVACUATION,))
            if known is not None and evacuation_name_free_again(
                    known, MoveKind.EVACUATION, self.tracker.knows(instance_uuid)):
                known = None  # a new evacuation under a settled one's name
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
            self.read_guests()
            rows = self.tracker.claim_move(MoveKind.EVACUATION, migration_uuid,
                                           instance_uuid, spec, allocations)
            try:
                self._take_vgpu_types(rows)
            except Exception:
                self._give_back_refused_move(migration_uuid)
                raise
            return {"migration_uuid": migration_uuid, "instance_uuid": instance_uuid,
                    "accepted": True, "assignments": describe(rows)}
        finally:
            with self._rebuilding_lock:
                self._accepting.discard(instance_uuid)

    def rebuilds_arriving(self) -> frozenset[str]:
        """The instances an evacuation is being accepted for here now: their
        allocations are on our providers (the conductor's swap) before
        their record is (accept_rebuild)."""
        with self._rebuilding_lock:
            return frozenset(self._accepting)

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
            except Exception as e:  # noqa: BLE001 - one rebuild must not stop the others
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
