"""The tracker's decisions for moves (compute_agent/compute/move_claims.py),
on its view alone: what each answers and changes under nova's allocation
swap (the migration owns the devices being left, the instance those it
moves to), a retry answered from the record, and what each refuses."""
from __future__ import annotations

from collections.abc import Callable

import pytest

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
from compute_agent.compute import move_claims
from compute_agent.compute.claims_view import Change, ClaimsView, Decided, InstanceRecord
from compute_agent.exception import InvalidRequest, MoveInProgress, NoSuchInstance, RetryMismatch
from tests.unit.compute.trackers import ONE_VF, SPEC, VF0, VF1, build, new_uuids, view

RESIZED = {**SPEC, "vcpus": 2}
ASKED = RequestDigest.of(spec=RESIZED, allocations=ONE_VF)
TOLD = RequestDigest.of(destination_host="hostb")
INSTANCE, MIGRATION = Owner.INSTANCE, Owner.MIGRATION
CLAIMING, CLAIMED = AssignmentState.CLAIMING, AssignmentState.CLAIMED


def made(v: ClaimsView, decided: Decided) -> object:
    """The decision's answer, its change applied to ``v`` as the tracker
    applies it."""
    if decided.change is not None:
        v.apply(decided.change)
    return decided.answer


def claim(v: ClaimsView, kind: MoveKind, migration: str, instance: str,
          asked: RequestDigest = ASKED) -> Decided:
    """A destination's claim of one VF for the resized spec."""
    return move_claims.claim_move(v, kind, migration, instance, move_claims.ClaimRequest(
        InstanceSpec.from_payload(RESIZED), ONE_VF, asked))


Step = Callable[[ClaimsView, Migration], Decided]


def step(v: ClaimsView, decide: Step, migration: str) -> Decided:
    """A step on a recorded move (finish, confirm, revert, withdraw)."""
    return decide(v, v.migration(migration))


def held(v: ClaimsView, instance: str) -> list[tuple]:
    """The instance's live rows: device, owner, consumer, move, state."""
    return sorted((a.device_id, a.owner, a.consumer_uuid, a.migration_uuid, a.state)
                  for a in v.rows_of(instance))


def left(v: ClaimsView, instance: str) -> None:
    """The instance leaves this host (its source's confirm): given back and
    forgotten, its moves kept."""
    v.apply(Change(updated=tuple(a.with_(state=AssignmentState.RELEASED)
                                 for a in v.rows_of(instance)),
                   forgotten_instance=instance))


def resized_here(v: ClaimsView) -> tuple[str, str]:
    """An instance on VF0, resized on this host to VF1, not yet settled."""
    instance, migration = new_uuids(2)
    build(v, instance)
    made(v, claim(v, MoveKind.RESIZE, migration, instance))
    return instance, migration


# --- the destination's claim ---------------------------------------------------

@pytest.mark.parametrize("kind", list(MoveKind))
def test_an_instance_new_here_makes_this_host_the_moves_destination(kind):
    v = view()
    instance, migration = new_uuids(2)
    decided = claim(v, kind, migration, instance)
    assert decided.change is not None
    assert (decided.change.updated, decided.change.recorded) == (
        (), InstanceRecord(instance, RESIZED))
    assert decided.change.migration == Migration(
        migration, instance, kind, MigrationRole.DESTINATION, MigrationState.ACTIVE,
        None, ASKED)
    assert made(v, decided) == v.rows_of(instance)
    assert held(v, instance) == [(VF0, INSTANCE, instance, migration, CLAIMING)]


@pytest.mark.parametrize("kind", [MoveKind.RESIZE, MoveKind.LIVE_MIGRATION])
def test_an_instance_here_passes_its_devices_to_the_move_in_the_same_change(kind):
    """A move within this host: the instance's devices go to the migration,
    the new ones are the instance's, and its old spec is kept for a revert."""
    v = view()
    instance, migration = new_uuids(2)
    build(v, instance)
    made(v, claim(v, kind, migration, instance))
    assert held(v, instance) == [(VF0, MIGRATION, migration, migration, CLAIMING),
                                 (VF1, INSTANCE, instance, migration, CLAIMING)]
    m = v.migration(migration)
    assert (m.role, m.old_spec) == (MigrationRole.BOTH, SPEC)
    assert v.instances[instance] == RESIZED


