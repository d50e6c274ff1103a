"""Rebuilding a lost store: the mapping from guests' metadata and
Placement's allocations to assignment rows (pure)."""
from __future__ import annotations

import itertools

import pytest

from compute_agent.claims.choice import Pool, Slot
from compute_agent.drivers.base import DeviceDetail, DeviceKind, GuestDevice, GuestSpec
from compute_agent.drivers.libvirt.guest_xml import build_domain_xml, parse_guest
from compute_agent.store.errors import RebuildRefused
from compute_agent.store.rebuild import RowSource, plan_rebuild

ROOT, CELL, PF = "root-p", "cell0-p", "pf-p"
POOLS = {
    ROOT: {"DISK_GB": Pool("h", "DISK_GB", DeviceKind.NUMA, 100)},
    CELL: {"VCPU": Pool("h_numa_0", "VCPU", DeviceKind.NUMA, 4, numa_node=0),
           "MEMORY_MB": Pool("h_numa_0", "MEMORY_MB", DeviceKind.NUMA, 4096, numa_node=0),
           "PCPU": Pool("h_numa_0", "PCPU", DeviceKind.PCPU, 2,
                        (Slot("2", 0), Slot("3", 0)), 0)},
    PF: {"SRIOV_NET_VF": Pool("h_PF", "SRIOV_NET_VF", DeviceKind.VF, 2,
                              (Slot("0000:81:10.0", 0), Slot("0000:81:10.2", 0)), 0)},
}
INSTANCE = "0b6f8f3e-54a4-4b8e-a6a9-2f1e0b3d7d01"
ALLOCATION = {CELL: {"VCPU": 1, "MEMORY_MB": 512, "PCPU": 1},
              PF: {"SRIOV_NET_VF": 1}, ROOT: {"DISK_GB": 10}}


def guest(*devices) -> GuestSpec:
    return GuestSpec(INSTANCE, "g", 2, 512, tuple(
        GuestDevice(i, k, d) for i, k, d in devices))


GUEST = guest(("a1", DeviceKind.NUMA, "0"), ("a2", DeviceKind.NUMA, "0"),
              ("a3", DeviceKind.PCPU, "3"), ("a4", DeviceKind.VF, "0000:81:10.2"))


def plan(guests, allocations):
    ids = (f"new-{n}" for n in itertools.count())
    return plan_rebuild(guests, allocations, RowSource(POOLS, "boot-2", lambda: next(ids)))


def test_each_device_of_the_metadata_finds_its_allocation():
    rebuilt = plan({INSTANCE: GUEST}, {INSTANCE: ALLOCATION})
    assert rebuilt.instances == {INSTANCE: {"name": "g", "vcpus": 2, "memory_mb": 512}}
    rows = {(a.id, a.provider_uuid, a.resource_class, a.device_id, a.amount)
            for a in rebuilt.assignments}
    assert rows == {("a3", CELL, "PCPU", "3", 1),
                    ("a4", PF, "SRIOV_NET_VF", "0000:81:10.2", 1),
                    # which id held which counted class is not recorded
                    ("a1", CELL, "MEMORY_MB", "0", 512), ("a2", CELL, "VCPU", "0", 1),
                    ("new-0", ROOT, "DISK_GB", "host", 10)}
    assert {(a.state, a.owner, a.boot_id) for a in rebuilt.assignments} == {
        ("claimed", "instance", "boot-2")}
    vf = next(a for a in rebuilt.assignments if a.id == "a4")
    assert vf.detail == DeviceDetail(numa_node=0)


def test_an_allocation_no_guest_explains_is_refused():
    with pytest.raises(RebuildRefused, match="consumer mig-1: holds allocations"):
        plan({INSTANCE: GUEST}, {INSTANCE: ALLOCATION, "mig-1": {PF: {"SRIOV_NET_VF": 1}}})


def test_a_guest_without_allocation_is_refused():
    with pytest.raises(RebuildRefused, match=f"guest {INSTANCE}: no allocation"):
        plan({INSTANCE: GUEST}, {})


def test_a_device_outside_its_allocations_pools_is_refused():
    stray = guest(("a1", DeviceKind.NUMA, "0"), ("a2", DeviceKind.NUMA, "0"),
                  ("a3", DeviceKind.PCPU, "3"), ("a4", DeviceKind.VF, "0000:81:11.0"))
    with pytest.raises(RebuildRefused) as e:
        plan({INSTANCE: stray}, {INSTANCE: ALLOCATION})
    assert "vf 0000:81:11.0 (assignment a4) matches 0" in str(e.value)
    assert "1 SRIOV_NET_VF allocated on provider pf-p" in str(e.value)


def test_the_domain_xml_reads_back_as_the_guest_it_was_built_from():
    built = GuestSpec(INSTANCE, "g", 2, 512, (
        GuestDevice("a3", DeviceKind.PCPU, "3", cpus=frozenset({3})),
        GuestDevice("a1", DeviceKind.NUMA, "0"),
        GuestDevice("a4", DeviceKind.VF, "0000:81:10.2")))
    read = parse_guest(build_domain_xml(built))
    assert read == GuestSpec(INSTANCE, "g", 2, 512, (
        GuestDevice("a3", DeviceKind.PCPU, "3"), GuestDevice("a1", DeviceKind.NUMA, "0"),
        GuestDevice("a4", DeviceKind.VF, "0000:81:10.2")))


def test_a_domain_without_our_metadata_is_not_described():
    assert parse_guest("<domain type='kvm'><name>x</name></domain>") is None
