"""The fake sysfs tree (compute_agent/drivers/fake_sysfs.py): what the
readers see of the host it builds, and of what it does in the kernel's
place, as the kernel's ABI documents it."""
import os
from dataclasses import replace

import libvirt
import pytest
from lxml import etree

from compute_agent.drivers.base import Mdev, MdevType
from compute_agent.drivers.fake_sysfs import (
    SysfsBuilder,
    VgpuCard,
    vf_address,
    vgpu_framebuffer_gb,
    vhba_xml,
)
from compute_agent.drivers.libvirt import pmem
from compute_agent.drivers.libvirt.nodedev import parse_node_devices
from compute_agent.drivers.libvirt.sriov import write_num_vfs
from compute_agent.drivers.libvirt.sysfs import SysfsReader
from tests.unit.drivers.sysfs_hosts import BRIDGE, GPU, KERNEL_AER_CORRECTABLE, L40, PF, UUID

# --- PCI devices and SR-IOV (Documentation/ABI/testing/sysfs-bus-pci) -----------

def test_vf_addresses_carry_into_the_next_slot(builder):
    assert builder.vf_address(PF, 9) == "0000:81:11.1"


def test_vf_addresses_carry_into_the_next_bus_and_not_past_bus_ff():
    # Routing id 0x80 + 128 = 0x100: bus 0x81 + 1, slot 0, function 0.
    assert vf_address(PF, 128) == "0000:82:00.0"
    with pytest.raises(ValueError, match="VF 128 of 0000:ff:00.0 is past bus ff"):
        vf_address("0000:ff:00.0", 128)


def test_more_vfs_than_the_pf_has_are_refused_and_nothing_changes(builder, reader):
    with pytest.raises(ValueError, match=f"{PF}: 9 VFs of 8"):
        builder.set_num_vfs(PF, 9)
    assert len(reader.sriov_functions(PF).vfs) == 2


def test_every_function_is_in_an_iommu_group_of_its_own(reader):
    groups = [d.iommu_group for d in reader.pci_devices()[0].values()]
    assert None not in groups
    assert len(set(groups)) == len(groups) == 5


def test_vfs_enabled_again_after_a_reboot_are_in_new_iommu_groups(builder, reader):
    vfs = [vf_address(PF, 0), vf_address(PF, 1)]
    before = {a: d.iommu_group for a, d in reader.pci_devices()[0].items()}
    builder.reboot()
    builder.set_num_vfs(PF, 2)
    after = {a: d.iommu_group for a, d in reader.pci_devices()[0].items()}
    assert {a: g for a, g in after.items() if a not in vfs} == {
        a: g for a, g in before.items() if a not in vfs}
    assert not {after[vf] for vf in vfs} & set(before.values())


def test_a_reboot_leaves_every_pf_without_vfs_and_every_mdev_gone(builder, reader):
    vf = builder.vf_address(PF, 0)
    builder.reboot()
    pf_dir = builder.device_dir(PF)
    assert (pf_dir / "sriov_numvfs").read_text().strip() == "0"
    assert not any(e.startswith("virtfn") for e in os.listdir(pf_dir))
    assert not builder.device_dir(vf).exists()
    assert reader.sriov_functions(PF).vfs == () and reader.mdevs() == ([], [])


def test_a_write_of_sriov_numvfs_answered_enables_that_many_vfs_by_index(builder, reader):
    big = "0000:82:00.0"  # past virtfn9: the links sort by number
    builder.add_pf(big, "8086", "10fb", "10ed", numa_node=1, total_vfs=12)
    builder.reboot()
    write_num_vfs(builder.root, big, 12)
    builder.answer_sriov_writes()
    found = reader.sriov_functions(big)
    assert found.pf.num_vfs == 12
    assert [v.address for v in found.vfs] == [builder.vf_address(big, i) for i in range(12)]
    assert {(v.vendor_id, v.product_id, v.parent_address) for v in found.vfs} == {
        ("8086", "10ed", big)}


def test_a_new_count_while_vfs_exist_is_what_the_kernel_refuses(builder):
    write_num_vfs(builder.root, PF, 4)
    with pytest.raises(ValueError, match="EBUSY"):
        builder.answer_sriov_writes()


def test_a_device_unplugged_takes_its_vfs_and_its_mdevs_with_it(builder, reader):
    builder.remove_device(PF)
    builder.remove_device(GPU)
    devices, warnings = reader.pci_devices()
    assert (sorted(devices), warnings) == ([BRIDGE], [])
    assert not reader.pci_health(vf_address(PF, 1)).present
    assert reader.mdev_types() == ({}, [])
    assert reader.mdevs() == ([], [])


