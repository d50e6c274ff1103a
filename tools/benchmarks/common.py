"""What several benchmark cases share."""
from __future__ import annotations


def device_host(pfs: int, vfs_per_pf: int, gpus: int = 0, vgpus_per_gpu: int = 0) -> dict:
    """A fake-driver host with plenty of claimable devices: two large NUMA
    cells, PFs whose VFs (product 154c) are meant to be allowlisted, and
    GPUs offering the mdev type nvidia-35."""
    return {
        "disk_gb": 2000,
        "numa_cells": [{"id": 0, "cpus": "0-63", "memory_mb": 1 << 20},
                       {"id": 1, "cpus": "64-127", "memory_mb": 1 << 20}],
        "pci_devices": [{"address": f"0000:{0x20 + i:02x}:00.0", "vendor_id": "8086",
                         "product_id": "1572", "numa_node": i % 2,
                         "vfs": {"count": vfs_per_pf, "product_id": "154c"}}
                        for i in range(pfs)],
        "gpus": [{"address": f"0000:{0x80 + i:02x}:00.0", "numa_node": i % 2,
                  "mdev_types": {"nvidia-35": {"available_instances": vgpus_per_gpu}}}
                 for i in range(gpus)],
    }


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, int(-(-q * len(ordered) // 100)) - 1)]
