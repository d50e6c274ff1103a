"""The fake sysfs tree (compute_agent/drivers/fake_sysfs.py): what the
readers see of the host it builds, and of what it does in the kernel's
place, as the kernel's ABI documents it."""
import os

import pytest

from compute_agent.drivers.base import MdevType
from compute_agent.drivers.libvirt.sriov import write_num_vfs
from tests.unit.drivers.sysfs_hosts import GPU, PF, UUID


def test_vf_addresses_carry_into_the_next_slot(builder):
    assert builder.vf_address(PF, 9) == "0000:81:11.1"


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


def test_one_npiv_hba_per_host_file(builder):
    assert builder.add_npiv_hba(5) == "scsi_host5"
    with pytest.raises(ValueError, match="one NPIV HBA"):
        builder.add_npiv_hba(6)
    assert builder.test_driver_host_xml().count("<capability type='vport_ops'>") == 1


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
