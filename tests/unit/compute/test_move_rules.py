"""The safety rules of claims and moves, each by a unit test that fails
when its rule is broken (each was caught only by functional tests, or by
none): a reverted move is not claimed again, a retry must ask what its
call asked (allocations too), a move named with another instance's uuid is
refused, an instance and a move never share a uuid, a move ends once, and
a build never chooses what a guest on the host holds."""
from __future__ import annotations

import uuid

import pytest

from compute_agent.claims.model import MoveKind
from compute_agent.compute.manager import ComputeManager
from compute_agent.drivers.base import (
    ForeignGuest,
    HostResource,
    HostResourceKind,
)
from compute_agent.exception import InvalidRequest, RetryMismatch
from tests.unit.compute.trackers import (
    ONE_VF,
    SPEC,
    TWO_VFS,
    VF0,
    VF1,
    manager_on,
    new_uuids,
    tracker_on,
    vf_pools,
)


@pytest.fixture
def tracker(tmp_path):
    with tracker_on(tmp_path, vf_pools()) as t:
        yield t


@pytest.fixture
def manager(tmp_path):
    with manager_on(tmp_path, vf_pools()) as m:
        yield m


# --- the tracker -------------------------------------------------------------

@pytest.mark.parametrize("kind", [MoveKind.RESIZE, MoveKind.LIVE_MIGRATION])
def test_a_retry_of_a_reverted_moves_claim_is_refused(tracker, kind):
    """A move reverted on its destination gave its devices back: a
    claim_move naming it again is not its retry (answered from the record,
    it would say devices are held that are not) and is refused, changing
    nothing."""
    instance, migration = new_uuids(2)
    tracker.claim_move(kind, migration, instance, SPEC, ONE_VF)
    tracker.revert_move(migration)
    before, stored = tracker.snapshot(), tracker.store.dump()
    with pytest.raises(InvalidRequest, match="this move was reverted"):
        tracker.claim_move(kind, migration, instance, SPEC, ONE_VF)
    assert tracker.snapshot() == before
    assert tracker.store.dump() == stored


def test_a_builds_retry_asking_other_allocations_is_refused(tracker):
    """The claim's record keeps the allocations with the spec: a build
    naming the same instance with other allocations is not its retry."""
    (instance,) = new_uuids(1)
    tracker.claim_build(instance, SPEC, ONE_VF)
    with pytest.raises(RetryMismatch) as caught:
        tracker.claim_build(instance, SPEC, TWO_VFS)
    assert caught.value.fields == ["allocations"]


def test_a_move_claims_retry_asking_other_allocations_is_refused(tracker):
    instance, migration = new_uuids(2)
    tracker.claim_move(MoveKind.RESIZE, migration, instance, SPEC, ONE_VF)
    with pytest.raises(RetryMismatch) as caught:
        tracker.claim_move(MoveKind.RESIZE, migration, instance, SPEC, TWO_VFS)
    assert caught.value.fields == ["allocations"]


def test_a_move_claimed_again_for_another_instance_is_refused(tracker):
    """A claim_move naming a move of this host with another instance's
    uuid is not that move's retry: refused, whatever else it asks."""
    instance, other, migration = new_uuids(3)
    tracker.claim_move(MoveKind.RESIZE, migration, instance, SPEC, ONE_VF)
    before = tracker.snapshot()
    with pytest.raises(InvalidRequest) as caught:
        tracker.claim_move(MoveKind.RESIZE, migration, other, SPEC, ONE_VF)
    assert caught.value.field == "instance_uuid"
    assert caught.value.reason == f"migration {migration} moves instance {instance}"
    assert tracker.snapshot() == before


