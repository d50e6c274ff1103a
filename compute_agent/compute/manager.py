"""What each conductor request does on this host: claim under the tracker's
lock, then drive the hypervisor outside it, then record the outcome.

Every step is idempotent, keyed on the instance and migration uuids, so a
conductor may retry after a timeout. Placement allocations stay the
conductor's business, as in nova. The manager builds and deletes; each
kind of move has its own module (resize, live_migration, evacuation), all
sharing this host's core (host.Host). The manager is the one object the RPC
server and the daemon call, by the step names nova's compute manager uses.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from compute_agent.compute.evacuation import Evacuations
from compute_agent.compute.host import Host
from compute_agent.compute.live_migration import LiveMigrations
from compute_agent.compute.resize import Resizes
from compute_agent.compute.tracker import Tracker
from compute_agent.drivers.driver import ComputeDriver
from compute_agent.drivers.errors import DriverUnavailable
from compute_agent.tree.device_spec import DeviceSpec

LOG = logging.getLogger(__name__)


class ComputeManager:
    """Each move step first checks that the migration, the instance and
    this host's part in the move agree, and only then changes anything."""

    def __init__(self, tracker: Tracker, driver: ComputeDriver,
                 remove_released_mdevs: bool = False,
                 device_specs: tuple[DeviceSpec, ...] = ()) -> None:
        self.host = Host(tracker, driver, remove_released_mdevs)
        self.resizes = Resizes(self.host)
        self.live_migrations = LiveMigrations(self.host, device_specs)
        self.evacuations = Evacuations(self.host)

    @property
    def tracker(self) -> Tracker:
        return self.host.tracker

    @tracker.setter
    def tracker(self, tracker: Tracker) -> None:
        # A restart within one process (the tests' reboot) reopens the store.
        self.host.tracker = tracker

    @property
    def driver(self) -> ComputeDriver:
        return self.host.driver

    # --- views ----------------------------------------------------------

    def get_instance(self, instance_uuid: str) -> dict:
        return self.host.get_instance(instance_uuid)

    def redefine_guest(self, instance_uuid: str) -> None:
        self.host.redefine_guest(instance_uuid)

    # --- build and delete -----------------------------------------------

    def build_instance(self, instance_uuid: str, spec: dict, allocations: dict) -> dict:
        self.host.read_guests()
        self.tracker.claim_build(instance_uuid, spec, allocations)
        try:
            self.driver.spawn(self.host.guest(instance_uuid))
        except Exception as e:
            # The caller gets the error; its traceback is logged where it is
            # answered (the RPC layer), once.
            self._undo_failed_spawn(instance_uuid, e)
            raise
        self.tracker.complete(instance_uuid)
        return self.host.get_instance(instance_uuid)

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
        self.host.release_devices(self.tracker.release_instance(instance_uuid))

    def delete_instance(self, instance_uuid: str) -> dict:
        self.driver.destroy(instance_uuid)
        self.host.release_devices(self.tracker.release_instance(instance_uuid))
        return {"uuid": instance_uuid, "deleted": True}

    # --- resize and cold migration --------------------------------------

    def prep_resize(self, migration_uuid: str, instance_uuid: str, spec: dict,
                    allocations: dict) -> dict:
        return self.resizes.prep_resize(migration_uuid, instance_uuid, spec, allocations)

    def resize_instance(self, migration_uuid: str, instance_uuid: str) -> dict:
        return self.resizes.resize_instance(migration_uuid, instance_uuid)

    def finish_resize(self, migration_uuid: str, instance_uuid: str) -> dict:
        return self.resizes.finish_resize(migration_uuid, instance_uuid)

    def confirm_resize(self, migration_uuid: str, instance_uuid: str) -> dict:
        return self.resizes.confirm_resize(migration_uuid, instance_uuid)

    def revert_resize(self, migration_uuid: str, instance_uuid: str) -> dict:
        return self.resizes.revert_resize(migration_uuid, instance_uuid)

    # --- live migration -------------------------------------------------

    def check_can_live_migrate_source(self, migration_uuid: str, instance_uuid: str,
                                      destination_host: str) -> dict:
        return self.live_migrations.check_can_live_migrate_source(
            migration_uuid, instance_uuid, destination_host)

    def rollback_live_migration_at_source(self, migration_uuid: str,
                                          instance_uuid: str) -> dict:
        return self.live_migrations.rollback_live_migration_at_source(
            migration_uuid, instance_uuid)

    def check_can_live_migrate_destination(self, migration_uuid: str, instance_uuid: str,
                                           spec: dict, allocations: dict) -> dict:
        return self.live_migrations.check_can_live_migrate_destination(
            migration_uuid, instance_uuid, spec, allocations)

    def live_migrate(self, migration_uuid: str, instance_uuid: str,
                     destination: dict | None = None) -> dict:
        return self.live_migrations.live_migrate(migration_uuid, instance_uuid,
                                                 destination)

    def post_live_migration_at_destination(self, migration_uuid: str,
                                           instance_uuid: str) -> dict:
        return self.live_migrations.post_live_migration_at_destination(
            migration_uuid, instance_uuid)

    def rollback_live_migration_at_destination(self, migration_uuid: str,
                                               instance_uuid: str) -> dict:
        return self.live_migrations.rollback_live_migration_at_destination(
            migration_uuid, instance_uuid)

    # --- evacuation -----------------------------------------------------

    def accept_rebuild(self, migration_uuid: str, instance_uuid: str, spec: dict,
                       allocations: dict, fence: Callable[[], None] | None = None
                       ) -> dict:
        return self.evacuations.accept_rebuild(migration_uuid, instance_uuid, spec,
                                               allocations, fence)

    def rebuilds_arriving(self) -> frozenset[str]:
        return self.evacuations.rebuilds_arriving()

    def finish_rebuild(self, migration_uuid: str) -> dict | None:
        return self.evacuations.finish_rebuild(migration_uuid)

    def rebuild_instance(self, migration_uuid: str, instance_uuid: str, spec: dict,
                         allocations: dict, fence: Callable[[], None] | None = None
                         ) -> dict:
        return self.evacuations.rebuild_instance(migration_uuid, instance_uuid, spec,
                                                 allocations, fence)

    def resume_rebuilds(self) -> list[str]:
        return self.evacuations.resume_rebuilds()
