"""Live migration. The conductor (compute_agent.rpcapi.live_migrate_instance)
drives: the source records the move it is told of, before the allocations
are swapped; the destination claims and answers what it claimed; the
source pairs its devices with those, migrates the running guest and gives
its devices back once the hypervisor reports the guest gone; the
destination then settles its claim. On failure both sides roll back."""
from __future__ import annotations

import logging
import threading
import time

from compute_agent.claims.model import (
    Assignment,
    Migration,
    MigrationRole,
    MigrationState,
    MoveKind,
    Owner,
    RequestDigest,
)
from compute_agent.compute.checks import check_retry
from compute_agent.compute.host import Host, guest_device, in_guest
from compute_agent.drivers.base import DeviceKind, GuestDevice, MigrationFailure
from compute_agent.drivers.errors import InvalidMigrationTarget, LiveMigrationError
from compute_agent.drivers.migration import ClaimedDevice, LiveMigrationTarget, pair_devices
from compute_agent.exception import (
    InvalidRequest,
    LiveMigrationFailed,
    LiveMigrationRefused,
    MoveInProgress,
)
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


def held_by_the_guest(a: Assignment, migration_uuid: str, moves: list[Migration]) -> bool:
    """Whether ``a`` is a device the guest holds, for the live migration
    ``migration_uuid`` to move: the instance's own (those a settled move
    brought here keep naming it: a cross-host resize's destination is never
    told of the confirm), or what the migration took over here."""
    if a.owner is Owner.MIGRATION:
        return a.migration_uuid == migration_uuid
    return a.migration_uuid is None or not any(m.uuid == a.migration_uuid and m.open
                                                for m in moves)



