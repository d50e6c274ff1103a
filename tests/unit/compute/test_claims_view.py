"""The tracker's in-memory view of the claims and a decision's change to it
(compute_agent/compute/claims_view.py): what a claim chooses, a change
applied and undone, and a change as the store records it (the view read
back from the store is the view that applied it)."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from compute_agent.claims.model import (
    Assignment,
    AssignmentState,
    DeviceUse,
    Migration,
    MigrationRole,
    MigrationState,
    MoveKind,
    Owner,
    RequestDigest,
)
from compute_agent.compute.claims_view import Change, ClaimsView, InstanceRecord
from compute_agent.drivers.base import DeviceKind, HostResource, HostResourceKind
from compute_agent.exception import ClaimFailed, InvalidRequest
from compute_agent.store.store import Store
from tests.unit.compute.trackers import (
    BUILT,
    ONE_VF,
    PF,
    SPEC,
    TWO_VFS,
    VF0,
    VF1,
    build,
    new_uuids,
    view,
)


def released(rows: Iterable[Assignment]) -> tuple[Assignment, ...]:
    return tuple(a.with_(state=AssignmentState.RELEASED) for a in rows)


def state(v: ClaimsView) -> tuple:
    """All a view holds that the store records, as it is now."""
    return (dict(v.live), {i: set(ids) for i, ids in v.by_instance.items()},
            dict(v.instances), dict(v.built), dict(v.migrations), dict(v.uses),
            set(v.held.devices))


# --- what a claim chooses ------------------------------------------------------

def test_a_claim_chooses_claiming_rows_of_this_boot_for_its_consumer():
    v = view()
    instance, migration = new_uuids(2)
    (row,) = v.choose_rows(instance, ONE_VF, migration, migration)
    assert (row.consumer_uuid, row.instance_uuid, row.owner, row.migration_uuid) == (
        migration, instance, Owner.INSTANCE, migration)
    assert (row.provider_uuid, row.resource_class, row.kind, row.device_id, row.amount,
            row.state, row.boot_id) == (PF, "SRIOV_NET_VF", DeviceKind.VF, VF0, 1,
                                        AssignmentState.CLAIMING, "boot-1")
    # Chosen is not taken: nothing changed until the change is applied.
    assert state(v) == state(view())


def test_a_claim_never_chooses_a_device_held_vetoed_or_used():
    v = view(one_time_use=True)
    first, second = new_uuids(2)
    build(v, first)
    (row,) = v.choose_rows(second, ONE_VF, second, None)
    assert row.device_id == VF1  # VF0 is held
    v.vetoed = frozenset({HostResource(HostResourceKind.PCI_ADDRESS, VF1)})
    with pytest.raises(ClaimFailed):
        v.choose_rows(second, ONE_VF, second, None)
    v.vetoed = frozenset()
    v.uses[VF1] = DeviceUse(VF1)
    with pytest.raises(ClaimFailed):
        v.choose_rows(second, ONE_VF, second, None)


def test_the_views_lookups():
    v = view()
    instance, other, migration = new_uuids(3)
    (own,), _ = build(v, instance)
    (new,) = v.choose_rows(instance, ONE_VF, instance, migration)
    passed = own.with_(owner=Owner.MIGRATION, consumer_uuid=migration,
                       migration_uuid=migration)
    m = Migration(migration, instance, MoveKind.RESIZE, MigrationRole.BOTH,
                  MigrationState.ACTIVE)
    v.apply(Change(claimed=(new,), updated=(passed,), migration=m))

    assert v.rows_of(instance) == sorted([passed, new], key=lambda a: a.id)
    assert v.rows_of(instance, Owner.MIGRATION) == [passed]
    assert v.rows_of(instance, Owner.INSTANCE, migration) == [new]
    assert v.rows_of(instance, Owner.INSTANCE, None) == []
    assert v.open_migration(instance) == m
    assert v.open_migration(other) is None
    assert v.migrations_of(instance) == (migration,)
    settled = dataclasses.replace(m, state=MigrationState.CONFIRMED)
    v.apply(Change(migration=settled))
    assert v.open_migration(instance) is None
    assert v.migration(migration) == settled
    with pytest.raises(InvalidRequest, match="no such move on this host"):
        v.migration(other)
    assert v.device_held(VF0) and v.device_held(VF1)


def test_a_row_indexed_again_on_another_device_gives_the_first_back():
    """As heal's realignment moves a row: the device it held before is free."""
    v = view()
    (instance,) = new_uuids(1)
    (row,), _ = build(v, instance)
    v.index([row.with_(device_id=VF1)])
    assert (v.device_held(VF0), v.device_held(VF1)) == (False, True)
    assert v.rows_of(instance) == [row.with_(device_id=VF1)]


# --- one-time-use devices ------------------------------------------------------

def test_a_claim_marks_its_one_time_use_devices_used_and_moves_the_uses_on():
    v = view(one_time_use=True)
    instance, other = new_uuids(2)
    rows, applied = build(v, instance)
    assert applied.marked == (DeviceUse(VF0),)
    assert v.uses == {VF0: DeviceUse(VF0)}
    assert v.uses_moved == 1
    # Giving the used device back moves them on too (the cleaner starts).
    v.apply(Change(updated=released(rows)))
    assert v.uses_moved == 2
    # A device already used is not marked again (a retry, a same-host move).
    assert v.newly_used(tuple(rows)) == ()
    # A claim of a device that is not one-time-use marks nothing.
    plain = view()
    _, applied = build(plain, other)
    assert (applied.marked, plain.uses, plain.uses_moved) == ((), {}, 0)


