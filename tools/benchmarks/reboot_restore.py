"""Benchmark: SR-IOV VFs back after a host reboot, through the libvirt driver.

A host of one PF with 64 VFs, all allowlisted, on the libvirt test driver
over a sysfs tree of our own (tests/functional/libvirt_host.py), synced into
a local Placement. Each run reboots the host (SysfsBuilder.reboot: no VFs, a
new boot ID) and starts a new agent, whose restore sets the PF's VF count
again and verifies the 64 VFs by address and ids. The test plays the kernel
within each write of ``sriov_numvfs`` (Host.play_the_kernel: the VFs made in
the tree, libvirt's host file rewritten), which a real kernel does in the
write itself.

    from tools.benchmarks import reboot_restore
    figures = reboot_restore.run(pathlib.Path("/tmp/bench"))

Figures (seconds, medians of RUNS): ``restore_s``, the restore and
verification, of which ``kernel_played_s`` is the test playing the kernel
and ``agent_share_s`` the agent's own (the PF's files read, the write, the
64 VFs read and verified); ``first_cycle_s``, from the restore's start to
the end of the first cycle, the 64 VFs' units back in Placement.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from compute_agent.daemon import start_up
from compute_agent.testing.local_placement import LocalPlacement
from tests.functional.libvirt_host import PF, Host

RUNS = 5
VFS = 64
POLICY = {"pci": {"device_spec": [json.dumps({"vendor_id": "8086", "product_id": "10ed",
                                              "resource_class": "SRIOV_NET_VF"})]}}


def stop(host: Host) -> None:
    host.agent.manager.tracker.store.close()
    host.agent.driver.cleanup()


def run(workdir: Path) -> dict:
    placement = LocalPlacement(workdir / "placement").start()
    try:
        host = Host(workdir / "host", placement.url)
        host.sys.add_numa_node(0, "0-3", 8192)
        host.sys.add_pf(PF, "8086", "10fb", "10ed", numa_node=0, total_vfs=VFS,
                        num_vfs=VFS, driver="ixgbe", vf_driver="vfio-pci")
        host.make_agent(**POLICY)
        host.cycle()  # records the PF with its VFs
        restores, cycles, kernels = [], [], []
        for _ in range(RUNS):
            stop(host)
            host.reboot()
            host.make_agent(**POLICY)
            host.play_the_kernel()
            kernel = host.agent.driver.set_num_vfs
            played: list[float] = []

            def set_num_vfs(pf_address: str, count: int, kernel=kernel, played=played) -> None:
                began = time.perf_counter()
                kernel(pf_address, count)
                played.append(time.perf_counter() - began)

            host.agent.driver.set_num_vfs = set_num_vfs
            began = time.perf_counter()
            start_up.restore_after_reboot(host.agent.vf_restore, host.agent.driver)
            restores.append(time.perf_counter() - began)
            kernels.append(sum(played))
            host.cycle()
            cycles.append(time.perf_counter() - began)
            total = host.tree()[host.p(PF.upper())]["inventories"]["SRIOV_NET_VF"]
            if (total["total"], total["reserved"]) != (VFS, 0):
                raise AssertionError(f"after the restore: {total}")
        stop(host)
        return {"case": "reboot_restore", "vfs": VFS, "runs": RUNS,
                "restore_s": round(statistics.median(restores), 3),
                "kernel_played_s": round(statistics.median(kernels), 3),
                "agent_share_s": round(statistics.median(
                    r - k for r, k in zip(restores, kernels)), 3),
                "first_cycle_s": round(statistics.median(cycles), 3)}
    finally:
        placement.stop()
