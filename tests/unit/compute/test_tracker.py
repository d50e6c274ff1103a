"""The tracker on a real store: what an assignment records of its device,
and what a retry is answered."""
import json
import sqlite3
import uuid

import pytest

from compute_agent.claims.choice import Pool, Slot
from compute_agent.claims.model import Assignment, AssignmentState, MoveKind, Owner
from compute_agent.compute.host import describe, guest_spec
from compute_agent.compute.tracker import Tracker
from compute_agent.drivers.base import DeviceDetail, DeviceKind
from compute_agent.exception import ClaimFailed, MoveInProgress, RetryMismatch
from compute_agent.store.queries import insert_assignments_sql, live_assignments
from compute_agent.store.schema import SCHEMA_VERSION, migrate, schema_version
from compute_agent.store.store import Store
from compute_agent.store.writer import run_statements
from tests.unit.compute.trackers import ONE_VF, PF, SPEC, tracker_on, vf_pools

ROOT = "5e1c0c5a-8a4e-4d4b-9c0e-2f1d6b7a9c31"


@pytest.fixture
def tracker(tmp_path):
    with tracker_on(tmp_path, vf_pools()) as t:
        yield t


def test_a_device_on_numa_node_0_is_recorded_on_node_0(tracker):
    inst = str(uuid.uuid4())
    rows = tracker.claim_build(inst, SPEC, ONE_VF)
    assert [a.detail for a in rows] == [DeviceDetail(numa_node=0)]
    stored = tracker.store.read(live_assignments)
    assert [a.detail for a in stored] == [DeviceDetail(numa_node=0)]
    (device,) = guest_spec(inst, SPEC, stored).devices
    assert device.detail.numa_node == 0


def boots(rows) -> set[tuple[str, str]]:
    return {(a.instance_uuid, a.boot_id) for a in rows}


def test_rebind_boot_moves_the_instances_rows_to_the_new_boot(tmp_path):
    """After a reboot (an agent on a new boot id, the same store), the
    rebound instance's rows carry the new boot id, in the store and in
    memory; another instance's rows keep theirs."""
    path = tmp_path / "state.db"
    rebound, other = str(uuid.uuid4()), str(uuid.uuid4())
    store = Store(path)
    before = Tracker(store, "boot-1")
    before.set_pools(vf_pools())
    before.claim_build(rebound, SPEC, ONE_VF)
    before.claim_build(other, SPEC, ONE_VF)
    store.close()

    store = Store(path)
    try:
        after = Tracker(store, "boot-2")
        after.rebind_boot(rebound)
        want = {(rebound, "boot-2"), (other, "boot-1")}
        assert boots(store.read(live_assignments)) == want
        assert boots(after.snapshot()[1]) == want
    finally:
        store.close()


def test_the_hosts_own_resources_are_shared_and_stay_out_of_the_guest(tmp_path):
    store = Store(tmp_path / "state.db")
    t = Tracker(store, "boot-1")
    t.set_pools({ROOT: {"DISK_GB": Pool("cmp", "DISK_GB", DeviceKind.HOST_RESOURCES, 100)}})
    spec = {"name": "vm", "vcpus": 1, "memory_mb": 512}
    try:
        for _ in range(2):  # each instance holds an amount, not the device
            inst = str(uuid.uuid4())
            (row,) = t.claim_build(inst, spec, {ROOT: {"resources": {"DISK_GB": 60}}})
            assert (row.kind, row.device_id, row.amount) == (
                DeviceKind.HOST_RESOURCES, "host", 60)
            assert guest_spec(inst, spec, [row]).devices == ()
            # The RPC answer names it as before it had a kind of its own.
            assert [(d["kind"], d["device_id"]) for d in describe([row])] == [
                ("numa", "host")]
    finally:
        store.close()


def test_a_device_held_under_its_old_class_is_not_handed_out_under_the_new(tmp_path):
    """Regression: devices were held per (provider, class), so once a NIC's
    VFs changed class (SRIOV_NET_VF to nova's CUSTOM_PCI_<V>_<P>, or a
    provider moved with the tree mode) the VF a running instance holds
    under the old class looked free in the new pool."""
    path = tmp_path / "state.db"
    store = Store(path)
    t = Tracker(store, "boot-1")
    t.set_pools(vf_pools())
    first = str(uuid.uuid4())
    (held,) = t.claim_build(first, SPEC, ONE_VF)
    renamed = {PF: {"CUSTOM_PCI_8086_154C": Pool(
        "cmp_0000:81:00.0", "CUSTOM_PCI_8086_154C", DeviceKind.VF, 2,
        (Slot("0000:81:10.0", numa_node=0), Slot("0000:81:10.1", numa_node=0)), 0)}}
    try:
        for tracker in (t, Tracker(store, "boot-1")):  # in memory, and read back
            tracker.set_pools(renamed)
            (got,) = tracker.claim_build(str(uuid.uuid4()), SPEC,
                                         {PF: {"resources": {"CUSTOM_PCI_8086_154C": 1}}})
            assert got.device_id != held.device_id
            with pytest.raises(ClaimFailed):
                tracker.claim_build(str(uuid.uuid4()), SPEC,
                                    {PF: {"resources": {"CUSTOM_PCI_8086_154C": 1}}})
            tracker.release_instance(got.instance_uuid)
    finally:
        store.close()