def test_a_device_whose_config_space_answers_again_reads_its_header(builder, reader):
    builder.set_config_space_dead(PF)
    assert reader.pci_health(PF).config_vendor_id == "ffff"
    builder.set_config_space_dead(PF, dead=False)
    assert reader.pci_health(PF).config_vendor_id == "8086"


def test_aer_statistics_are_written_as_the_kernels_example(builder, reader):
    builder.set_aer(PF, fatal=1, correctable=2)
    assert (builder.device_dir(PF) / "aer_dev_correctable").read_text() == KERNEL_AER_CORRECTABLE
    signals = reader.pci_health(PF)
    assert (signals.aer_fatal, signals.aer_nonfatal, signals.aer_correctable) == (1, 0, 2)


# --- mdevs (Documentation/driver-api/vfio-mediated-device.rst) -------------------

def test_mdevs_made_and_removed_by_writes_as_echo_makes_them(builder, reader):
    new = "9d6b8a1c-3f2e-4c5d-8e7f-0a1b2c3d4e5f"
    types = builder.device_dir(GPU) / "mdev_supported_types"
    (types / "nvidia-36" / "create").write_text(f"{new}\n")  # echo $UUID > create
    (builder.root / "bus" / "mdev" / "devices" / UUID / "remove").write_text("1\n")
    builder.answer_mdev_writes()
    assert reader.mdevs() == ([Mdev(new, "nvidia-36", GPU)], [])
    assert reader.mdev_types()[0][GPU] == (MdevType("nvidia-35", 4, "GRID M60-2Q"),
                                           MdevType("nvidia-36", 1, "GRID M60-4Q"))


def test_a_gpu_whose_driver_binds_then_unbinds_becomes_then_stops_being_a_parent(
        builder, reader):
    late = "0000:07:00.0"
    builder.add_pci_device(late, "10de", "13f2", "030000", numa_node=0)
    assert late not in reader.mdev_types()[0]
    builder.bind_mdev_driver(late, {"nvidia-35": ("GRID M60-2Q", 4)})
    assert reader.mdev_types()[0][late] == (MdevType("nvidia-35", 4, "GRID M60-2Q"),)
    assert reader.pci_devices([late])[0][late].driver == "nvidia"
    builder.unbind_mdev_driver(late)
    assert late not in reader.mdev_types()[0]
    assert reader.pci_devices([late])[0][late].driver is None


def test_a_gpu_holding_mdevs_cannot_be_unbound(builder, reader):
    with pytest.raises(ValueError, match=UUID):
        builder.unbind_mdev_driver(GPU)
    assert GPU in reader.mdev_types()[0]


# --- NVIDIA's vendor-specific VFIO layout (its vGPU user guide) ------------------

def test_a_vgpu_types_framebuffer_is_the_number_in_its_name():
    assert vgpu_framebuffer_gb("NVIDIA L40-12Q") == 12
    with pytest.raises(ValueError, match="'NVIDIA L40': no framebuffer size in it"):
        vgpu_framebuffer_gb("NVIDIA L40")


def test_a_vgpu_type_the_driver_refuses_is_undone_when_it_answers(tmp_path):
    b = SysfsBuilder(tmp_path / "sys")
    vfs = b.add_nvidia_vf_layout("0000:41:00.0", "26b5", 0, VgpuCard(L40, equal_size=True))
    b.set_current_vgpu_type(vfs[0], 557)
    # Another size than the card's vGPUs: not creatable now.
    (b.device_dir(vfs[1]) / "nvidia" / "current_vgpu_type").write_text("558\n")
    b.answer_vgpu_type_writes()
    reader = SysfsReader(str(b.root))
    assert [reader.current_vgpu_type(vf) for vf in vfs] == [557, 0, 0, 0]


def test_a_type_removed_makes_room_for_one_written_beside_it(tmp_path):
    b = SysfsBuilder(tmp_path / "sys")
    vfs = b.add_nvidia_vf_layout("0000:41:00.0", "26b5", 0, VgpuCard(L40, equal_size=True),
                                 num_vfs=2)
    b.set_current_vgpu_type(vfs[1], 557)
    # Written in one go: the 24 GB type fits only once the 12 GB one is gone.
    (b.device_dir(vfs[0]) / "nvidia" / "current_vgpu_type").write_text("558\n")
    (b.device_dir(vfs[1]) / "nvidia" / "current_vgpu_type").write_text("0\n")
    b.answer_vgpu_type_writes()
    reader = SysfsReader(str(b.root))
    assert [reader.current_vgpu_type(vf) for vf in vfs] == [558, 0]