def test_a_move_step_naming_another_instance_is_refused(manager):
    """Every move step checks that the move is the named instance's
    before it changes anything (here a revert that would stop and strip
    the other instance's guest)."""
    instance, other, migration = new_uuids(3)
    manager.build_instance(instance, SPEC, ONE_VF)
    manager.prep_resize(migration, instance, SPEC, ONE_VF)
    before = manager.tracker.snapshot()
    with pytest.raises(InvalidRequest) as caught:
        manager.revert_resize(migration, other)
    assert caught.value.reason == f"migration {migration} moves instance {instance}"
    assert manager.tracker.snapshot() == before


def test_a_move_is_refused_the_uuid_of_an_instance_here(tracker):
    """An instance and a move never share a uuid on a host (each is a
    consumer of its own in Placement)."""
    instance, moved = new_uuids(2)
    tracker.claim_build(instance, SPEC, ONE_VF)
    before = tracker.snapshot()
    with pytest.raises(InvalidRequest) as caught:
        tracker.claim_move(MoveKind.RESIZE, instance, moved, SPEC, ONE_VF)
    assert (caught.value.field, caught.value.value) == ("migration_uuid", instance)
    assert tracker.snapshot() == before


def test_an_instance_is_refused_the_uuid_of_a_move_here(tracker):
    instance, migration = new_uuids(2)
    tracker.claim_move(MoveKind.RESIZE, migration, instance, SPEC, ONE_VF)
    before = tracker.snapshot()
    with pytest.raises(InvalidRequest) as caught:
        tracker.claim_build(migration, SPEC, ONE_VF)
    assert (caught.value.field, caught.value.value) == ("instance_uuid", migration)
    with pytest.raises(InvalidRequest) as caught:
        tracker.claim_move(MoveKind.RESIZE, str(uuid.uuid4()), migration, SPEC, ONE_VF)
    assert (caught.value.field, caught.value.value) == ("instance_uuid", migration)
    assert tracker.snapshot() == before


# --- the manager --------------------------------------------------------------

def resized_on_this_host(manager: ComputeManager) -> tuple[str, str]:
    """An instance resized on its own host to a new VF, the guest running
    on it, the move not yet confirmed or reverted."""
    instance, migration = new_uuids(2)
    manager.build_instance(instance, SPEC, ONE_VF)
    manager.prep_resize(migration, instance, SPEC, ONE_VF)
    manager.resize_instance(migration, instance)
    manager.finish_resize(migration, instance)
    return instance, migration


def test_a_confirmed_move_is_not_reverted(manager):
    """A move ends once: the revert of a confirmed move is not a retry of
    anything, and is refused (answered, it would call a confirm a revert)."""
    instance, migration = resized_on_this_host(manager)
    manager.confirm_resize(migration, instance)
    before = manager.tracker.snapshot()
    with pytest.raises(RetryMismatch) as caught:
        manager.revert_resize(migration, instance)
    assert caught.value.fields == ["method"]
    assert manager.tracker.snapshot() == before
    # Its own step again is a retry, answered.
    assert manager.confirm_resize(migration, instance) == {
        "migration_uuid": migration, "state": "confirmed"}


def test_a_reverted_move_is_not_confirmed(manager):
    instance, migration = resized_on_this_host(manager)
    manager.revert_resize(migration, instance)
    before = manager.tracker.snapshot()
    with pytest.raises(RetryMismatch) as caught:
        manager.confirm_resize(migration, instance)
    assert caught.value.fields == ["method"]
    assert manager.tracker.snapshot() == before


def test_a_build_never_chooses_a_device_a_guest_on_the_host_holds(manager):
    """The hypervisor's guests are a veto, whatever the store says: a VF a
    guest the store does not know holds is not chosen (the build reads the
    guests before it claims)."""
    manager.driver.add_foreign_guest(ForeignGuest(
        str(uuid.uuid4()), "not-ours", True, 1, 512,
        frozenset({HostResource(HostResourceKind.PCI_ADDRESS, VF0)})))
    (instance,) = new_uuids(1)
    manager.build_instance(instance, SPEC, ONE_VF)
    _, rows, _ = manager.tracker.instance(instance)
    assert [a.device_id for a in rows] == [VF1]
