"""The vGPU types of vendor-specific VFIO VFs written back after a host's
reboot (compute_agent/compute/vgpu_types.py), on the fake driver."""
from __future__ import annotations

import uuid

import pytest

from compute_agent.compute.tracker import Tracker
from compute_agent.compute.vgpu_types import restore_vgpu_types_after_reboot, still_not_restored
from compute_agent.drivers.fake import FakeDriver
from compute_agent.store.store import Store
from tests.unit.compute.trackers import SPEC, VGPU_HOST, manager_on, vgpu_pools
from tests.unit.compute.trackers import VGPU_VF0 as VF0
from tests.unit.compute.trackers import VGPU_VF1 as VF1
from tests.unit.compute.trackers import on_vgpu_vf as on


@pytest.fixture
def manager(tmp_path):
    with manager_on(tmp_path, vgpu_pools(), FakeDriver(VGPU_HOST)) as m:
        yield m


def test_after_a_reboot_the_types_are_written_back_and_a_refusal_is_named(manager, caplog):
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    manager.build_instance(first, SPEC, on(VF0))
    manager.build_instance(second, SPEC, on(VF1))
    driver = manager.driver
    driver.reboot("boot-2")
    assert driver.vgpu_types == {}
    # The agent starts again on the new boot.
    path = manager.tracker.store.path
    manager.tracker.store.close()
    manager.tracker = Tracker(Store(path), driver.boot_id())
    driver.set_vgpu_type(VF1, "nvidia-558")  # taken meanwhile

    not_restored = restore_vgpu_types_after_reboot(manager, "boot-2")

    assert driver.vgpu_types == {VF0: "nvidia-557", VF1: "nvidia-558"}
    assert list(not_restored) == [VF1]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"vGPU VF {VF1} of instance {second}: type nvidia-557 not restored after the "
        f"host's reboot; its unit stays reserved: {not_restored[VF1]}"]
    # Once the rows are this boot's (the reconciliation moves them),
    # nothing is written again.
    for instance in (first, second):
        manager.tracker.rebind_boot(instance)
    assert restore_vgpu_types_after_reboot(manager, "boot-2") == {}


def test_a_vf_not_restored_is_held_back_until_it_has_a_type_or_is_given_back():
    lost = {VF0: "refused", VF1: "refused"}
    held = {VF0, VF1}
    assert still_not_restored(lost, frozenset(), held.__contains__) == lost
    assert still_not_restored(lost, frozenset({VF0}), held.__contains__) == {VF1: "refused"}
    assert still_not_restored(lost, frozenset(), {VF0}.__contains__) == {VF0: "refused"}
