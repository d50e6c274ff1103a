"""One small host in a fake sysfs tree (SysfsBuilder), for the unit tests
of the sysfs reader, of the fake itself and of the sysfs writers: two NUMA
nodes, an SR-IOV PF with two of its eight VFs enabled, a GPU offering two
mdev types with one mdev made, and a device that is neither."""
from __future__ import annotations

from pathlib import Path

from compute_agent.drivers.fake_sysfs import SysfsBuilder

GPU = "0000:06:00.0"
PF = "0000:81:00.0"
UUID = "4b20d080-1b54-4048-85b3-a6a62d165c01"
# An ISA bridge: no NUMA affinity, no SR-IOV, no mdev types.
BRIDGE = "0000:00:1f.0"
# The example of aer_dev_correctable in Documentation/ABI/testing/
# sysfs-bus-pci-devices-aer_stats: each error's count, then the total.
KERNEL_AER_CORRECTABLE = (
    "Receiver Error 2\nBad TLP 0\nBad DLLP 0\nRELAY_NUM Rollover 0\n"
    "Replay Timer Timeout 0\nAdvisory Non-Fatal 0\n"
    "Corrected Internal Error 0\nHeader Log Overflow 0\nTOTAL_ERR_COR 2\n")


def small_host(root: Path) -> SysfsBuilder:
    b = SysfsBuilder(root)
    b.add_numa_node(0, "0-3", 4096)
    b.add_numa_node(1, "4-7", 4096, {2048: 100})
    b.add_pf(PF, "8086", "10fb", "10ed", numa_node=1, total_vfs=8,
             num_vfs=2, driver="ixgbe", vf_driver="ixgbevf")
    b.add_mdev_parent(GPU, 0, {"nvidia-35": ("GRID M60-2Q", 4),
                               "nvidia-36": ("GRID M60-4Q", 2)})
    b.add_mdev(UUID, GPU, "nvidia-35")
    b.add_pci_device(BRIDGE, "8086", "a1c1", "060100")
    return b


# vGPU types of an NVIDIA L40 in its vendor-specific VFIO layout, by the
# numbers and names its VFs' creatable_vgpu_types lists (NVIDIA's vGPU
# user guide): 12, 24 and 48 GB of its 48 GB framebuffer.
L40 = {557: "NVIDIA L40-12Q", 558: "NVIDIA L40-24Q", 560: "NVIDIA L40-48Q"}