def test_a_claim_for_a_move_this_host_is_the_source_of_is_a_move_within_this_host():
    """The source's half came first (its devices passed to the move
    already): the claim here makes the move one within this host."""
    v = view()
    instance, migration = new_uuids(2)
    build(v, instance)
    made(v, move_claims.begin_source(v, MoveKind.RESIZE, migration, instance))
    made(v, claim(v, MoveKind.RESIZE, migration, instance))
    assert held(v, instance) == [(VF0, MIGRATION, migration, migration, CLAIMING),
                                 (VF1, INSTANCE, instance, migration, CLAIMING)]
    m = v.migration(migration)
    assert (m.role, m.old_spec) == (MigrationRole.BOTH, SPEC)


def test_a_retry_is_answered_from_the_record_and_changes_nothing():
    v = view()
    instance, migration = new_uuids(2)
    first = made(v, claim(v, MoveKind.RESIZE, migration, instance))
    again = claim(v, MoveKind.RESIZE, migration, instance)
    assert (again.answer, again.change) == (first, None)


def test_a_retry_asking_otherwise_or_naming_another_instance_is_refused():
    v = view()
    instance, other, migration = new_uuids(3)
    made(v, claim(v, MoveKind.RESIZE, migration, instance))
    with pytest.raises(RetryMismatch) as caught:
        claim(v, MoveKind.RESIZE, migration, instance,
              RequestDigest.of(spec=SPEC, allocations=ONE_VF))
    assert caught.value.fields == ["spec.vcpus"]
    with pytest.raises(InvalidRequest, match=f"moves instance {instance}"):
        claim(v, MoveKind.RESIZE, migration, other)


def test_a_confirmed_moves_retry_answers_the_devices_the_instance_kept():
    v = view()
    instance, migration = resized_here(v)
    made(v, step(v, move_claims.confirm, migration))
    again = claim(v, MoveKind.RESIZE, migration, instance)
    assert again.change is None
    assert again.answer == v.rows_of(instance)
    assert held(v, instance) == [(VF1, INSTANCE, instance, None, CLAIMING)]


def test_a_reverted_move_is_not_claimed_again():
    v = view()
    instance, migration = new_uuids(2)
    made(v, claim(v, MoveKind.RESIZE, migration, instance))
    made(v, step(v, move_claims.revert, migration))
    with pytest.raises(InvalidRequest, match="this move was reverted"):
        claim(v, MoveKind.RESIZE, migration, instance)


def test_a_second_move_of_an_instance_is_refused_naming_the_open_one():
    v = view()
    instance, first = resized_here(v)
    with pytest.raises(MoveInProgress) as caught:
        claim(v, MoveKind.RESIZE, new_uuids(1)[0], instance)
    assert caught.value.migration_uuid == first


def test_an_instance_and_a_move_never_share_a_uuid():
    v = view()
    instance, migration = resized_here(v)
    with pytest.raises(InvalidRequest) as caught:
        claim(v, MoveKind.RESIZE, instance, new_uuids(1)[0])
    assert (caught.value.field, caught.value.value) == ("migration_uuid", instance)
    with pytest.raises(InvalidRequest) as caught:
        claim(v, MoveKind.RESIZE, new_uuids(1)[0], migration)
    assert (caught.value.field, caught.value.value) == ("instance_uuid", migration)


def test_an_evacuation_of_an_instance_here_is_refused():
    v = view()
    instance, migration = new_uuids(2)
    build(v, instance)
    with pytest.raises(InvalidRequest, match="an evacuation rebuilds it on another"):
        claim(v, MoveKind.EVACUATION, migration, instance)


