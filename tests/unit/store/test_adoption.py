"""Adopting a host nova-compute ran: from nova's guests (their domains'
devices) and Placement's allocations to assignment rows (pure)."""
from __future__ import annotations

import itertools

import pytest

from compute_agent.claims.choice import Pool, Slot
from compute_agent.claims.model import AssignmentState, Owner
from compute_agent.drivers.base import DeviceDetail, DeviceKind, ForeignGuest, HostResource, HostResourceKind
from compute_agent.store.adoption import plan_adoption
from compute_agent.store.errors import AdoptionRefused
from compute_agent.store.rebuild import RowSource

# Nova's tree as the agent's nested model sees it: the root keeps nova's
# VCPU and MEMORY_MB only until heal; the cells carry them in the model.
ROOT, CELL0, CELL1, GPU, PF = "root-p", "cell0-p", "cell1-p", "gpu-p", "pf-p"
VF_CLASS = "CUSTOM_PCI_8086_154C"
MDEV, OTHER_MDEV = "4b20d080-1b54-4048-85b3-a6a62d165c01", "9e0c7d9e-0d0a-4c59-9d1e-0f5a4a1b2c3d"
VF1, VF2 = "0000:81:10.0", "0000:81:10.2"
POOLS = {
    ROOT: {"DISK_GB": Pool("h", "DISK_GB", DeviceKind.HOST_RESOURCES, 100)},
    CELL0: {"VCPU": Pool("h_numa_0", "VCPU", DeviceKind.NUMA, 4, numa_node=0),
            "MEMORY_MB": Pool("h_numa_0", "MEMORY_MB", DeviceKind.NUMA, 4096, numa_node=0)},
    CELL1: {"PCPU": Pool("h_numa_1", "PCPU", DeviceKind.PCPU, 2,
                         (Slot("6", 1), Slot("7", 1)), 1)},
    GPU: {"VGPU": Pool("h_pci_0000_06_00_0", "VGPU", DeviceKind.MDEV, 4,
                       (Slot(MDEV, 0), Slot(OTHER_MDEV, 0)), 0, "0000:06:00.0",
                       "nvidia-35")},
    PF: {VF_CLASS: Pool("h_0000:81:00.0", VF_CLASS, DeviceKind.VF, 2,
                        (Slot(VF1, 1), Slot(VF2, 1)), 1)},
}
A, B, C = ("0b6f8f3e-54a4-4b8e-a6a9-2f1e0b3d7d01", "1c7a9f4e-65b5-4c9f-b7ba-3a2f1c4e8e02",
           "2d8b0a5f-76c6-4dab-88cb-4b3a2d5f9f03")


def cpu(n: int) -> HostResource:
    return HostResource(HostResourceKind.HOST_CPU, str(n))


def pci(address: str) -> HostResource:
    return HostResource(HostResourceKind.PCI_ADDRESS, address)


def mdev(uuid: str) -> HostResource:
    return HostResource(HostResourceKind.MDEV_UUID, uuid)


def guest(uuid: str, *held: HostResource, running: bool = True) -> ForeignGuest:
    return ForeignGuest(uuid, f"vm-{uuid[:4]}", running, 2, 2048, frozenset(held))


GUESTS = {
    # A vGPU guest whose vCPUs nova pins to the shared CPUs: nothing the
    # agent hands out, so not a device.
    A: guest(A, mdev(MDEV), cpu(0), cpu(1), pci("0000:00:02.0")),
    B: guest(B, pci(VF2)),
    C: guest(C, cpu(6), cpu(7)),  # hw:cpu_policy=dedicated
}
ALLOCATIONS = {
    A: {ROOT: {"VCPU": 2, "MEMORY_MB": 2048, "DISK_GB": 10}, GPU: {"VGPU": 1}},
    B: {ROOT: {"VCPU": 1, "MEMORY_MB": 1024, "DISK_GB": 5}, PF: {VF_CLASS: 1}},
    C: {ROOT: {"PCPU": 2, "MEMORY_MB": 2048}},
}


def plan(guests, allocations):
    ids = (f"new-{n}" for n in itertools.count())
    return plan_adoption(guests, allocations, RowSource(POOLS, "boot-1", lambda: next(ids)))


def rows_of(adopted, instance):
    return {(a.provider_uuid, a.resource_class, a.kind.value, a.device_id, a.amount)
            for a in adopted.store.assignments if a.instance_uuid == instance}


