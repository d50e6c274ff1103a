"""compute_driver = libvirt on the libvirt TEST driver, end to end.

Each test describes one host twice, through SysfsBuilder: as a fake sysfs
tree under tmp_path and as the test driver's host XML. The agent discovers
it through the real LibvirtDriver and syncs it into the real Placement of
the session; the assertions read Placement back with plain HTTP.

The test driver keeps its device list for the life of a connection (it
reads the host file when a connection opens). Where a test changes the
host's devices, it rewrites the host file and closes the driver's
connection, which is what a libvirtd restart looks like to the driver; the
next cycle then reconnects and reads the new host.
"""
from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from tests.functional.helpers import allocate, provider_uuid, totals, unallocate, wait_for
from tests.functional.libvirt_host import GPU, NO_NUMA, PF, Host


@pytest.fixture
def host(tmp_path, placement):
    h = Host(tmp_path, placement.url)
    h.build_default()
    h.make_agent()
    yield h
    h.agent.driver.cleanup()


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING]


def test_the_host_appears_in_placement_as_the_nested_tree(host):
    host.cycle()
    tree = host.tree()
    h, p = host.name, host.p
    # Parents: cells from the fake sysfs; each device under its own cell,
    # the one without NUMA affinity under the root; the chipset device and
    # the PF itself (only its VFs are allowlisted) get nothing of their own.
    assert {name: node["parent"] for name, node in tree.items()} == {
        h: None,
        p("numa_0"): h,
        p("numa_1"): h,
        p("0000:81:00.0"): p("numa_1"),
        p("pci_0000_06_00_0"): p("numa_0"),
        p("0000:3B:00.0"): p("numa_0"),
        p("0000:00:05.0"): h,
        p("pmem_64G_numa_0"): p("numa_0"),
        p("pmem_64G_numa_1"): p("numa_1"),
        p("pmem_16G_numa_1"): p("numa_1"),
    }
    assert set(totals(tree[h])) == {"DISK_GB"} and totals(tree[h])["DISK_GB"] > 0
    for cell in (p("numa_0"), p("numa_1")):
        assert totals(tree[cell]) == {"VCPU": 4, "MEMORY_MB": 8192}
        assert tree[cell]["traits"] == {"HW_NUMA_ROOT"}
    assert tree[p("numa_0")]["inventories"]["MEMORY_MB"]["reserved"] == 512
    assert tree[p("numa_1")]["inventories"]["MEMORY_MB"]["reserved"] == 0

    # SR-IOV: the two enabled VFs count on their PF's provider.
    assert totals(tree[p("0000:81:00.0")]) == {"SRIOV_NET_VF": 2}
    assert tree[p("0000:81:00.0")]["traits"] == {"COMPUTE_MANAGED_PCI_DEVICE"}

    # vGPU: only the enabled type; one existing mdev + 3 still creatable.
    gpu = tree[p("pci_0000_06_00_0")]
    assert totals(gpu) == {"VGPU": 4}
    assert gpu["traits"] == {"CUSTOM_MDEV_TYPE_NVIDIA_35"}

    # Whole devices: nova's class name, the spec's traits.
    assert totals(tree[p("0000:3B:00.0")]) == {"CUSTOM_PCI_15B3_101B": 1}
    assert tree[p("0000:3B:00.0")]["traits"] == {
        "COMPUTE_MANAGED_PCI_DEVICE", "CUSTOM_FAST_NIC"}
    assert totals(tree[p("0000:00:05.0")]) == {"CUSTOM_PCI_1AF4_1041": 1}

    # pmem: grouped by label and cell.
    assert totals(tree[p("pmem_64G_numa_0")]) == {"CUSTOM_PMEM_NAMESPACE_64G": 1}
    assert totals(tree[p("pmem_64G_numa_1")]) == {"CUSTOM_PMEM_NAMESPACE_64G": 2}
    assert totals(tree[p("pmem_16G_numa_1")]) == {"CUSTOM_PMEM_NAMESPACE_16G": 1}


def test_enabling_the_other_mdev_type_reports_it_instead(tmp_path, placement):
    h = Host(tmp_path, placement.url)
    h.build_default()
    h.make_agent(devices={"enabled_mdev_types": "nvidia-36"},
                 **{"mdev_nvidia-36": {"mdev_class": "CUSTOM_VGPU_4Q",
                                       "device_addresses": GPU}})
    try:
        h.cycle()
        tree = h.tree()
        gpu = tree[h.p("pci_0000_06_00_0")]
        assert totals(gpu) == {"CUSTOM_VGPU_4Q": 2}
        assert gpu["traits"] == {"CUSTOM_MDEV_TYPE_NVIDIA_36"}
        # Nothing allowlisted: no PCI provider at all.
        assert not any("COMPUTE_MANAGED_PCI_DEVICE" in n["traits"]
                       for n in tree.values())
    finally:
        h.agent.driver.cleanup()


def test_raising_sriov_numvfs_grows_the_tree_next_cycle(host):
    host.cycle()
    pf = host.p("0000:81:00.0")
    assert totals(host.tree()[pf]) == {"SRIOV_NET_VF": 2}

    host.sys.set_num_vfs(PF, 6)
    host.libvirt_sees_the_new_host()
    host.cycle()
    assert totals(host.tree()[pf]) == {"SRIOV_NET_VF": 6}

    host.sys.set_num_vfs(PF, 1)
    host.libvirt_sees_the_new_host()
    host.cycle()
    assert totals(host.tree()[pf]) == {"SRIOV_NET_VF": 1}


def test_a_removed_gpu_loses_its_provider(host):
    host.cycle()
    gpu = host.p("pci_0000_06_00_0")
    assert gpu in host.tree()

    host.sys.remove_device(GPU)
    host.libvirt_sees_the_new_host()
    host.cycle()
    tree = host.tree()
    assert gpu not in tree
    assert host.p("0000:81:00.0") in tree  # the rest stays