def test_an_evacuation_settled_here_that_left_is_a_new_move_under_the_same_name():
    """Its name is a function of instance and source: the instance
    evacuated here, gone since and evacuated from that source again, comes
    with the first one's name, and is claimed anew (not answered as a retry
    of the first, whose devices are gone)."""
    v = view()
    instance, migration = new_uuids(2)
    made(v, claim(v, MoveKind.EVACUATION, migration, instance))
    made(v, step(v, move_claims.finish, migration))
    made(v, step(v, move_claims.confirm, migration))
    left(v, instance)
    made(v, claim(v, MoveKind.EVACUATION, migration, instance))
    assert held(v, instance) == [(VF0, INSTANCE, instance, migration, CLAIMING)]
    assert v.migration(migration).state is MigrationState.ACTIVE


# --- the source's record and its half ---------------------------------------------

def test_a_source_told_of_a_move_records_it_announced_and_moves_nothing():
    v = view()
    instance, migration = new_uuids(2)
    build(v, instance)
    before = held(v, instance)
    m = made(v, move_claims.announce_source(v, MoveKind.LIVE_MIGRATION, migration,
                                            instance, TOLD))
    assert m == Migration(migration, instance, MoveKind.LIVE_MIGRATION,
                          MigrationRole.SOURCE, MigrationState.ANNOUNCED, SPEC, TOLD)
    assert v.migration(migration) == m
    assert held(v, instance) == before
    # A retry answers the record; one asking otherwise is refused.
    again = move_claims.announce_source(v, MoveKind.LIVE_MIGRATION, migration,
                                        instance, TOLD)
    assert (again.answer, again.change) == (m, None)
    with pytest.raises(RetryMismatch):
        move_claims.announce_source(v, MoveKind.LIVE_MIGRATION, migration, instance,
                                    RequestDigest.of(destination_host="hostc"))


def test_a_source_refuses_an_announcement_of_what_it_cannot_move():
    v = view()
    instance, migration = new_uuids(2)
    with pytest.raises(NoSuchInstance):
        move_claims.announce_source(v, MoveKind.LIVE_MIGRATION, migration, instance, TOLD)
    build(v, instance)
    made(v, move_claims.announce_source(v, MoveKind.LIVE_MIGRATION, migration,
                                        instance, TOLD))
    with pytest.raises(MoveInProgress):
        move_claims.announce_source(v, MoveKind.LIVE_MIGRATION, new_uuids(1)[0],
                                    instance, TOLD)


def test_the_sources_half_passes_the_devices_to_the_move_keeping_its_announcement():
    v = view()
    instance, migration = new_uuids(2)
    build(v, instance)
    made(v, move_claims.announce_source(v, MoveKind.LIVE_MIGRATION, migration,
                                        instance, TOLD))
    passed = made(v, move_claims.begin_source(v, MoveKind.LIVE_MIGRATION, migration,
                                              instance))
    assert held(v, instance) == [(VF0, MIGRATION, migration, migration, CLAIMING)]
    assert passed == v.rows_of(instance)
    m = v.migration(migration)
    assert (m.state, m.request) == (MigrationState.ACTIVE, TOLD)
    # Begun, a retry answers the devices the move holds.
    again = move_claims.begin_source(v, MoveKind.LIVE_MIGRATION, migration, instance)
    assert (again.answer, again.change) == (passed, None)


def test_a_source_half_that_was_not_announced_records_no_request():
    v = view()
    instance, migration = new_uuids(2)
    with pytest.raises(NoSuchInstance):
        move_claims.begin_source(v, MoveKind.RESIZE, migration, instance)
    build(v, instance)
    made(v, move_claims.begin_source(v, MoveKind.RESIZE, migration, instance))
    assert v.migration(migration) == Migration(
        migration, instance, MoveKind.RESIZE, MigrationRole.SOURCE, MigrationState.ACTIVE,
        SPEC, None)


# --- the steps that settle a move ---------------------------------------------------