def test_each_device_a_guest_holds_becomes_an_assignment_of_its_instance():
    adopted = plan(GUESTS, ALLOCATIONS)
    assert adopted.store.instances[A] == {"name": "vm-0b6f", "vcpus": 2, "memory_mb": 2048}
    assert rows_of(adopted, A) == {
        (GPU, "VGPU", "mdev", MDEV, 1),
        # nova's root amounts stay where Placement has them, until heal
        (ROOT, "VCPU", "host_resources", "host", 2),
        (ROOT, "MEMORY_MB", "host_resources", "host", 2048),
        (ROOT, "DISK_GB", "host_resources", "host", 10)}
    assert (PF, VF_CLASS, "vf", VF2, 1) in rows_of(adopted, B)
    # Pinned CPUs: held on nova's root, found in the cell's PCPU pool.
    assert rows_of(adopted, C) == {(ROOT, "PCPU", "pcpu", "6", 1),
                                   (ROOT, "PCPU", "pcpu", "7", 1),
                                   (ROOT, "MEMORY_MB", "host_resources", "host", 2048)}
    # As a completed build leaves them.
    assert {(a.state, a.owner, a.boot_id, a.consumer_uuid == a.instance_uuid)
            for a in adopted.store.assignments} == {
        (AssignmentState.CLAIMED, Owner.INSTANCE, "boot-1", True)}
    vgpu = next(a for a in adopted.store.assignments if a.kind is DeviceKind.MDEV)
    assert vgpu.detail == DeviceDetail(0, mdev_parent="0000:06:00.0", mdev_type="nvidia-35")
    assert adopted.skipped == []


def test_a_stopped_guest_takes_its_devices_back_and_a_lost_mdev_is_made_again():
    gone = "5f0e2a3b-8c7d-4e6f-9a0b-1c2d3e4f5a6b"  # removed by a host reboot
    adopted = plan({A: guest(A, mdev(gone), running=False)},
                   {A: {GPU: {"VGPU": 1}}})
    [row] = adopted.store.assignments
    assert (row.device_id, row.provider_uuid, row.detail.mdev_type) == (
        gone, GPU, "nvidia-35")


def test_every_problem_is_listed_one_a_line():
    mover = "3e9c1b60-87d7-4ebc-99dc-5c4b3e6a0a04"
    guests = {**GUESTS,
              # holds VF1 on a VGPU-only allocation
              B: guest(B, pci(VF1)),
              # runs on the same mdev as A, with no allocation at all
              mover: guest(mover, mdev(MDEV))}
    allocations = {**ALLOCATIONS, B: {GPU: {"VGPU": 1}},
                   "4f0d2c71-98e8-4fcd-aaed-6d5c4f7b1b05": {PF: {VF_CLASS: 1}}}
    with pytest.raises(AdoptionRefused) as refused:
        plan(guests, allocations)
    lines = str(refused.value).splitlines()
    assert lines == [
        f"mdev {MDEV}: held by 2 guests ({A}, {mover})",
        "consumer 4f0d2c71-98e8-4fcd-aaed-6d5c4f7b1b05: holds allocations on this "
        "host's providers but no guest is defined for it (a move in flight?)",
        f"guest {B}: pci/vf {VF1} matches 0 of its allocations' devices, not one",
        f"guest {B}: 1 VGPU allocated on provider {GPU} that no device it holds "
        "accounts for",
        f"guest {mover} (vm-3e9c): runs holding mdev {MDEV} but has no allocation on "
        "this host's providers"]


def test_a_class_the_model_has_nowhere_is_refused():
    with pytest.raises(AdoptionRefused, match="CUSTOM_PCI_15B3_1018 on provider pf-p, "
                                              "which has no such pool"):
        plan({B: guest(B)}, {B: {PF: {"CUSTOM_PCI_15B3_1018": 1}}})


def test_a_guest_without_allocations_holding_nothing_is_left_out():
    adopted = plan({A: guest(A, cpu(0)), B: guest(B, pci(VF1), running=False)}, {})
    assert adopted.store.instances == {} and adopted.store.assignments == []
    assert len(adopted.skipped) == 2
    assert f"guest {B} (vm-1c7a): stopped" in adopted.skipped[1]
    assert VF1 in adopted.skipped[1]
