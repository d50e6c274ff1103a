"""Evacuation, at its destination: the rebuild is accepted (the move and
the claim on disk, after the fence), then the guest is built on the
claimed devices and the move settled, here or after a crash."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from compute_agent.claims.model import Migration, MigrationRole, MigrationState, MoveKind
from compute_agent.compute.host import Host, describe
from compute_agent.exception import InvalidRequest, MoveInProgress
from compute_agent.moves.evacuation import evacuation_name_free_again

LOG = logging.getLogger(__name__)

# An evacuation's destination settles its move in two commits, finish then
# confirm; a crash may fall between them.
UNSETTLED = (MigrationState.ACTIVE, MigrationState.FINISHED)


def interrupted_rebuilds(moves: Iterable[Migration], in_flight: set[str]) -> list[Migration]:
    """The evacuations accepted here, not yet settled, that no thread builds."""
    return sorted((m for m in moves
                   if m.kind is MoveKind.EVACUATION and m.role is MigrationRole.DESTINATION
                   and m.state in UNSETTLED and m.uuid not in in_flight),
                  key=lambda m: m.uuid)


class Evacuations:
    def __init__(self, host: Host) -> None:
        self.host = host
        # The evacuations some thread is building now (finish_rebuild).
        self._rebuilding: set[str] = set()
        self._rebuilding_lock = threading.Lock()
        # The instances some thread is accepting for an evacuation now
        # (accept_rebuild): their allocations are here already, the
        # conductor's swap, while the fence waits the source out.
        self._accepting: set[str] = set()

    def accept_rebuild(self, migration_uuid: str, instance_uuid: str, spec: dict,
                       allocations: dict, fence: Callable[[], None] | None = None
                       ) -> dict:
        """Destination of an evacuation: from the answer on, this host alone
        owns the rebuild. ``fence`` (raising when the source is up) is asked
        before a first accept, never on a retry of one. The migration record
        and the claim are on disk before this returns; the guest is built by
        finish_rebuild (here, or by resume_rebuilds after a crash). An
        instance that already runs here is not evacuated here."""
        with self._rebuilding_lock:
            self._accepting.add(instance_uuid)
        try:
            known = self.host.known_migration(migration_uuid, instance_uuid,
                                              (MigrationRole.DESTINATION,), (MoveKind.EVACUATION,))
            if known is not None and evacuation_name_free_again(
                    known, MoveKind.EVACUATION, self.host.tracker.knows(instance_uuid)):
                known = None  # a new evacuation under a settled one's name
            if known is None:
                if not self.host.tracker.knows(instance_uuid) \
                        and self.host.driver.guest_state(instance_uuid) is not None:
                    # An instance the store knows is refused by the claim, once
                    # its allocations are checked; a guest it does not know, here.
                    raise InvalidRequest("instance_uuid", instance_uuid,
                                         "has a guest on this host; an evacuation "
                                         "rebuilds it on another")
                if fence is not None:
                    fence()
            rows = self.host.claim_move(MoveKind.EVACUATION, migration_uuid, instance_uuid,
                                        spec, allocations)
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

    def finish_rebuild(self, migration_uuid: str) -> dict | None:
        """Build the accepted instance's guest on its claimed devices and
        settle the move. One at a time per move: None when another thread
        is at it already."""
        m = self.host.tracker.migration(migration_uuid)
        with self._rebuilding_lock:
            if m.uuid in self._rebuilding:
                return None
            self._rebuilding.add(m.uuid)
        try:
            m = self.host.tracker.migration(m.uuid)  # as it is now that it is ours
            if m.state in UNSETTLED:
                self.host.run_with_store_devices(m.instance_uuid)
                self.host.tracker.finish_move(m.uuid)
                self.host.tracker.confirm_move(m.uuid)
            return self.host.get_instance(m.instance_uuid)
        finally:
            with self._rebuilding_lock:
                self._rebuilding.discard(m.uuid)

    def rebuild_instance(self, migration_uuid: str, instance_uuid: str, spec: dict,
                         allocations: dict, fence: Callable[[], None] | None = None
                         ) -> dict:
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
        _, _, moves = self.host.tracker.snapshot()
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