class LiveMigrations:
    def __init__(self, host: Host, device_specs: tuple[DeviceSpec, ...] = ()) -> None:
        self.host = host
        # [pci] device_spec: which whole devices may live-migrate.
        self.device_specs = device_specs
        self._lock = threading.Lock()
        # Live migrations this process is running as their source, and the
        # mdevs each incoming one created here (removed if it rolls back).
        self._migrating: set[str] = set()
        self._created_mdevs: dict[str, list[str]] = {}

    def check_can_live_migrate_source(self, migration_uuid: str, instance_uuid: str,
                                      destination_host: str) -> dict:
        """Source, before the conductor swaps the allocations: refuse what
        cannot move from here (no such instance, a guest that does not run,
        a device that cannot migrate, another move), else record the move
        as announced, on disk before the answer. From then on the instance
        is this move's: a restart neither gives it up nor finds the
        migration's allocations unexplained. Nothing moves yet."""
        asked = RequestDigest.of(destination_host=destination_host)
        m = self.host.known_migration(migration_uuid, instance_uuid, (MigrationRole.SOURCE,),
                                      (MoveKind.LIVE_MIGRATION,))
        if m is not None:
            if m.state is MigrationState.REVERTED:
                raise InvalidRequest("migration_uuid", m.uuid, "this live migration "
                                     "was rolled back; start another")
            check_retry(m.request, asked, m.uuid,
                        f"move {m.uuid} was announced here by an earlier call")
            return {"migration_uuid": m.uuid, "state": m.state.value}
        _, rows, _ = self.host.tracker.instance(instance_uuid)
        state = self.host.driver.guest_state(instance_uuid)
        if state is None or not state.running:
            raise InvalidRequest("instance_uuid", instance_uuid,
                                 "its guest does not run here; a live migration "
                                 "moves a running guest")
        refusals = self._pci_refusals("source", [guest_device(a) for a in rows
                                                 if in_guest(a)])
        if refusals:
            raise LiveMigrationRefused(instance_uuid, MigrationRole.SOURCE, refusals)
        m = self.host.tracker.announce_move_source(MoveKind.LIVE_MIGRATION, migration_uuid,
                                                   instance_uuid, asked)
        LOG.info("Live migration %s of instance %s to %s announced", m.uuid,
                 m.instance_uuid, destination_host)
        return {"migration_uuid": m.uuid, "state": m.state.value}

    def rollback_live_migration_at_source(self, migration_uuid: str,
                                          instance_uuid: str) -> dict:
        """Source: end the move; the instance keeps its devices here and its
        guest runs on. Refused once the guest has left (the move
        happened) or while this host is migrating it. A move never heard
        of here needs nothing: answered as rolled back."""
        m = self.host.known_migration(migration_uuid, instance_uuid, (MigrationRole.SOURCE,),
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
                    and self.host.driver.guest_state(m.instance_uuid) is None:
                raise InvalidRequest("migration_uuid", m.uuid,
                                     "the guest is no longer here: the live "
                                     "migration happened; live_migrate again to "
                                     "give its devices back")
            self.host.tracker.revert_move(m.uuid)
        LOG.info("Live migration %s of instance %s rolled back at the source",
                 m.uuid, m.instance_uuid)
        return {"migration_uuid": m.uuid, "state": "rolled_back"}

    def check_can_live_migrate_destination(self, migration_uuid: str, instance_uuid: str,
                                           spec: dict, allocations: dict) -> dict:
        """Destination: claim, run the pre-check on what was claimed, and
        create the claimed mdevs (libvirt migrates an mdev only into one
        that exists). A refusal gives the claim back whole. Answers the
        claimed devices, which the source rewrites the guest for, and
        where its hypervisor is reached."""
        known = self.host.known_migration(migration_uuid, instance_uuid,
                                          (MigrationRole.DESTINATION,), (MoveKind.LIVE_MIGRATION,))
        if known is None and self.host.tracker.knows(instance_uuid):
            raise InvalidRequest("instance_uuid", instance_uuid,
                                 "is on this host already; a live migration moves "
                                 "it to another")
        self.host.read_guests()
        rows = self.host.tracker.claim_move(MoveKind.LIVE_MIGRATION, migration_uuid,
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
                "migration_uri": self.host.driver.migration_uri()}

    def _prepare_incoming(self, migration_uuid: str, instance_uuid: str,
                          devices: list[GuestDevice]) -> None:
        refusals = self._pci_refusals("destination", devices)
        if refusals:
            raise LiveMigrationRefused(instance_uuid, MigrationRole.DESTINATION, refusals)
        self.host.take_vgpu_types(devices)
        mdevs = [d for d in devices if d.kind is DeviceKind.MDEV]
        if not mdevs:
            return
        existing = {m.uuid for m in self.host.driver.get_host_inventory().mdevs}
        for d in mdevs:
            if d.device_id not in existing and d.detail.mdev_parent and d.detail.mdev_type:
                self.host.driver.ensure_mdev(d.device_id, d.detail.mdev_parent,
                                             d.detail.mdev_type)
                with self._lock:
                    self._created_mdevs.setdefault(migration_uuid, []).append(d.device_id)
        refusals = mdev_refusals(
            mdevs, frozenset(m.uuid for m in self.host.driver.get_host_inventory().mdevs))
        if refusals:
            raise LiveMigrationRefused(instance_uuid, MigrationRole.DESTINATION, refusals)

    def _give_back_incoming(self, migration_uuid: str, withdraw: bool = False) -> None:
        """The destination's claim released, and the mdevs made for it
        removed; the guest never ran here. ``withdraw``: the claim was made
        by the call now refused, which leaves no record of it."""
        m = self.host.tracker.migration(migration_uuid)
        claimed = self.host.claimed_by_move(m)
        if withdraw:
            self.host.tracker.withdraw_move(migration_uuid)
        else:
            self.host.tracker.revert_move(migration_uuid)
        self.host.clear_vgpu_types(claimed)
        with self._lock:
            created = self._created_mdevs.pop(migration_uuid, [])
        for mdev in created:
            self.host.driver.remove_mdev(mdev)

    def _pci_refusals(self, side: str, devices: list[GuestDevice]) -> list[str]:
        """The whole devices (PCI, VF) among ``devices`` that this host's
        [pci] device_spec does not mark live_migratable."""
        if not any(d.kind in (DeviceKind.PCI, DeviceKind.VF) for d in devices):
            return []
        marked = live_migratable_devices(self.device_specs,
                                         self.host.driver.get_host_inventory().pci_devices)
        return pci_refusals(side, devices, marked)

    def live_migrate(self, migration_uuid: str, instance_uuid: str,
                     destination: dict | None = None) -> dict:
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
        m = self.host.known_migration(migration_uuid, instance_uuid, (MigrationRole.SOURCE,),
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
            if m is not None and self.host.tracker.migration(m.uuid).state \
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
        self.host.tracker.begin_move_source(MoveKind.LIVE_MIGRATION, migration_uuid,
                                            instance_uuid)
        if resumed:
            self._wait_for_earlier_migration(migration_uuid, instance_uuid)
        # A move an earlier call of ours left open (the agent restarted
        # mid-way) whose guest has left already needs no migration.
        if not (resumed and self.host.driver.guest_state(instance_uuid) is None):
            try:
                self.host.driver.live_migrate(instance_uuid, uri, target)
            except LiveMigrationError as e:
                if e.cause is not MigrationFailure.OUTCOME_UNKNOWN:
                    self.host.tracker.revert_move(migration_uuid)
                raise LiveMigrationFailed(instance_uuid, migration_uuid, e.cause.value,
                                          str(e)) from None
        if self.host.driver.guest_state(instance_uuid) is not None:
            raise LiveMigrationFailed(
                instance_uuid, migration_uuid, MigrationFailure.OUTCOME_UNKNOWN.value,
                "the hypervisor reported the migration done, yet the guest is "
                "still here")
        self.host.release_devices(self.host.tracker.confirm_move(migration_uuid))
        return {"migration_uuid": migration_uuid, "state": "migrated"}

    def _wait_for_earlier_migration(self, migration_uuid: str, instance_uuid: str
                                    ) -> None:
        """The migration an earlier process of this agent started may still
        run: libvirt carries a peer-to-peer migration on after its caller
        died. Migrating again meanwhile is refused ("another migration job
        is already running"), which says nothing of where the guest ends
        up: its end is waited for, then the guest's place tells."""
        if not self.host.driver.migrating_out(instance_uuid):
            return
        LOG.info("Live migration %s of instance %s: resumed while the hypervisor still "
                 "runs the migration started before this agent's restart; waiting for "
                 "it to end", migration_uuid, instance_uuid)
        while self.host.driver.migrating_out(instance_uuid):
            time.sleep(EARLIER_MIGRATION_POLL_SECONDS)

    def _target(self, migration_uuid: str, instance_uuid: str, destination: dict
                ) -> tuple[LiveMigrationTarget, str]:
        """The guest's devices here paired with the destination's, and the
        destination's URI. InvalidRequest names the field in the way."""
        _, rows, moves = self.host.tracker.instance(instance_uuid)
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

    def post_live_migration_at_destination(self, migration_uuid: str,
                                           instance_uuid: str) -> dict:
        """Destination: the guest runs here, live, with the devices this
        host claimed (the source rewrote it for them); the claim is settled
        and the guest left running as it is. There is no going back after
        this, so the move is confirmed here too."""
        m = self.host.migration(migration_uuid, instance_uuid, (MigrationRole.DESTINATION,),
                                (MoveKind.LIVE_MIGRATION,))
        if m.state is MigrationState.REVERTED:
            raise InvalidRequest("migration_uuid", m.uuid, "this move was rolled back")
        wanted = frozenset(d.assignment_id for d in self.host.guest(m.instance_uuid).devices)
        state = self.host.driver.guest_state(m.instance_uuid)
        if state is None or not state.running or state.live != wanted:
            raise InvalidRequest("migration_uuid", m.uuid,
                                 "the guest does not run here on the devices this "
                                 "host claimed: the migration has not happened; "
                                 "roll it back")
        self.host.tracker.finish_move(m.uuid)
        self.host.tracker.confirm_move(m.uuid)
        with self._lock:
            self._created_mdevs.pop(m.uuid, None)
        return self.host.get_instance(m.instance_uuid)

    def rollback_live_migration_at_destination(self, migration_uuid: str,
                                               instance_uuid: str) -> dict:
        """Destination: give back what the check claimed and the mdevs it
        created. Refused once the guest runs here: it has no other copy."""
        m = self.host.migration(migration_uuid, instance_uuid, (MigrationRole.DESTINATION,),
                                (MoveKind.LIVE_MIGRATION,))
        if m.state is MigrationState.CONFIRMED:
            raise InvalidRequest("migration_uuid", m.uuid, "this move was settled "
                                 "here: the guest runs on this host")
        if m.state is not MigrationState.REVERTED:
            state = self.host.driver.guest_state(m.instance_uuid)
            if state is not None and state.running:
                raise InvalidRequest("migration_uuid", m.uuid,
                                     "the guest runs on this host: the migration "
                                     "happened; post_live_migration_at_destination "
                                     "settles it")
            # A guest defined here but not running is a leftover of the move.
            self.host.driver.destroy(m.instance_uuid)
        self._give_back_incoming(m.uuid)
        return {"migration_uuid": m.uuid, "instance": None}

