"""Setting a PF's VF count through sysfs (compute_agent/drivers/libvirt/
sriov.py), in a fake tree that plays the kernel when asked."""
import pytest

from compute_agent.drivers.errors import SriovError
from compute_agent.drivers.libvirt.sriov import write_num_vfs
from tests.unit.drivers.sysfs_hosts import BRIDGE


def test_a_vf_count_for_a_device_that_is_no_pf_is_refused_naming_it(builder, reader):
    with pytest.raises(SriovError, match="0000:00:1f.0: cannot set 2 VFs: .* is missing"):
        write_num_vfs(builder.root, BRIDGE, 2)
    assert reader.sriov_functions(BRIDGE).vfs == ()
    assert reader.sriov_functions("0000:ee:00.0") is None
