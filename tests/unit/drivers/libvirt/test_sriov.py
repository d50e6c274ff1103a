"""Setting a PF's VF count through sysfs (compute_agent/drivers/libvirt/
sriov.py), in a fake tree that plays the kernel when asked."""
import errno

import pytest

from compute_agent.drivers.errors import SriovError
from compute_agent.drivers.libvirt import sriov
from compute_agent.drivers.libvirt.sriov import write_num_vfs
from tests.unit.drivers.sysfs_hosts import BRIDGE, PF


def test_a_vf_count_for_a_device_that_is_no_pf_is_refused_naming_it(builder, reader):
    with pytest.raises(SriovError, match="0000:00:1f.0: cannot set 2 VFs: .* is missing"):
        write_num_vfs(builder.root, BRIDGE, 2)
    assert reader.sriov_functions(BRIDGE).vfs == ()
    assert reader.sriov_functions("0000:ee:00.0") is None


def test_the_count_written_is_the_files_whole_content(builder, reader):
    # As `echo 0 > sriov_numvfs`: a shorter count leaves nothing of the
    # longer one before it.
    big = "0000:82:00.0"
    builder.add_pf(big, "8086", "10fb", "10ed", numa_node=1, total_vfs=16, num_vfs=12)
    write_num_vfs(builder.root, big, 0)
    assert (builder.device_dir(big) / "sriov_numvfs").read_text() == "0"
    builder.answer_sriov_writes()
    assert reader.sriov_functions(big).vfs == ()
    write_num_vfs(builder.root, big, 3)
    builder.answer_sriov_writes()
    assert len(reader.sriov_functions(big).vfs) == 3


def test_a_count_the_kernel_refuses_names_pf_count_file_and_answer(builder, reader,
                                                                  monkeypatch):
    def kernel_refuses(path, mode, encoding):
        # A non-zero count while VFs are enabled (Documentation/ABI/testing/
        # sysfs-bus-pci).
        raise OSError(errno.EBUSY, "Device or resource busy")
    monkeypatch.setattr(sriov, "open", kernel_refuses, raising=False)
    with pytest.raises(SriovError, match=f"{PF}: cannot set 4 VFs: writing "
                                         f".*/{PF}/sriov_numvfs: Device or resource busy"):
        write_num_vfs(builder.root, PF, 4)
    assert len(reader.sriov_functions(PF).vfs) == 2
