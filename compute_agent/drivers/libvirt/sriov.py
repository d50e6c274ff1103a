"""Setting a PF's VF count through sysfs (Documentation/ABI/testing/
sysfs-bus-pci, ``sriov_numvfs``): the kernel enables that many VFs within
the write, and refuses a non-zero count while VFs are enabled (EBUSY), and
a count above ``sriov_totalvfs`` (ERANGE). Under a fake tree
(SysfsBuilder) nothing reacts to the write: the written file is what a test
observes, until it plays the kernel (``answer_sriov_writes``)."""
from __future__ import annotations

import os

from compute_agent.drivers.errors import SriovError


def write_num_vfs(sysfs_root: str | os.PathLike, pf_address: str, count: int) -> None:
    """Raises SriovError naming the PF, the count, the file and the
    kernel's answer."""
    path = os.path.join(os.fspath(sysfs_root), "bus", "pci", "devices", pf_address,
                        "sriov_numvfs")
    if not os.path.exists(path):
        raise SriovError(f"{pf_address}: cannot set {count} VFs: {path} is missing "
                         "(not an SR-IOV PF)")
    try:
        # As `echo N > sriov_numvfs`: sysfs ignores the truncation, a fake
        # tree's file then holds the count alone.
        with open(path, "w", encoding="ascii") as f:
            f.write(str(count))
    except OSError as exc:
        raise SriovError(f"{pf_address}: cannot set {count} VFs: writing {path}: "
                         f"{exc.strerror or exc}") from None
