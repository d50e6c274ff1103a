"""This host as every kind of move step sees it
(compute_agent/compute/host.py): the guest defined from the store, the
devices a running guest still uses, the move checked against the call,
and the shared steps on the fake driver (guests read before a claim, a
guest run on the store's devices, devices given back, vGPU types written
and cleared, a move's refused claim given back whole)."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from compute_agent.claims.model import (
    Assignment,
    AssignmentState,
    Migration,
    MigrationRole,
    MigrationState,
    MoveKind,
    Owner,
)
from compute_agent.compute.host import (
    Host,
    describe,
    describe_migration,
    guest_spec,
    live_conflicts,
    move_agrees,
)
from compute_agent.compute.manager import ComputeManager
from compute_agent.drivers.base import (
    DeviceDetail,
    DeviceKind,
    ForeignGuest,
    GuestDevice,
    GuestState,
    HostResource,
    HostResourceKind,
)
from compute_agent.drivers.errors import MdevError
from compute_agent.drivers.fake import FakeDriver, fake_definition
from compute_agent.exception import DevicesInUse, InvalidRequest
from tests.functional.claims_world import host_dict, make_world
from tests.unit.compute.trackers import (
    ONE_VF,
    PF,
    SPEC,
    VF0,
    VF1,
    VGPU_HOST,
    VGPU_VF0,
    VGPU_VF1,
    manager_on,
    new_uuids,
    on_vgpu_vf,
    vf_pools,
    vgpu_pools,
)

INSTANCE, MIGRATION = new_uuids(2)


def row(kind: DeviceKind = DeviceKind.VF, device_id: str = VF0,
        owner: Owner = Owner.INSTANCE, amount: int = 1) -> Assignment:
    (assignment_id,) = new_uuids(1)
    return Assignment(assignment_id, MIGRATION if owner is Owner.MIGRATION else INSTANCE,
                      INSTANCE, owner, MIGRATION, "SRIOV_NET_VF", PF, kind, device_id,
                      amount, AssignmentState.CLAIMED, "boot-1", DeviceDetail(numa_node=0))


# --- the guest and the answers, pure ------------------------------------------

def test_the_guest_carries_the_instances_own_devices_only():
    """Not the devices the migration holds (the side being left), nor the
    host's resources (amounts of no device); pinned CPUs as CPUs."""
    vf, pcpu = row(), row(DeviceKind.PCPU, "3")
    rows = [vf, row(device_id=VF1, owner=Owner.MIGRATION),
            row(DeviceKind.HOST_RESOURCES, "host", amount=10), pcpu]
    guest = guest_spec(INSTANCE, {"name": "vm", "vcpus": 2, "memory_mb": 1024}, rows)
    assert (guest.instance_uuid, guest.name, guest.vcpus, guest.memory_mb) == (
        INSTANCE, "vm", 2, 1024)
    assert guest.devices == (
        GuestDevice(vf.id, DeviceKind.VF, VF0, 1, frozenset(), DeviceDetail(numa_node=0)),
        GuestDevice(pcpu.id, DeviceKind.PCPU, "3", 1, frozenset({3}),
                    DeviceDetail(numa_node=0)))


def test_an_answer_describes_each_assignment_and_move():
    a = row(owner=Owner.MIGRATION)
    assert describe([a]) == [{
        "id": a.id, "owner": "migration", "consumer_uuid": MIGRATION,
        "migration_uuid": MIGRATION, "resource_class": "SRIOV_NET_VF",
        "provider_uuid": PF, "kind": "vf", "device_id": VF0, "amount": 1,
        "state": "claimed"}]
    # The host's resources as RPC 1.0 named them, before they had a kind.
    (answer,) = describe([row(DeviceKind.HOST_RESOURCES, "host", amount=10)])
    assert (answer["kind"], answer["device_id"], answer["amount"]) == ("numa", "host", 10)
    m = Migration(MIGRATION, INSTANCE, MoveKind.LIVE_MIGRATION, MigrationRole.SOURCE,
                  MigrationState.ANNOUNCED)
    assert describe_migration(m) == {"uuid": MIGRATION, "kind": "live_migration",
                                     "role": "source", "state": "announced"}


