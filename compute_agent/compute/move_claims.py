"""The tracker's decisions for moves, made on its view under its lock
(compute/tracker.py runs them): each answers, and says what it changes.

Moves follow nova's allocation-swap convention: during a move the
migration owns the source's devices and the instance owns the
destination's. A same-host resize therefore keeps both sets side by side.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from compute_agent.claims.choice import InstanceSpec
from compute_agent.claims.model import (
    AssignmentState,
    Migration,
    MigrationRole,
    MigrationState,
    MoveKind,
    Owner,
    RequestDigest,
)
from compute_agent.compute.checks import check_move_of, check_one_consumer, check_retry
from compute_agent.compute.claims_view import Change, ClaimsView, Decided, InstanceRecord
from compute_agent.exception import InvalidRequest, MoveInProgress, NoSuchInstance
from compute_agent.moves.evacuation import evacuation_name_free_again


@dataclass(frozen=True)
class ClaimRequest:
    """What a claim asks for: the instance's spec, checked; its
    allocations, in Placement's shape; and their digest, which the record
    keeps so that a retry is known by asking the same."""

    spec: InstanceSpec
    allocations: dict
    asked: RequestDigest


def claim_move(view: ClaimsView, kind: MoveKind, migration_uuid: str, instance_uuid: str,
               request: ClaimRequest) -> Decided:
    """The destination's claim for a resize, live migration or
    evacuation. On the same host, the instance's current devices pass
    to the migration in the same commit."""
    asked = request.asked
    m = view.migrations.get(migration_uuid)
    if m is not None:
        check_move_of(m, instance_uuid)
    if m is not None and evacuation_name_free_again(m, kind, instance_uuid in view.instances):
        m = None  # replaced by the new move's record below
    if m is not None and m.role is not MigrationRole.SOURCE:
        # A retry. After a confirm the devices kept are the
        # instance's own; a reverted move cannot be claimed again.
        if m.state is MigrationState.REVERTED:
            raise InvalidRequest("migration_uuid", migration_uuid, "this move was reverted")
        check_retry(m.request, asked, migration_uuid,
                    f"move {migration_uuid} was claimed here by an earlier call")
        if m.state is MigrationState.CONFIRMED:
            return Decided(view.rows_of(instance_uuid, Owner.INSTANCE))
        return Decided(view.rows_of(instance_uuid, Owner.INSTANCE, migration_uuid))
    check_one_consumer(migration_uuid, "migration_uuid", view.instances,
                       "an instance's uuid")
    check_one_consumer(instance_uuid, "instance_uuid", view.migrations, "a move's uuid")
    other = view.open_migration(instance_uuid)
    if other is not None and other.uuid != migration_uuid:
        raise MoveInProgress(instance_uuid, other.uuid)
    rows = view.choose_rows(instance_uuid, request.allocations, instance_uuid, migration_uuid)
    if kind is MoveKind.EVACUATION and instance_uuid in view.instances:
        raise InvalidRequest("instance_uuid", instance_uuid,
                             "is already on this host; an evacuation "
                             "rebuilds it on another")
    current = [] if kind is MoveKind.EVACUATION else [
        a for a in view.rows_of(instance_uuid, Owner.INSTANCE)
        if a.migration_uuid != migration_uuid]
    same_host = bool(current) or m is not None
    passed = tuple(a.with_(owner=Owner.MIGRATION, consumer_uuid=migration_uuid,
                           migration_uuid=migration_uuid) for a in current)
    old_spec = view.instances.get(instance_uuid) if same_host else None
    migration = Migration(migration_uuid, instance_uuid, kind,
                          MigrationRole.BOTH if same_host else MigrationRole.DESTINATION,
                          MigrationState.ACTIVE, old_spec, asked)
    return Decided(rows, Change(claimed=tuple(rows), updated=passed,
                                recorded=InstanceRecord(instance_uuid,
                                                        request.spec.to_payload()),
                                migration=migration))


def announce_source(view: ClaimsView, kind: MoveKind, migration_uuid: str,
                    instance_uuid: str, asked: RequestDigest) -> Decided:
    """The source's record of a move it is told of (state ANNOUNCED); its
    devices stay the instance's. A retry is answered the record as it is."""
    m = view.migrations.get(migration_uuid)
    if m is not None:
        check_move_of(m, instance_uuid)
        check_retry(m.request, asked, migration_uuid,
                    f"move {migration_uuid} was announced here by an earlier call")
        return Decided(m)
    check_one_consumer(migration_uuid, "migration_uuid", view.instances,
                       "an instance's uuid")
    if instance_uuid not in view.instances:
        raise NoSuchInstance(instance_uuid)
    other = view.open_migration(instance_uuid)
    if other is not None:
        raise MoveInProgress(instance_uuid, other.uuid)
    migration = Migration(migration_uuid, instance_uuid, kind, MigrationRole.SOURCE,
                          MigrationState.ANNOUNCED, view.instances[instance_uuid], asked)
    return Decided(migration, Change(migration=migration))