def test_a_removed_gpu_with_allocations_stays_fully_reserved(
        host, placement, caplog):
    host.cycle()
    gpu = host.p("pci_0000_06_00_0")
    consumer = allocate(placement.url, provider_uuid(placement.url, gpu), {"VGPU": 1})

    host.sys.remove_device(GPU)
    host.libvirt_sees_the_new_host()
    with caplog.at_level(logging.WARNING):
        host.cycle()
    kept = host.tree()[gpu]["inventories"]["VGPU"]
    assert kept["reserved"] == kept["total"] == 4
    assert [w for w in warnings_of(caplog) if gpu in w and "reserved" in w]

    unallocate(placement.url, consumer)
    host.agent.sync.kept_retry_seconds = 0  # rather than wait five minutes
    host.cycle()
    assert gpu not in host.tree()


def test_malformed_sysfs_values_are_skipped_with_a_warning(host, caplog):
    # A PF's VF count that is not a number, and a devdax namespace whose
    # dax device's size (its usable size) is not a number: each one warning
    # naming the device and the file.
    (host.sys.device_dir(PF) / "sriov_numvfs").write_text("lots\n")
    dax = host.sys.root / "bus" / "dax" / "devices" / "dax1.1"
    (dax / "size").write_text("big\n")

    with caplog.at_level(logging.WARNING):
        host.cycle()

    warnings = warnings_of(caplog)
    assert [w for w in warnings
            if w.startswith(f"{PF}: sriov_numvfs: not an integer")], warnings
    assert [w for w in warnings
            if w.startswith("namespace1.1: dax1.1/dax1.1/size: not an integer")
            ], warnings
    tree = host.tree()
    # The PF keeps libvirt's view of its VFs; the bad namespace alone is
    # left out; every other device is there as before.
    assert totals(tree[host.p("0000:81:00.0")]) == {"SRIOV_NET_VF": 2}
    assert totals(tree[host.p("pmem_64G_numa_1")]) == {
        "CUSTOM_PMEM_NAMESPACE_64G": 1}
    assert totals(tree[host.p("pmem_64G_numa_0")]) == {
        "CUSTOM_PMEM_NAMESPACE_64G": 1}
    assert totals(tree[host.p("pci_0000_06_00_0")]) == {"VGPU": 4}
    assert host.p("0000:3B:00.0") in tree and host.p("0000:00:05.0") in tree


def test_a_pf_whose_vpd_libvirt_writes_unescaped_is_still_found(
        tmp_path, placement, caplog):
    # The test driver, like libvirt 9.0's udev backend, writes VPD text
    # fields back unescaped: the PF's document is malformed in its VPD.
    h = Host(tmp_path, placement.url)
    h.build_default()
    h.sys.set_vpd_serial(PF, "SN0042X99999><")
    h.make_agent()
    try:
        with caplog.at_level(logging.WARNING):
            h.cycle()
            h.cycle()
        vpd = [w for w in warnings_of(caplog) if ": vpd: " in w]
        assert len(vpd) == 1 and vpd[0].startswith(
            "pci_0000_81_00_0: vpd: malformed XML"), vpd
        assert totals(h.tree()[h.p("0000:81:00.0")]) == {"SRIOV_NET_VF": 2}
    finally:
        h.agent.driver.cleanup()


def test_a_non_numeric_numa_node_puts_only_that_device_aside(host, caplog):
    # numa_node junk in sysfs for a device libvirt reports without NUMA:
    # the warning names it; it stays under the root with libvirt's view.
    (host.sys.device_dir(NO_NUMA) / "numa_node").write_text("zero\n")
    with caplog.at_level(logging.WARNING):
        host.cycle()
    assert [w for w in warnings_of(caplog)
            if w.startswith(f"{NO_NUMA}: numa_node: not an integer")]
    tree = host.tree()
    assert tree[host.p("0000:00:05.0")]["parent"] == host.name
    assert totals(tree[host.p("0000:81:00.0")]) == {"SRIOV_NET_VF": 2}


def test_agent_thread_runs_on_the_libvirt_driver(host):
    """start()/stop() own the driver. start() itself runs the first cycle,
    so only a change made after it, reaching Placement with no cycle run by
    hand, shows that the loop's thread runs cycles."""
    host.agent.settings = replace(host.agent.settings, update_interval=0.2)
    host.agent.start()
    try:
        pf = host.p("0000:81:00.0")
        assert totals(host.tree()[pf]) == {"SRIOV_NET_VF": 2}
        host.sys.set_num_vfs(PF, 4)
        host.libvirt_sees_the_new_host()
        wait_for(lambda: totals(host.tree()[pf]) == {"SRIOV_NET_VF": 4})
    finally:
        host.agent.stop()


def test_a_sysfs_value_that_turns_bad_later_warns_and_the_cycle_completes(
        host, caplog):
    host.cycle()
    host.sys.set_num_vfs(PF, 4)
    host.libvirt_sees_the_new_host()
    host.cycle()
    pf = host.p("0000:81:00.0")
    assert totals(host.tree()[pf]) == {"SRIOV_NET_VF": 4}

    # Now, with everything read and cached, one file goes bad.
    (host.sys.device_dir(PF) / "sriov_numvfs").write_text("-\n")
    with caplog.at_level(logging.WARNING):
        host.cycle()
    assert [w for w in warnings_of(caplog)
            if w.startswith(f"{PF}: sriov_numvfs: not an integer")]
    tree = host.tree()
    assert totals(tree[pf]) == {"SRIOV_NET_VF": 4}
    assert totals(tree[host.p("pci_0000_06_00_0")]) == {"VGPU": 4}