def test_a_running_guest_uses_a_device_by_its_assignment_or_by_the_device_itself():
    mine, other, free = row(), row(device_id=VF1), row(DeviceKind.PCPU, "3")
    by_id = GuestState(True, frozenset({mine.id}), frozenset({mine.id}))
    # Another row's id, holding VF1 itself (a definition not ours).
    by_device = GuestState(True, frozenset(), frozenset(),
                           frozenset({HostResource(HostResourceKind.PCI_ADDRESS, VF1)}))
    assert live_conflicts(by_id, [mine, other, free]) == [f"vf {VF0}"]
    assert live_conflicts(by_device, [mine, other, free]) == [f"vf {VF1}"]
    stopped = GuestState(False, frozenset({mine.id}), frozenset({mine.id}))
    assert live_conflicts(stopped, [mine]) == []
    assert live_conflicts(None, [mine]) == []


def test_a_move_agrees_with_the_call_in_its_instance_this_hosts_role_and_its_kind():
    m = Migration(MIGRATION, INSTANCE, MoveKind.RESIZE, MigrationRole.SOURCE,
                  MigrationState.ACTIVE)
    assert move_agrees(m, INSTANCE, (MigrationRole.SOURCE,), (MoveKind.RESIZE,)) is m
    with pytest.raises(InvalidRequest, match=f"moves instance {INSTANCE}"):
        move_agrees(m, MIGRATION, (MigrationRole.SOURCE,), (MoveKind.RESIZE,))
    with pytest.raises(InvalidRequest) as caught:
        move_agrees(m, INSTANCE, (MigrationRole.DESTINATION, MigrationRole.BOTH),
                    (MoveKind.RESIZE,))
    assert caught.value.reason == "this host is the move's source, not its destination or both"
    with pytest.raises(InvalidRequest) as caught:
        move_agrees(m, INSTANCE, (MigrationRole.SOURCE,), (MoveKind.LIVE_MIGRATION,))
    assert caught.value.reason == "is a resize, not a live_migration"


# --- the host's steps, on the fake driver -------------------------------------------

@pytest.fixture
def manager(tmp_path: Path) -> Iterator[ComputeManager]:
    with manager_on(tmp_path, vf_pools()) as m:
        yield m


def built(manager: ComputeManager) -> str:
    (instance,) = new_uuids(1)
    manager.build_instance(instance, SPEC, ONE_VF)
    return instance


def live_devices(driver: FakeDriver, instance: str) -> set[str]:
    state = driver.guest_state(instance)
    assert state is not None
    return {r.id for r in state.live_resources}


def test_an_instance_is_answered_as_the_store_and_the_hypervisor_have_it(manager):
    host = manager.host
    instance = built(manager)
    _, rows, _ = manager.tracker.instance(instance)
    answer = host.get_instance(instance)
    definition = fake_definition(host.guest(instance))
    assert answer == {"uuid": instance, "spec": SPEC, "assignments": describe(rows),
                      "migrations": [], "running": True, "definition": definition,
                      "live_definition": definition}
    # Redefined on the store's new devices, it runs on the old ones until
    # it is next started.
    manager.tracker.claim_move(MoveKind.RESIZE, new_uuids(1)[0], instance, SPEC, ONE_VF)
    host.redefine_guest(instance)
    answer = host.get_instance(instance)
    assert answer["definition"] == fake_definition(host.guest(instance)) != definition
    assert answer["live_definition"] == definition
    manager.driver.power_off(instance)
    answer = host.get_instance(instance)
    assert (answer["running"], answer["live_definition"]) == (False, None)


def test_a_claim_after_the_guests_are_read_never_chooses_what_a_guest_holds(manager):
    """Whatever the store says: a guest someone else defined holds VF0."""
    manager.driver.add_foreign_guest(ForeignGuest(
        new_uuids(1)[0], "not-ours", True, 1, 512,
        frozenset({HostResource(HostResourceKind.PCI_ADDRESS, VF0)})))
    manager.host.read_guests()
    (instance,) = new_uuids(1)
    (chosen,) = manager.tracker.claim_build(instance, SPEC, ONE_VF)
    assert chosen.device_id == VF1


def test_a_moves_claim_reads_the_guests_first(manager):
    manager.driver.add_foreign_guest(ForeignGuest(
        new_uuids(1)[0], "not-ours", True, 1, 512,
        frozenset({HostResource(HostResourceKind.PCI_ADDRESS, VF0)})))
    instance, migration = new_uuids(2)
    (chosen,) = manager.host.claim_move(MoveKind.RESIZE, migration, instance, SPEC, ONE_VF)
    assert chosen.device_id == VF1


def test_a_stopped_guest_runs_with_the_stores_devices(manager):
    instance = built(manager)
    manager.driver.power_off(instance)
    manager.host.run_with_store_devices(instance)
    assert live_devices(manager.driver, instance) == {VF0}