def begin_source(view: ClaimsView, kind: MoveKind, migration_uuid: str,
                 instance_uuid: str) -> Decided:
    """The source's half: the instance's devices pass to the migration
    (an announced move starts here)."""
    m = view.migrations.get(migration_uuid)
    if m is not None:
        check_move_of(m, instance_uuid)
    if m is not None and m.state is not MigrationState.ANNOUNCED:
        return Decided(view.rows_of(instance_uuid, Owner.MIGRATION, migration_uuid))
    check_one_consumer(migration_uuid, "migration_uuid", view.instances,
                       "an instance's uuid")
    if instance_uuid not in view.instances:
        raise NoSuchInstance(instance_uuid)
    other = view.open_migration(instance_uuid)
    if other is not None and other.uuid != migration_uuid:
        raise MoveInProgress(instance_uuid, other.uuid)
    passed = [a.with_(owner=Owner.MIGRATION, consumer_uuid=migration_uuid,
                      migration_uuid=migration_uuid)
              for a in view.rows_of(instance_uuid, Owner.INSTANCE)]
    # An announced move keeps what its announcement asked; one that
    # starts here unannounced asked nothing a retry could change.
    migration = Migration(migration_uuid, instance_uuid, kind, MigrationRole.SOURCE,
                          MigrationState.ACTIVE, view.instances[instance_uuid],
                          None if m is None else m.request)
    return Decided(passed, Change(updated=tuple(passed), migration=migration))


def finish(view: ClaimsView, m: Migration) -> Decided:
    """The destination's guest runs with its new devices."""
    rows = view.rows_of(m.instance_uuid, Owner.INSTANCE, m.uuid)
    if m.state is not MigrationState.ACTIVE or m.role is MigrationRole.SOURCE:
        return Decided(rows)
    done = [a.with_(state=AssignmentState.CLAIMED) for a in rows]
    return Decided(done, Change(updated=tuple(done),
                                migration=replace(m, state=MigrationState.FINISHED)))


def confirm(view: ClaimsView, m: Migration) -> Decided:
    """Give back the source's devices (those the migration owns)."""
    if m.state in (MigrationState.CONFIRMED, MigrationState.REVERTED):
        return Decided([])
    released = [a.with_(state=AssignmentState.RELEASED)
                for a in view.rows_of(m.instance_uuid, Owner.MIGRATION, m.uuid)]
    # The devices the instance keeps no longer belong to a move.
    kept = [a.with_(migration_uuid=None)
            for a in view.rows_of(m.instance_uuid, Owner.INSTANCE, m.uuid)]
    gone = m.role is MigrationRole.SOURCE
    return Decided(released, Change(
        updated=(*released, *kept), migration=replace(m, state=MigrationState.CONFIRMED),
        forgotten_instance=m.instance_uuid if gone else None))


def revert(view: ClaimsView, m: Migration) -> Decided:
    """Give back the new devices and return the old ones to the instance,
    on whichever side of the move this host is."""
    if m.state in (MigrationState.CONFIRMED, MigrationState.REVERTED):
        return Decided(view.rows_of(m.instance_uuid, Owner.INSTANCE))
    released = [a.with_(state=AssignmentState.RELEASED)
                for a in view.rows_of(m.instance_uuid, Owner.INSTANCE, m.uuid)]
    returned = [a.with_(owner=Owner.INSTANCE, consumer_uuid=m.instance_uuid,
                        migration_uuid=None)
                for a in view.rows_of(m.instance_uuid, Owner.MIGRATION, m.uuid)]
    gone = m.role is MigrationRole.DESTINATION
    restored = (InstanceRecord(m.instance_uuid, m.old_spec)
                if m.old_spec and not gone else None)
    return Decided(returned, Change(
        updated=(*released, *returned), recorded=restored,
        migration=replace(m, state=MigrationState.REVERTED),
        forgotten_instance=m.instance_uuid if gone else None))


def withdraw(view: ClaimsView, m: Migration) -> Decided:
    """A destination's claim refused within the call that made it: its
    devices, its record and the instance it brought go."""
    if m.role is not MigrationRole.DESTINATION or m.state is not MigrationState.ACTIVE:
        raise InvalidRequest("migration_uuid", m.uuid,
                             "only a destination's open claim is withdrawn")
    released = [a.with_(state=AssignmentState.RELEASED)
                for a in view.rows_of(m.instance_uuid, Owner.INSTANCE, m.uuid)]
    return Decided(released, Change(updated=tuple(released),
                                    forgotten_instance=m.instance_uuid,
                                    forgotten_migrations=(m.uuid,)))
