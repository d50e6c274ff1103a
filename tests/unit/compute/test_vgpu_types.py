"""The vGPU types of vendor-specific VFIO VFs written back after a host's
reboot (compute_agent/compute/vgpu_types.py), on the fake driver."""
from __future__ import annotations

import logging
import uuid

import pytest

from compute_agent.compute.manager import ComputeManager
from compute_agent.compute.tracker import Tracker
from compute_agent.compute.vgpu_types import restore_vgpu_types_after_reboot, still_not_restored
from compute_agent.drivers.errors import DriverUnavailable
from compute_agent.drivers.fake import FakeDriver
from compute_agent.store.store import Store
from tests.unit.compute.trackers import ONE_VF, SPEC, VGPU_HOST, manager_on, vf_pools, vgpu_pools
from tests.unit.compute.trackers import VGPU_VF0 as VF0
from tests.unit.compute.trackers import VGPU_VF1 as VF1
from tests.unit.compute.trackers import on_vgpu_vf as on


@pytest.fixture
def manager(tmp_path):
    with manager_on(tmp_path, vgpu_pools(), FakeDriver(VGPU_HOST)) as m:
        yield m


def rebooted(manager: ComputeManager, boot_id: str) -> None:
    """The host reboots and the agent starts again on its store."""
    manager.driver.reboot(boot_id)
    path = manager.tracker.store.path
    manager.tracker.store.close()
    manager.tracker = Tracker(Store(path), boot_id)


def test_after_a_reboot_the_types_are_written_back_and_a_refusal_is_named(manager, caplog):
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    manager.build_instance(first, SPEC, on(VF0))
    manager.build_instance(second, SPEC, on(VF1))
    driver = manager.driver
    rebooted(manager, "boot-2")
    assert driver.vgpu_types == {}
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


def test_only_vgpu_vfs_are_written_and_each_one_restored_is_said(tmp_path, caplog):
    """A NIC's VF held across the reboot has no vGPU type to take back (the
    driver would refuse one: it is no vendor-specific VFIO VF)."""
    caplog.set_level(logging.INFO, logger="compute_agent.compute.vgpu_types")
    with manager_on(tmp_path, {**vgpu_pools(), **vf_pools()},
                    FakeDriver(VGPU_HOST)) as manager:
        with_vgpu, with_nic_vf = str(uuid.uuid4()), str(uuid.uuid4())
        manager.build_instance(with_vgpu, SPEC, on(VF0))
        manager.build_instance(with_nic_vf, SPEC, ONE_VF)
        rebooted(manager, "boot-2")

        assert restore_vgpu_types_after_reboot(manager, "boot-2") == {}

        assert manager.driver.vgpu_types == {VF0: "nvidia-557"}
        assert [r.getMessage() for r in caplog.records] == [
            f"vGPU VF {VF0} of instance {with_vgpu}: type nvidia-557 restored after the "
            "host's reboot"]


class StopsAnswering(FakeDriver):
    """A hypervisor that answers until told otherwise."""

    answering = True

    def set_vgpu_type(self, vf_address: str, type_id: str) -> None:
        if not self.answering:
            raise DriverUnavailable("libvirtd did not answer", "qemu:///system",
                                    "did not answer")
        super().set_vgpu_type(vf_address, type_id)


def test_a_hypervisor_that_does_not_answer_leaves_the_vf_not_restored(tmp_path):
    """Not raised: the agent starts, the VF's unit held back with the
    reason until a later start or the guest's own start writes its type."""
    driver = StopsAnswering(VGPU_HOST)
    with manager_on(tmp_path, vgpu_pools(), driver) as manager:
        manager.build_instance(str(uuid.uuid4()), SPEC, on(VF0))
        rebooted(manager, "boot-2")
        driver.answering = False

        assert restore_vgpu_types_after_reboot(manager, "boot-2") == {
            VF0: "libvirtd did not answer"}
        assert driver.vgpu_types == {}
