import os
import shutil

import pytest

from compute_agent.drivers.base import Mdev, MdevType, NetLink, PciHealthSignals, PciKind
from compute_agent.drivers.fake_sysfs import VgpuCard
from compute_agent.drivers.libvirt.sysfs import SysfsReader, parse_aer_total
from tests.unit.drivers.sysfs_hosts import BRIDGE, GPU, KERNEL_AER_CORRECTABLE, PF, UUID


def test_numa_cells(reader):
    cells, warnings = reader.numa_cells(4)
    assert warnings == []
    assert [(c.id, sorted(c.cpus), c.memory_mb) for c in cells] == [
        (0, [0, 1, 2, 3], 4096), (1, [4, 5, 6, 7], 4096)]
    assert dict(cells[1].pages)[2048] == 100


def test_pci_devices(reader):
    devices, warnings = reader.pci_devices()
    assert warnings == []
    assert sorted(devices) == [BRIDGE, GPU, PF, "0000:81:10.0",
                               "0000:81:10.1"]
    pf, vf = devices[PF], devices["0000:81:10.1"]
    assert (pf.kind, pf.total_vfs, pf.num_vfs, pf.driver) == (
        PciKind.PF, 8, 2, "ixgbe")
    assert (vf.kind, vf.parent_address, vf.product_id, vf.driver) == (
        PciKind.VF, PF, "10ed", "ixgbevf")
    assert devices[BRIDGE].numa_node is None
    assert devices[BRIDGE].class_id == "060100"
    assert isinstance(pf.iommu_group, int)


def test_set_num_vfs_grows_and_shrinks(builder, reader):
    builder.set_num_vfs(PF, 5)
    devices, _ = reader.pci_devices()
    assert devices[PF].num_vfs == 5
    assert "0000:81:10.4" in devices
    builder.set_num_vfs(PF, 1)
    devices, _ = reader.pci_devices()
    assert devices[PF].num_vfs == 1
    assert "0000:81:10.1" not in devices


@pytest.mark.parametrize("file,content,field", [
    ("sriov_numvfs", "many", "sriov_numvfs"),
    ("numa_node", "", "numa_node"),
    ("vendor", "0x80866", "vendor"),
])
def test_bad_pci_file_skips_that_device_only(builder, reader, file, content,
                                             field):
    (builder.device_dir(PF) / file).write_text(content)
    devices, warnings = reader.pci_devices()
    assert PF not in devices and GPU in devices
    assert len(warnings) == 1 and warnings[0].startswith(f"{PF}: {field}:")


def test_missing_vendor_file_is_a_warning(builder, reader):
    (builder.device_dir(GPU) / "vendor").unlink()
    devices, warnings = reader.pci_devices([GPU, PF, "0000:99:00.0"])
    assert sorted(devices) == [PF]
    assert warnings[0].startswith(f"{GPU}: vendor: No such file")


def test_mdev_types_and_mdevs(reader):
    parents, warnings = reader.mdev_types()
    assert warnings == []
    assert parents == {GPU: (MdevType("nvidia-35", 3, "GRID M60-2Q"),
                             MdevType("nvidia-36", 2, "GRID M60-4Q"))}
    mdevs, warnings = reader.mdevs()
    assert (mdevs, warnings) == ([Mdev(UUID, "nvidia-35", GPU)], [])


def test_vanished_mdev_type_is_skipped(builder, reader, monkeypatch):
    types_dir = builder.device_dir(GPU) / "mdev_supported_types"
    real_listdir = os.listdir

    def listdir_then_vanish(path):
        names = real_listdir(path)
        if os.path.realpath(path) == os.fspath(types_dir):
            shutil.rmtree(types_dir / "nvidia-36")
        return names

    monkeypatch.setattr(os, "listdir", listdir_then_vanish)
    parents, warnings = reader.mdev_types()
    assert [t.id for t in parents[GPU]] == ["nvidia-35"]
    assert warnings[0].startswith(
        f"{GPU}: mdev_supported_types/nvidia-36/available_instances:")


def test_bad_available_instances_and_dangling_mdev(builder, reader):
    type_dir = builder.device_dir(GPU) / "mdev_supported_types" / "nvidia-36"
    (type_dir / "available_instances").write_text("-3\n")
    shutil.rmtree(builder.device_dir(GPU) / "mdev_supported_types" /
                  "nvidia-35")
    parents, warnings = reader.mdev_types()
    assert parents == {GPU: ()}
    assert "nvidia-36/available_instances: out of range" in warnings[0]
    mdevs, warnings = reader.mdevs()
    assert mdevs == []
    assert warnings[0].startswith(f"{UUID}: mdev_type: missing or dangling")


