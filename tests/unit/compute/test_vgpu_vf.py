"""vGPU VFs of NVIDIA's vendor-specific VFIO layout through the manager, on
the fake driver: the type written at claim time, cleared on release, a
refusal a clean failure (the types written back after a reboot are
test_vgpu_types's)."""
from __future__ import annotations

import uuid

import pytest

from compute_agent.drivers.base import DeviceKind
from compute_agent.drivers.errors import MdevError
from compute_agent.drivers.fake import FakeDriver
from tests.unit.compute.trackers import SPEC, VGPU_HOST, manager_on, vgpu_pools
from tests.unit.compute.trackers import VGPU_VF0 as VF0
from tests.unit.compute.trackers import VGPU_VF1 as VF1
from tests.unit.compute.trackers import on_vgpu_vf as on


@pytest.fixture
def manager(tmp_path):
    with manager_on(tmp_path, vgpu_pools(), FakeDriver(VGPU_HOST)) as m:
        yield m


def test_a_build_writes_the_type_and_a_delete_clears_it(manager):
    instance = str(uuid.uuid4())
    manager.build_instance(instance, SPEC, on(VF0))
    assert manager.driver.vgpu_types == {VF0: "nvidia-557"}
    _, rows, _ = manager.tracker.instance(instance)
    assert [(a.kind, a.device_id, a.detail.mdev_type) for a in rows] == [
        (DeviceKind.VGPU_VF, VF0, "nvidia-557")]
    # The guest holds the VF itself, by its address.
    assert {r.id for r in manager.driver.guest_holdings()[instance].resources} == {VF0}

    manager.delete_instance(instance)
    assert manager.driver.vgpu_types == {}


def test_a_type_the_vf_cannot_take_fails_the_build_and_leaves_it_as_it_was(manager):
    manager.driver.set_vgpu_type(VF0, "nvidia-558")  # someone else's
    instance = str(uuid.uuid4())
    with pytest.raises(MdevError, match="has vGPU type nvidia-558"):
        manager.build_instance(instance, SPEC, on(VF0))
    assert manager.driver.vgpu_types == {VF0: "nvidia-558"}
    assert not manager.tracker.knows(instance)
    assert manager.driver.guest_state(instance) is None


def test_a_resize_writes_at_its_claim_and_gives_the_claim_back_when_refused(manager):
    instance = str(uuid.uuid4())
    manager.build_instance(instance, SPEC, on(VF0))
    migration = str(uuid.uuid4())
    manager.prep_resize(migration, instance, SPEC, on(VF1))
    assert manager.driver.vgpu_types == {VF0: "nvidia-557", VF1: "nvidia-557"}
    manager.revert_resize(migration, instance)
    assert manager.driver.vgpu_types == {VF0: "nvidia-557"}

    manager.driver.set_vgpu_type(VF1, "nvidia-558")
    refused = str(uuid.uuid4())
    with pytest.raises(MdevError):
        manager.prep_resize(refused, instance, SPEC, on(VF1))
    _, rows, _ = manager.tracker.instance(instance)
    assert [a.device_id for a in rows] == [VF0]
    assert manager.driver.vgpu_types == {VF0: "nvidia-557", VF1: "nvidia-558"}


def test_a_vf_still_held_keeps_its_type_when_another_row_of_it_goes(manager):
    instance = str(uuid.uuid4())
    manager.build_instance(instance, SPEC, on(VF0))
    _, rows, _ = manager.tracker.instance(instance)
    # As a same-host move's release of a row whose VF a live one holds.
    manager.host.clear_vgpu_types(rows)
    assert manager.driver.vgpu_types == {VF0: "nvidia-557"}


def test_a_live_migrations_destination_writes_at_its_claim_and_clears_on_rollback(manager):
    instance, migration = str(uuid.uuid4()), str(uuid.uuid4())
    answer = manager.check_can_live_migrate_destination(migration, instance, SPEC, on(VF0))
    assert [(d["kind"], d["device_id"]) for d in answer["devices"]] == [("vgpu_vf", VF0)]
    assert manager.driver.vgpu_types == {VF0: "nvidia-557"}
    manager.rollback_live_migration_at_destination(migration, instance)
    assert manager.driver.vgpu_types == {}

    # A VF the driver refuses: the claim withdrawn, the VF as it was.
    manager.driver.set_vgpu_type(VF1, "nvidia-558")
    refused = str(uuid.uuid4())
    with pytest.raises(MdevError):
        manager.check_can_live_migrate_destination(refused, instance, SPEC, on(VF1))
    assert not manager.tracker.knows(instance)
    assert manager.driver.vgpu_types == {VF1: "nvidia-558"}


def test_an_evacuation_writes_at_its_claim(manager):
    instance, migration = str(uuid.uuid4()), str(uuid.uuid4())
    manager.accept_rebuild(migration, instance, SPEC, on(VF1))
    assert manager.driver.vgpu_types == {VF1: "nvidia-557"}
    manager.finish_rebuild(migration)
    assert {r.id for r in manager.driver.guest_holdings()[instance].resources} == {VF1}
