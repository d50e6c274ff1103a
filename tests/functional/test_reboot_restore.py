"""VFs back after a simulated host reboot, through the libvirt driver on the
test driver, against the real Placement: the sysfs tree forgets its VFs as
the kernel does (SysfsBuilder.reboot), the boot ID changes, and the next
agent sets each PF's VF count again before its first cycle; what it cannot
restore stays reserved in Placement with a reason."""
from __future__ import annotations

import json
import logging
import time
import uuid

import pytest

from compute_agent.daemon import start_up
from compute_agent.health.rules import DeviceFault
from compute_agent.health.vf_restore import record_from_json
from compute_agent.store.queries import meta_value
from compute_agent.store.schema import SRIOV_RECORD
from compute_agent.tree.ownership import UNHEALTHY_TRAIT
from tests.functional.helpers import put_allocations
from tests.functional.libvirt_host import PF, Host

VF_SPEC = {"pci": {"device_spec": [json.dumps({"vendor_id": "8086", "product_id": "10ed",
                                               "resource_class": "SRIOV_NET_VF"})]}}
SPEC = {"name": "guest-1", "vcpus": 1, "memory_mb": 256}


def vf_host(tmp_path, url: str, vfs: int = 8) -> Host:
    h = Host(tmp_path, url)
    h.sys.add_numa_node(0, "0-3", 8192)
    h.sys.add_pf(PF, "8086", "10fb", "10ed", numa_node=0, total_vfs=vfs, num_vfs=vfs,
                 driver="ixgbe", vf_driver="vfio-pci")
    return h


def start(h: Host, **policy) -> None:
    """A new agent process on the host, its start up to its first cycle."""
    if h.agent is not None:
        h.agent.manager.tracker.store.close()
        h.agent.driver.cleanup()
    h.make_agent(**(policy or VF_SPEC))
    h.play_the_kernel()
    start_up.restore_after_reboot(h.agent.vf_restore, h.agent.driver)
    h.cycle()


def pf_provider(h: Host) -> dict:
    return h.provider(PF.upper())


def build_on_a_vf(h: Host) -> str:
    """An instance holding one VF; returns the VF's address."""
    instance = str(uuid.uuid4())
    cell = {"resources": {"VCPU": 1, "MEMORY_MB": 256}}
    allocations = {h.uuid_of("numa_0"): cell,
                   pf_provider(h)["uuid"]: {"resources": {"SRIOV_NET_VF": 1}}}
    put_allocations(h.url, instance, allocations)
    h.agent.manager.build_instance(instance, SPEC, allocations)
    _, rows, _ = h.agent.manager.tracker.instance(instance)
    return next(a.device_id for a in rows if a.kind.value == "vf")


def numvfs(h: Host) -> str:
    return (h.sys.device_dir(PF) / "sriov_numvfs").read_text().strip()


@pytest.fixture
def host(tmp_path, placement):
    h = vf_host(tmp_path, placement.url)
    start(h)
    yield h
    h.agent.manager.tracker.store.close()
    h.agent.driver.cleanup()


def test_a_reboot_gets_the_recorded_vf_count_back_before_the_first_cycle(host, caplog):
    held = build_on_a_vf(host)
    group_before = (host.sys.device_dir(held) / "iommu_group").readlink().name
    host.reboot()
    assert numvfs(host) == "0" and not (host.sys.device_dir(PF) / "virtfn0").exists()

    with caplog.at_level(logging.INFO):
        start(host)

    assert numvfs(host) == "8"
    # The guest's VF is back, the same address and ids; its IOMMU group
    # number is the new boot's.
    assert (host.sys.device_dir(held) / "device").read_text().strip() == "0x10ed"
    assert (host.sys.device_dir(held) / "iommu_group").readlink().name != group_before
    inventory = pf_provider(host)["inventories"]["SRIOV_NET_VF"]
    assert (inventory["total"], inventory["reserved"]) == (8, 0)
    assert not any("not restored" in r.message for r in caplog.records)
    assert any("VF counts restored after the reboot" in r.message for r in caplog.records)
    # A restart in the same boot writes nothing: a count set by hand since
    # (none) stays, where a start taken for a reboot would write 8 again.
    host.sys.set_num_vfs(PF, 0)
    start(host)
    assert numvfs(host) == "0"


def test_a_vf_count_the_pf_cannot_take_keeps_the_units_reserved_with_a_reason(host, caplog):
    held = build_on_a_vf(host)
    host.reboot()
    # New firmware offers fewer VFs than the host had.
    (host.sys.device_dir(PF) / "sriov_totalvfs").write_text("4\n")

    with caplog.at_level(logging.WARNING):
        start(host)

    assert numvfs(host) == "0"
    lines = [r.message for r in caplog.records if "not restored after the reboot" in r.message]
    assert len(lines) == 8, lines
    assert any(held in line and "sriov_totalvfs is 4" in line for line in lines)
    provider = pf_provider(host)
    inventory = provider["inventories"]["SRIOV_NET_VF"]
    # Every unit stays, reserved: the guest's allocation stays valid, no
    # claim is given a VF that is not there.
    assert (inventory["total"], inventory["reserved"]) == (8, 8)
    assert {UNHEALTHY_TRAIT, DeviceFault.NOT_RESTORED.trait} <= set(provider["traits"])
    # The record keeps the count for the next reboot.
    record = record_from_json(host.agent.manager.tracker.store.read(meta_value(SRIOV_RECORD)))
    assert record[PF].num_vfs == 8

    # The operator puts the VFs back by hand: the units return.
    (host.sys.device_dir(PF) / "sriov_totalvfs").write_text("8\n")
    host.sys.set_num_vfs(PF, 8)
    host.libvirt_sees_the_new_host()
    host.agent.health.poll()  # as the watch does within a second
    host.cycle()
    provider = pf_provider(host)
    assert provider["inventories"]["SRIOV_NET_VF"]["reserved"] == 0
    assert DeviceFault.NOT_RESTORED.trait not in provider["traits"]


def test_a_configured_count_replaces_one_set_by_hand_while_no_vf_is_in_use(host):
    host.reboot()
    host.sys.set_num_vfs(PF, 2)  # set at boot by another tool
    host.sys.write_test_driver_host_xml(host.host_xml)
    start(host, pci={**VF_SPEC["pci"], "vf_counts": f"{PF}=6"})
    # Written 0 first, then 6: the kernel refuses 2 -> 6 (the fake raises).
    assert numvfs(host) == "6"
    assert pf_provider(host)["inventories"]["SRIOV_NET_VF"]["total"] == 6


def test_restore_time_of_a_pf_with_64_vfs(tmp_path, placement, caplog):
    h = vf_host(tmp_path, placement.url, vfs=64)
    start(h)
    assert pf_provider(h)["inventories"]["SRIOV_NET_VF"]["total"] == 64
    h.reboot()
    h.agent.manager.tracker.store.close()
    h.agent.driver.cleanup()
    h.make_agent(**VF_SPEC)
    h.play_the_kernel()
    began = time.perf_counter()
    start_up.restore_after_reboot(h.agent.vf_restore, h.agent.driver)
    restored = time.perf_counter() - began
    h.cycle()
    cycled = time.perf_counter() - began
    assert numvfs(h) == "64"
    inventory = pf_provider(h)["inventories"]["SRIOV_NET_VF"]
    assert (inventory["total"], inventory["reserved"]) == (64, 0)
    print(f"reboot restore of a PF with 64 VFs: {restored:.3f} s to restore and verify, "
          f"{cycled:.3f} s to the first cycle's end")
    h.agent.manager.tracker.store.close()
    h.agent.driver.cleanup()