def test_a_guest_running_on_other_devices_is_stopped_first_then_runs_on_the_stores(manager):
    """libvirt cannot change a running guest's devices by redefining it."""
    instance = built(manager)
    (migration,) = new_uuids(1)
    manager.tracker.claim_move(MoveKind.RESIZE, migration, instance, SPEC, ONE_VF)
    assert live_devices(manager.driver, instance) == {VF0}  # the store now says VF1
    manager.host.run_with_store_devices(instance)
    assert live_devices(manager.driver, instance) == {VF1}


class CountsStops(FakeDriver):
    def __init__(self) -> None:
        super().__init__()
        self.stopped: list[str] = []

    def power_off(self, instance_uuid: str) -> None:
        self.stopped.append(instance_uuid)
        super().power_off(instance_uuid)


def test_a_guest_running_on_the_stores_devices_is_not_restarted(tmp_path):
    with manager_on(tmp_path, vf_pools(), CountsStops()) as manager:
        instance = built(manager)
        manager.host.run_with_store_devices(instance)
        assert manager.driver.stopped == []
        assert live_devices(manager.driver, instance) == {VF0}


def test_devices_a_running_guest_uses_are_not_given_back(manager):
    instance = built(manager)
    _, rows, _ = manager.tracker.instance(instance)
    with pytest.raises(DevicesInUse) as caught:
        manager.host.check_not_in_use(instance, rows)
    assert (caught.value.instance_uuid, caught.value.devices) == (instance, [f"vf {VF0}"])
    manager.driver.power_off(instance)
    assert manager.host.check_not_in_use(instance, rows) is None


def test_the_moves_lookups_check_the_call(manager):
    instance = built(manager)
    (migration,) = new_uuids(1)
    host = manager.host
    assert host.known_migration(migration, instance, tuple(MigrationRole),
                                tuple(MoveKind)) is None
    with pytest.raises(InvalidRequest, match="no such move on this host"):
        host.migration(migration, instance, tuple(MigrationRole))
    with pytest.raises(InvalidRequest, match="must be a UUID"):
        host.known_migration("nope", instance, tuple(MigrationRole), tuple(MoveKind))
    manager.tracker.claim_move(MoveKind.RESIZE, migration, instance, SPEC, ONE_VF)
    m = host.migration(migration, instance, (MigrationRole.BOTH,))
    assert host.known_migration(migration, instance, (MigrationRole.BOTH,),
                                (MoveKind.RESIZE,)) == m
    with pytest.raises(InvalidRequest, match="not its source"):
        host.known_migration(migration, instance, (MigrationRole.SOURCE,),
                             (MoveKind.RESIZE,))
    assert [a.device_id for a in host.migration_rows(m, Owner.MIGRATION)] == [VF0]
    assert [a.device_id for a in host.migration_rows(m, Owner.INSTANCE)] == [VF1]
    assert host.claimed_by_move(m) == host.migration_rows(m, Owner.INSTANCE)
    # Confirmed, the devices the instance kept are no longer the move's.
    manager.tracker.confirm_move(migration)
    assert host.migration_rows(m, Owner.INSTANCE) == []
    manager.delete_instance(instance)
    # The instance is gone from here: its move claimed nothing here now.
    assert host.claimed_by_move(m) == []


# --- devices given back --------------------------------------------------------

@pytest.mark.parametrize("remove_released_mdevs", [True, False])
def test_an_mdev_given_back_is_removed_only_when_configured(tmp_path, remove_released_mdevs):
    # No mdev exists yet: the claim's is created, as the guest starts.
    world = make_world(tmp_path, host=host_dict(existing_mdev=False))
    try:
        host = Host(world.tracker, world.driver, remove_released_mdevs)
        (instance,) = new_uuids(1)
        world.manager.build_instance(instance, SPEC, world.allocations({"gpu": {"VGPU": 1}}))
        _, (mdev,), _ = world.tracker.instance(instance)
        assert mdev.kind is DeviceKind.MDEV and mdev.device_id in world.existing_mdevs()
        world.driver.destroy(instance)
        host.release_devices(world.tracker.release_instance(instance))
        assert (mdev.device_id in world.existing_mdevs()) is not remove_released_mdevs
    finally:
        world.stop()


@pytest.fixture
def vgpus(tmp_path: Path) -> Iterator[ComputeManager]:
    with manager_on(tmp_path, vgpu_pools(), FakeDriver(VGPU_HOST)) as m:
        yield m


