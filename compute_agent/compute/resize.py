"""Resize and cold migration, on two hosts or on one: the destination
claims the new flavor's devices, the source's pass to the migration and
its guest stops, the destination runs the guest on its new devices, and
the move ends confirmed (the old devices given back) or reverted (the new
ones given back, the old ones the instance's again)."""
from __future__ import annotations

from compute_agent.claims.model import Migration, MigrationRole, MigrationState, MoveKind, Owner
from compute_agent.compute.host import Host, describe, live_conflicts
from compute_agent.exception import InvalidRequest, RetryMismatch

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


class Resizes:
    def __init__(self, host: Host) -> None:
        self.host = host

    def prep_resize(self, migration_uuid: str, instance_uuid: str, spec: dict,
                    allocations: dict) -> dict:
        """Destination: claim the new flavor's devices."""
        self.host.known_migration(migration_uuid, instance_uuid, tuple(MigrationRole),
                                  (MoveKind.RESIZE,))
        rows = self.host.claim_move(MoveKind.RESIZE, migration_uuid, instance_uuid, spec,
                                    allocations)
        return {"migration_uuid": migration_uuid, "assignments": describe(rows)}

    def resize_instance(self, migration_uuid: str, instance_uuid: str) -> dict:
        """Source: the migration takes over the instance's devices here, and
        the guest stops (nova's migrate_disk_and_power_off)."""
        self.host.known_migration(migration_uuid, instance_uuid,
                                  (MigrationRole.SOURCE, MigrationRole.BOTH), (MoveKind.RESIZE,))
        rows = self.host.tracker.begin_move_source(MoveKind.RESIZE, migration_uuid,
                                                   instance_uuid)
        self.host.driver.power_off(instance_uuid)
        return {"migration_uuid": migration_uuid, "assignments": describe(rows)}

    def finish_resize(self, migration_uuid: str, instance_uuid: str) -> dict:
        """Destination: the guest runs with its new devices."""
        m = self.host.migration(migration_uuid, instance_uuid,
                                (MigrationRole.DESTINATION, MigrationRole.BOTH),
                                (MoveKind.RESIZE,))
        if m.state is MigrationState.REVERTED:
            raise InvalidRequest("migration_uuid", m.uuid, "this move was reverted")
        self.host.run_with_store_devices(m.instance_uuid)
        self.host.tracker.finish_move(m.uuid)
        return self.host.get_instance(m.instance_uuid)

    def confirm_resize(self, migration_uuid: str, instance_uuid: str) -> dict:
        """Source: give back the old devices; a guest that left is removed
        first. On the same host the guest must already run on its new
        devices."""
        m = self.host.migration(migration_uuid, instance_uuid, tuple(MigrationRole))
        check_not_ended_otherwise(m, MigrationState.CONFIRMED)
        if m.role is MigrationRole.SOURCE:
            self.host.driver.destroy(m.instance_uuid)
        elif m.state not in (MigrationState.CONFIRMED, MigrationState.REVERTED):
            self.host.check_not_in_use(m.instance_uuid,
                                       self.host.migration_rows(m, Owner.MIGRATION))
        self.host.release_devices(self.host.tracker.confirm_move(m.uuid))
        return {"migration_uuid": m.uuid, "state": "confirmed"}

    def revert_resize(self, migration_uuid: str, instance_uuid: str) -> dict:
        """Either side: new devices back, old ones to the instance. A guest
        running on the new devices stops before they are given back."""
        m = self.host.migration(migration_uuid, instance_uuid, tuple(MigrationRole))
        check_not_ended_otherwise(m, MigrationState.REVERTED)
        return self._revert(m)

    def _revert(self, m: Migration) -> dict:
        host = self.host
        if m.role is MigrationRole.DESTINATION:
            host.driver.destroy(m.instance_uuid)
            claimed = host.claimed_by_move(m)
            host.release_devices(host.tracker.revert_move(m.uuid))
            host.clear_vgpu_types(claimed)
            return {"migration_uuid": m.uuid, "instance": None}
        if m.state not in (MigrationState.CONFIRMED, MigrationState.REVERTED):
            new = host.migration_rows(m, Owner.INSTANCE)
            if live_conflicts(host.driver.guest_state(m.instance_uuid), new):
                host.driver.power_off(m.instance_uuid)
                # Read again: a guest still on them keeps them.
                host.check_not_in_use(m.instance_uuid, new)
        claimed = host.claimed_by_move(m)
        host.tracker.revert_move(m.uuid)
        host.clear_vgpu_types(claimed)
        host.run_with_store_devices(m.instance_uuid)
        return {"migration_uuid": m.uuid, "instance": host.get_instance(m.instance_uuid)}