NEW_PF = "7d4f7a56-0d8e-4c1b-a7a4-3f3e0d9f2b10"


def test_realign_moves_rows_in_memory_and_store_and_skips_a_row_changed_since(tracker):
    """Heal's rewrite: one transaction; a row released meanwhile stays
    released, and the device is held under its new provider only."""
    moved_inst, released_inst = str(uuid.uuid4()), str(uuid.uuid4())
    [row] = tracker.claim_build(moved_inst, SPEC, ONE_VF)
    [gone] = tracker.claim_build(released_inst, SPEC, ONE_VF)
    tracker.release_instance(released_inst)
    new = row.with_(provider_uuid=NEW_PF, resource_class="CUSTOM_PCI_8086_154C")
    done = tracker.realign([(row, new), (gone, gone.with_(provider_uuid=NEW_PF))])
    assert done == [new]
    stored = tracker.store.read(live_assignments)
    assert [(a.id, a.provider_uuid, a.resource_class) for a in stored] == [
        (row.id, NEW_PF, "CUSTOM_PCI_8086_154C")]
    assert Tracker(tracker.store, "boot-1").snapshot()[1] == [new]
    assert tracker.snapshot()[1] == [new]
    assert {PF, NEW_PF} <= tracker.take_touched_providers()


@pytest.mark.parametrize("kind", list(MoveKind))
def test_the_destination_refuses_a_second_move_of_an_instance_in_a_move(tracker, kind):
    """While one move of an instance is open on the destination, another
    move of that instance is refused, naming the open one, and nothing is
    recorded (the pool has a free VF: only this check refuses)."""
    inst, first, second = (str(uuid.uuid4()) for _ in range(3))
    tracker.claim_move(kind, first, inst, SPEC, ONE_VF)
    before = tracker.snapshot()
    stored = tracker.store.dump()
    with pytest.raises(MoveInProgress) as refused:
        tracker.claim_move(kind, second, inst, SPEC, ONE_VF)
    assert (refused.value.instance_uuid, refused.value.migration_uuid) == (inst, first)
    assert tracker.snapshot() == before
    assert tracker.store.dump() == stored
    # A retry of the open move is still answered.
    assert tracker.claim_move(kind, first, inst, SPEC, ONE_VF) == before[1]


def test_records_of_a_version_5_store_are_answered_as_before_and_new_ones_checked(tmp_path):
    """A store from before the requests were recorded (schema 5) is
    migrated; its records keep no request, so a retry of the call that made
    one cannot be compared: it is answered from the record, as before. A
    record made since is compared."""
    path = tmp_path / "state.db"
    old, moved, migration = (str(uuid.uuid4()) for _ in range(3))
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target=5)
    conn.execute("BEGIN")
    for instance in (old, moved):
        conn.execute("INSERT INTO instances VALUES (?, ?, 0)", (instance, json.dumps(SPEC)))
    run_statements(conn, [insert_assignments_sql([
        a.with_(consumer_uuid=i, instance_uuid=i)
        for a, i in zip(_rows(), (old, moved))])])
    conn.execute("UPDATE assignments SET migration_uuid = ? WHERE instance_uuid = ?",
                 (migration, moved))
    conn.execute("INSERT INTO migrations VALUES (?, ?, 'resize', 'destination', 'active', "
                 "NULL, 0)", (migration, moved))
    conn.execute("COMMIT")
    conn.close()

    store = Store(path)
    try:
        assert store.read(schema_version) == SCHEMA_VERSION
        t = Tracker(store, "boot-1")
        t.set_pools(vf_pools())
        first = t.snapshot()[1]
        other = {**SPEC, "name": "other"}
        assert t.claim_build(old, other, ONE_VF) == [
            a for a in first if a.instance_uuid == old]
        assert t.claim_move(MoveKind.RESIZE, migration, moved, other, ONE_VF) == [
            a for a in first if a.instance_uuid == moved]
        assert t.snapshot()[1] == first
        # A build made now records its request: a retry must repeat it.
        t.release_instance(old)
        new = str(uuid.uuid4())
        assert t.claim_build(new, SPEC, ONE_VF) == t.claim_build(new, SPEC, ONE_VF)
        with pytest.raises(RetryMismatch) as caught:
            t.claim_build(new, other, ONE_VF)
        assert caught.value.fields == ["spec.name"]
    finally:
        store.close()


def _rows() -> list:
    """Two assignments of the PF's two VFs, instance fields to be set."""
    return [Assignment(str(uuid.uuid4()), "", "", Owner.INSTANCE, None, "SRIOV_NET_VF", PF,
                       DeviceKind.VF, device, 1, AssignmentState.CLAIMED, "boot-1",
                       DeviceDetail(numa_node=0))
            for device in ("0000:81:10.0", "0000:81:10.1")]