def test_only_vgpu_vfs_take_a_type(vgpus):
    host = vgpus.host
    typed = GuestDevice("a", DeviceKind.VGPU_VF, VGPU_VF0,
                        detail=DeviceDetail(mdev_type="nvidia-557"))
    # The fake refuses a type on any device but a vendor-specific VFIO VF.
    nic = GuestDevice("b", DeviceKind.VF, VF0, detail=DeviceDetail(mdev_type="nvidia-557"))
    host.take_vgpu_types([typed, nic])
    assert vgpus.driver.vgpu_types == {VGPU_VF0: "nvidia-557"}


def test_a_vf_given_back_and_claimed_again_before_its_clear_keeps_its_type(vgpus):
    """Its type is the new holder's now."""
    first, second = new_uuids(2)
    vgpus.build_instance(first, SPEC, on_vgpu_vf(VGPU_VF0))
    # The first's delete, its clear not yet run.
    vgpus.driver.destroy(first)
    released = vgpus.tracker.release_instance(first)
    vgpus.build_instance(second, SPEC, on_vgpu_vf(VGPU_VF0))
    vgpus.host.clear_vgpu_types(released)
    assert vgpus.driver.vgpu_types == {VGPU_VF0: "nvidia-557"}
    vgpus.host.release_devices(vgpus.tracker.release_instance(second))
    assert vgpus.driver.vgpu_types == {}


class RefusesToClear(FakeDriver):
    def clear_vgpu_type(self, vf_address: str, type_id: str) -> None:
        raise MdevError(f"{vf_address}: current_vgpu_type: Device or resource busy")


def test_a_vf_whose_type_cannot_be_cleared_is_given_back_all_the_same(tmp_path, caplog):
    """The refusal is said, not raised: the VF stays typed, and a claim of
    another type on it fails cleanly."""
    with manager_on(tmp_path, vgpu_pools(), RefusesToClear(VGPU_HOST)) as manager:
        (instance,) = new_uuids(1)
        manager.build_instance(instance, SPEC, on_vgpu_vf(VGPU_VF0))
        manager.delete_instance(instance)
        assert not manager.tracker.knows(instance)
        assert manager.driver.vgpu_types == {VGPU_VF0: "nvidia-557"}
        assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(
            logging.WARNING, f"vGPU VF {VGPU_VF0} given back keeps its type: {VGPU_VF0}: "
            "current_vgpu_type: Device or resource busy")]


class RefusesSecondType(FakeDriver):
    """Takes the first type written and refuses the next, whichever VF
    the claim's order puts first."""

    def set_vgpu_type(self, vf_address: str, type_id: str) -> None:
        if self.vgpu_types:
            raise MdevError(f"{vf_address}: cannot create vGPU type {type_id} now")
        super().set_vgpu_type(vf_address, type_id)


def test_a_destinations_claim_a_vf_refuses_is_withdrawn_and_the_vfs_typed_cleared(tmp_path):
    """As if never asked: no instance, no move, no VF typed."""
    with manager_on(tmp_path, vgpu_pools(), RefusesSecondType(VGPU_HOST)) as manager:
        instance, migration = new_uuids(2)
        both = {**on_vgpu_vf(VGPU_VF0), **on_vgpu_vf(VGPU_VF1)}
        with pytest.raises(MdevError, match="cannot create"):
            manager.host.claim_move(MoveKind.EVACUATION, migration, instance, SPEC, both)
        assert manager.tracker.snapshot() == ({}, [], {})
        assert manager.driver.vgpu_types == {}


def test_a_claim_within_this_host_a_vf_refuses_is_reverted(vgpus):
    """The instance keeps its device; the move stays recorded, reverted."""
    (instance, migration) = new_uuids(2)
    vgpus.build_instance(instance, SPEC, on_vgpu_vf(VGPU_VF0))
    _, before, _ = vgpus.tracker.instance(instance)
    vgpus.driver.set_vgpu_type(VGPU_VF1, "nvidia-558")  # someone else's
    with pytest.raises(MdevError, match="has vGPU type nvidia-558"):
        vgpus.host.claim_move(MoveKind.RESIZE, migration, instance, SPEC,
                              on_vgpu_vf(VGPU_VF1))
    _, rows, moves = vgpus.tracker.instance(instance)
    assert [(a.id, a.owner, a.migration_uuid) for a in rows] == [
        (before[0].id, Owner.INSTANCE, None)]
    assert [m.state for m in moves] == [MigrationState.REVERTED]
    assert vgpus.driver.vgpu_types == {VGPU_VF0: "nvidia-557", VGPU_VF1: "nvidia-558"}