# --- persistent memory (Documentation/driver-api/nvdimm/nvdimm.rst) -------------

def test_namespaces_read_back_in_each_mode_their_holders_numbered_as_claimed(tmp_path):
    b = SysfsBuilder(tmp_path / "sys")
    gib = 1 << 30
    b.add_pmem_namespace(0, 0, 4 * gib, 0, "fs", mode="fsdax")
    b.add_pmem_namespace(0, 1, 2 * gib, 0, "d1")
    b.add_pmem_namespace(0, 2, 2 * gib, 1, "d2")
    b.add_pmem_namespace(0, 3, gib, None, "sect", mode="sector")
    b.add_pmem_namespace(0, 4, gib, 0, "plain", mode="raw")
    b.add_pmem_namespace(0, 5, 0, 0)  # the region's idle seed
    found, warnings = pmem.read_namespaces(SysfsReader(str(b.root)), None)
    assert warnings == []
    assert [(n.name, n.mode.value, n.dev, n.size_bytes, n.numa_node) for n in found] == [
        ("fs", "fsdax", None, 4 * gib, 0), ("d1", "devdax", "dax0.1", 2 * gib, 0),
        ("d2", "devdax", "dax0.2", 2 * gib, 1), ("sect", "sector", None, gib, None),
        ("plain", "raw", None, gib, 0)]
    region = b.root / "devices" / "ndbus0" / "region0"
    assert [(region / f"namespace0.{i}" / "holder").read_text().strip()
            for i in range(6)] == ["pfn0.0", "dax0.0", "dax0.1", "btt0.0", "", ""]


# --- the libvirt test driver's view of the same host ------------------------------

@pytest.fixture
def libvirt_view(builder, tmp_path):
    """Opens the test driver on the host file of the host built so far."""
    opened = []

    def view() -> libvirt.virConnect:
        opened.append(libvirt.open(builder.write_test_driver_host_xml(tmp_path / "host.xml")))
        return opened[-1]
    yield view
    for conn in opened:
        conn.close()


def test_libvirt_sees_the_pci_devices_and_mdevs_the_sysfs_reader_sees(builder, reader,
                                                                     libvirt_view):
    builder.set_num_vfs(PF, 4)
    builder.add_mdev("9d6b8a1c-3f2e-4c5d-8e7f-0a1b2c3d4e5f", GPU, "nvidia-36")
    conn = libvirt_view()
    devices, warnings = parse_node_devices((d.name(), d.XMLDesc())
                                           for d in conn.listAllDevices())
    assert warnings == []
    # libvirt's test driver keeps no device's driver: the agent reads it
    # from sysfs.
    assert {d.pci.address: replace(d.pci, driver=None) for d in devices if d.pci} == {
        a: replace(d, driver=None) for a, d in reader.pci_devices()[0].items()}
    assert {d.mdev_parent.address: d.mdev_parent.types
            for d in devices if d.mdev_parent} == reader.mdev_types()[0]
    assert {d.mdev for d in devices if d.mdev} == set(reader.mdevs()[0])
    _, memory_mb, cpus, *_ = conn.getInfo()
    assert (memory_mb, cpus) == (8192, 8)  # the NUMA nodes'


def test_a_vhba_asked_of_the_npiv_hba_is_made_on_it(builder, libvirt_view):
    hba = builder.add_npiv_hba(5)
    conn = libvirt_view()
    made = etree.fromstring(conn.nodeDeviceCreateXML(vhba_xml(hba, 3), 0).XMLDesc())
    assert made.findtext("parent") == hba
    assert (made.findtext(".//wwnn"), made.findtext(".//wwpn")) == (
        "2003000000000003", "2004000000000003")


def test_one_npiv_hba_per_host_file(builder):
    assert builder.add_npiv_hba(5) == "scsi_host5"
    with pytest.raises(ValueError, match="one NPIV HBA"):
        builder.add_npiv_hba(6)
    assert builder.test_driver_host_xml().count("<capability type='vport_ops'>") == 1


def test_a_vpd_serial_is_escaped_in_the_host_file(builder):
    builder.set_vpd_serial(PF, "SN42<&>")
    host = etree.fromstring(builder.test_driver_host_xml())
    assert host.findtext(".//capability[@type='vpd']/fields/serial_number") == "SN42<&>"