def test_nvidia_vendor_vfio_layout(builder, reader):
    vfs = builder.add_nvidia_vf_layout(
        "0000:41:00.0", "26b9", 1, VgpuCard({557: "NVIDIA L40S-1Q", 558: "NVIDIA L40S-2Q"}),
        num_vfs=2)
    builder.set_current_vgpu_type(vfs[1], 558)
    parents, warnings = reader.mdev_types()
    assert warnings == []
    assert parents[vfs[0]] == (MdevType("nvidia-557", 1, "NVIDIA L40S-1Q"),
                               MdevType("nvidia-558", 1, "NVIDIA L40S-2Q"))
    # A VF with a type lists nothing as creatable (NVIDIA's user guide):
    # its type is known by number only.
    assert parents[vfs[1]] == (MdevType("nvidia-558", 0, None),)
    (builder.device_dir(vfs[0]) / "nvidia" / "creatable_vgpu_types"
     ).write_text("ID    : vGPU Name\ngarbage line\n")
    parents, warnings = reader.mdev_types()
    assert vfs[0] not in parents and vfs[1] in parents
    assert warnings[0].startswith(f"{vfs[0]}: nvidia/creatable_vgpu_types:")


def test_nd_namespaces(builder, reader):
    builder.add_pmem_namespace(0, 0, 1 << 30, 0, "ns0")
    builder.add_pmem_namespace(1, 0, 2 << 30, None, mode="fsdax")
    records, warnings = reader.nd_namespaces()
    assert warnings == []
    assert [(r["dev"], r["name"], r["chardev"], r["numa_node"])
            for r in records] == [("namespace0.0", "ns0", "dax0.0", "0"),
                                  ("namespace1.0", "", None, "-1")]


def test_missing_tree_reads_as_empty(tmp_path):
    reader = SysfsReader(str(tmp_path / "nothing"))
    assert reader.numa_cells(4) == ([], [])
    assert reader.pci_devices() == ({}, [])
    assert reader.mdev_types() == ({}, [])
    assert reader.mdevs() == ([], [])
    assert reader.nd_namespaces() == ([], [])


def test_real_sys_pci_reads_without_exceptions():
    devices, warnings = SysfsReader("/sys").pci_devices()
    assert all(d.address == a for a, d in devices.items())
    assert isinstance(warnings, list)
    SysfsReader("/sys").numa_cells(4)


# --- health signals ------------------------------------------------------------

NIC = "0000:3b:00.0"


def test_health_of_a_well_device(builder, reader):
    builder.set_aer(PF, fatal=0, nonfatal=2, correctable=7)
    builder.set_link(PF, "ens1f0", up=True)
    signals = reader.pci_health(PF)
    assert signals == PciHealthSignals(
        PF, True, "8086", "8086", aer_fatal=0, aer_nonfatal=2, aer_correctable=7,
        sriov_numvfs=2, vfs_present=2,
        links=(NetLink("ens1f0", "up", True, True),))


def test_health_of_a_device_without_aer_sriov_or_netdev_leaves_them_unknown(reader):
    signals = reader.pci_health(GPU)
    assert (signals.aer_fatal, signals.sriov_numvfs, signals.vfs_present,
            signals.links, signals.unreadable) == (None, None, None, (), ())


def test_health_of_a_device_gone_from_sysfs(builder, reader):
    builder.remove_device(GPU)
    assert reader.pci_health(GPU) == PciHealthSignals(GPU, False)


def test_health_of_a_device_whose_config_space_no_longer_answers(builder, reader):
    builder.set_config_space_dead(PF)
    builder.set_vendor(PF, "ffff")
    signals = reader.pci_health(PF)
    assert (signals.vendor_id, signals.config_vendor_id) == ("ffff", "ffff")


def test_health_counts_only_the_vfs_that_still_exist(builder, reader):
    vf = builder.vf_address(PF, 1)
    builder.unplug_vf(vf)
    signals = reader.pci_health(PF)
    assert (signals.sriov_numvfs, signals.vfs_present) == (2, 1)
    assert not reader.pci_health(vf).present
    builder.replug_vf(vf)
    assert reader.pci_health(PF).vfs_present == 2
    assert reader.pci_health(vf).present


def test_health_of_a_link_down_and_of_one_taken_down(builder, reader):
    builder.set_link(PF, "ens1f0", up=False)
    assert reader.pci_health(PF).links == (NetLink("ens1f0", "down", False, True),)
    builder.set_link(PF, "ens1f0", up=False, admin_up=False)
    assert reader.pci_health(PF).links == (NetLink("ens1f0", "down", None, False),)


def test_the_kernels_sample_aer_file_is_read_by_its_total():
    assert parse_aer_total(KERNEL_AER_CORRECTABLE, PF, "aer_dev_correctable") == 2


def test_junk_in_an_aer_file_names_the_file_and_keeps_the_rest(builder, reader):
    path = builder.device_dir(PF) / "aer_dev_fatal"
    path.write_text("Undefined 0\n")
    builder.set_link(PF, "ens1f0", up=True)
    signals = reader.pci_health(PF)
    assert signals.aer_fatal is None
    assert signals.unreadable == ("aer_dev_fatal: no TOTAL_ERR_FATAL line",)
    assert signals.vendor_id == "8086" and signals.links