def test_a_one_time_use_device_held_with_no_use_recorded_is_found():
    """Held before its spec said one_time_use: its use was never recorded."""
    v = view()
    (instance,) = new_uuids(1)
    build(v, instance)
    assert v.held_unrecorded() == []
    v.pools = view(one_time_use=True).pools
    assert v.held_unrecorded() == [DeviceUse(VF0)]
    v.uses[VF0] = DeviceUse(VF0)
    assert v.held_unrecorded() == []


# --- a change applied and undone -------------------------------------------------

def test_a_change_undone_leaves_the_view_as_it_was():
    v = view(one_time_use=True)
    (instance,) = new_uuids(1)
    before = state(v)
    _, applied = build(v, instance)
    assert instance in v.instances and v.built[instance] == BUILT
    assert v.touched_providers == {PF}
    v.undo(applied)
    assert state(v) == before


def test_an_undo_takes_back_only_what_its_change_touched():
    """Later decisions went on meanwhile: they stay."""
    v = view()
    failed, later = new_uuids(2)
    _, applied = build(v, failed)
    (kept,), _ = build(v, later)
    v.undo(applied)
    assert v.instances == {later: SPEC}
    assert list(v.live.values()) == [kept]
    assert (v.device_held(VF0), v.device_held(VF1)) == (False, True)


def test_an_undone_release_puts_the_instance_its_build_and_its_moves_back():
    v = view()
    instance, migration = new_uuids(2)
    rows, _ = build(v, instance)
    v.apply(Change(migration=Migration(migration, instance, MoveKind.RESIZE,
                                       MigrationRole.SOURCE, MigrationState.CONFIRMED)))
    before = state(v)
    applied = v.apply(Change(updated=released(rows), forgotten_instance=instance,
                             forgotten_migrations=(migration,)))
    assert (v.instances, v.built, v.migrations, v.live) == ({}, {}, {}, {})
    assert not v.device_held(VF0)
    v.undo(applied)
    assert state(v) == before


# --- a change as the store records it ---------------------------------------------

@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


def test_each_change_written_is_read_back_as_the_view_applied_it(store):
    """A build, a same-host resize (rows passed to the move, a new spec
    that keeps its build), its confirm, and the instance's release: after
    each, the view read from the store is the one that applied them."""
    v = view(one_time_use=True)
    instance, migration = new_uuids(2)
    old = v.choose_rows(instance, ONE_VF, instance, None)
    # VF1, the resize's: VF0 is not taken until the build is applied.
    new = tuple(a for a in v.choose_rows(instance, TWO_VFS, instance, migration)
                if a.device_id == VF1)
    passed = tuple(a.with_(owner=Owner.MIGRATION, consumer_uuid=migration,
                           migration_uuid=migration, state=AssignmentState.CLAIMED)
                   for a in old)
    resized = {**SPEC, "vcpus": 2}
    m = Migration(migration, instance, MoveKind.RESIZE, MigrationRole.BOTH,
                  MigrationState.ACTIVE, SPEC, RequestDigest.of(spec=resized))
    changes = [
        Change(claimed=tuple(old), recorded=InstanceRecord(instance, SPEC, BUILT)),
        Change(claimed=new, updated=passed,
               recorded=InstanceRecord(instance, resized), migration=m),
        Change(updated=released(passed),
               migration=dataclasses.replace(m, state=MigrationState.CONFIRMED)),
        Change(updated=released(new), forgotten_instance=instance,
               forgotten_migrations=(migration,)),
    ]
    seen = []
    for change in changes:
        applied = v.apply(change)
        store.write(change.write(applied.marked))
        assert state(ClaimsView.read(store, "boot-1")) == state(v)
        seen.append((dict(v.instances), dict(v.built), {a.device_id for a in v.live.values()}))
    # What the steps held on the way, so that the comparison above saw them.
    assert seen == [({instance: SPEC}, {instance: BUILT}, {VF0}),
                    ({instance: resized}, {instance: BUILT}, {VF0, VF1}),
                    ({instance: resized}, {instance: BUILT}, {VF1}),
                    ({}, {}, set())]
    assert v.uses == {VF0: DeviceUse(VF0), VF1: DeviceUse(VF1)}


def test_a_move_that_leaves_keeps_its_record_for_a_retried_confirm(store):
    """An instance that leaves this host is forgotten; its move stays unless
    the change names it."""
    v = view()
    instance, migration = new_uuids(2)
    rows, applied = build(v, instance)
    store.write(applied.change.write(applied.marked))
    m = Migration(migration, instance, MoveKind.RESIZE, MigrationRole.SOURCE,
                  MigrationState.CONFIRMED)
    left = Change(updated=released(rows), migration=m, forgotten_instance=instance)
    store.write(left.write(v.apply(left).marked))
    read = ClaimsView.read(store, "boot-1")
    assert (read.instances, read.live, read.migrations) == ({}, {}, {migration: m})