def test_finish_makes_the_destinations_devices_claimed_once():
    v = view()
    instance, migration = new_uuids(2)
    made(v, claim(v, MoveKind.RESIZE, migration, instance))
    assert made(v, step(v, move_claims.finish, migration)) == v.rows_of(instance)
    assert held(v, instance) == [(VF0, INSTANCE, instance, migration, CLAIMED)]
    assert v.migration(migration).state is MigrationState.FINISHED
    assert step(v, move_claims.finish, migration).change is None


def test_finish_on_a_source_changes_nothing():
    v = view()
    instance, migration = new_uuids(2)
    build(v, instance)
    made(v, move_claims.begin_source(v, MoveKind.RESIZE, migration, instance))
    assert step(v, move_claims.finish, migration).change is None


def test_confirm_gives_the_old_devices_back_and_the_instance_keeps_the_new():
    v = view()
    instance, migration = resized_here(v)
    released = made(v, step(v, move_claims.confirm, migration))
    assert [(a.device_id, a.state) for a in released] == [
        (VF0, AssignmentState.RELEASED)]
    assert held(v, instance) == [(VF1, INSTANCE, instance, None, CLAIMING)]
    assert v.migration(migration).state is MigrationState.CONFIRMED
    assert v.instances[instance] == RESIZED
    # Once confirmed, again: nothing more to give back.
    assert (step(v, move_claims.confirm, migration).answer,
            step(v, move_claims.confirm, migration).change) == ([], None)


def test_a_sources_confirm_forgets_the_instance_and_keeps_the_move():
    v = view()
    instance, migration = new_uuids(2)
    build(v, instance)
    made(v, move_claims.begin_source(v, MoveKind.RESIZE, migration, instance))
    made(v, step(v, move_claims.confirm, migration))
    assert instance not in v.instances and v.rows_of(instance) == []
    assert v.migration(migration).state is MigrationState.CONFIRMED


def test_a_revert_here_gives_the_new_devices_back_and_the_old_spec_and_devices_return():
    v = view()
    instance, migration = resized_here(v)
    returned = made(v, step(v, move_claims.revert, migration))
    assert held(v, instance) == [(VF0, INSTANCE, instance, None, CLAIMING)]
    assert returned == v.rows_of(instance)
    assert v.instances[instance] == SPEC
    assert v.migration(migration).state is MigrationState.REVERTED
    # Ended: a retry answers the instance's devices, changing nothing.
    again = step(v, move_claims.revert, migration)
    assert (again.answer, again.change) == (v.rows_of(instance), None)


def test_a_destinations_revert_forgets_the_instance_it_brought():
    v = view()
    instance, migration = new_uuids(2)
    made(v, claim(v, MoveKind.RESIZE, migration, instance))
    made(v, step(v, move_claims.revert, migration))
    assert instance not in v.instances and not v.device_held(VF0)
    assert v.migration(migration).state is MigrationState.REVERTED


def test_a_withdrawn_claim_leaves_no_record_of_itself():
    """Refused within the call that made it: as if never asked."""
    v = view()
    instance, migration = new_uuids(2)
    made(v, claim(v, MoveKind.LIVE_MIGRATION, migration, instance))
    made(v, step(v, move_claims.withdraw, migration))
    assert (v.instances, v.migrations, v.live) == ({}, {}, {})
    assert not v.device_held(VF0)


def destination_then(settle: Step) -> Callable[[ClaimsView], str]:
    """A destination's claim, then ``settle`` on it: its move's uuid."""
    def recorded(v: ClaimsView) -> str:
        instance, migration = new_uuids(2)
        made(v, claim(v, MoveKind.LIVE_MIGRATION, migration, instance))
        made(v, step(v, settle, migration))
        return migration
    return recorded


@pytest.mark.parametrize("recorded", [destination_then(move_claims.finish),
                                      destination_then(move_claims.revert),
                                      lambda v: resized_here(v)[1]],
                         ids=["finished", "reverted", "within this host"])
def test_only_a_destinations_open_claim_is_withdrawn(recorded):
    v = view()
    migration = recorded(v)
    with pytest.raises(InvalidRequest, match="only a destination's open claim"):
        step(v, move_claims.withdraw, migration)
