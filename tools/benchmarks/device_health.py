"""Benchmark: device health detection latency, from a change in a device's
sysfs files to Placement showing its units reserved (and back).

A running agent (update loop and health watch threads, the default
``[devices] health_poll_interval`` of 1 s, an update interval of an hour so
only the watch starts cycles) on the libvirt test driver over a fake sysfs
tree, synced into a local Placement. Each fault is made and mended RUNS
times, each change at a random point of the poll interval; the latency is
read by polling Placement over HTTP every 10 ms.

    from tools.benchmarks import device_health
    figures = device_health.run(pathlib.Path("/tmp/bench"))

Figures (seconds): per fault, ``<fault>_out_median_s`` / ``_max_s`` (change
-> reserved) and ``<fault>_back_median_s`` (mend -> unreserved); over all,
``out_median_s``; and ``poll_s`` with ``poll_devices``: one read of every
device's health signals on a host of 16 PFs with 64 VFs each, the cost the
watch pays each interval.
"""
from __future__ import annotations

import json
import random
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import requests

from compute_agent.cmd.common import load_config
from compute_agent.daemon.composition import compose
from compute_agent.drivers.fake_sysfs import SysfsBuilder
from compute_agent.drivers.libvirt.sysfs import SysfsReader
from compute_agent.testing.local_placement import LocalPlacement

RUNS = 5
PF = "0000:81:00.0"
NIC = "0000:3b:00.0"
GPU = "0000:06:00.0"
IFNAME = "ens3f0"
HEADERS = {"X-Auth-Token": "admin", "X-Roles": "admin,service",
           "OpenStack-API-Version": "placement 1.39"}
LARGE_PFS, LARGE_VFS = 16, 64


def build_host(workdir: Path) -> tuple[SysfsBuilder, str]:
    b = SysfsBuilder(workdir / "sys")
    b.add_numa_node(0, "0-3", 8192)
    b.add_pf(PF, "8086", "10fb", "10ed", numa_node=0, total_vfs=8, num_vfs=4,
             driver="ixgbe", vf_driver="ixgbevf")
    b.set_aer(PF)
    b.add_pci_device(NIC, "15b3", "101b", "020000", numa_node=0, driver="mlx5_core")
    b.set_link(NIC, IFNAME, up=True)
    b.add_mdev_parent(GPU, 0, {"nvidia-35": ("GRID M60-2Q", 4)})
    return b, b.write_test_driver_host_xml(workdir / "host.xml")


def write_conf(workdir: Path, url: str, name: str, sysfs: Path, uri: str) -> Path:
    specs = [json.dumps({"vendor_id": "8086", "product_id": "10ed"}),
             json.dumps({"vendor_id": "15b3", "product_id": "101b"})]
    lines = ["[DEFAULT]", f"host = {name}", f"state_path = {workdir / 'state'}",
             "compute_driver = libvirt", f"sysfs_root = {sysfs}",
             "update_interval = 3600", "update_jitter = 0",
             "[placement]", "auth_type = placement_noauth2", f"endpoint = {url}",
             "[libvirt]", f"connection_uri = {uri}",
             f"instances_path = {workdir / 'instances'}",
             "[devices]", "enabled_mdev_types = nvidia-35",
             "[pci]"] + [f"device_spec = {s}" for s in specs]
    path = workdir / "agent.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


class Watcher:
    """Placement's reserved of one provider's inventory, over HTTP."""

    def __init__(self, url: str, root_uuid: str):
        self.url = url
        rows = requests.get(f"{url}/resource_providers?in_tree={root_uuid}",
                            headers=HEADERS, timeout=10).json()["resource_providers"]
        self.uuids = {r["name"]: r["uuid"] for r in rows}

    def reserved(self, provider: str, rc: str) -> int:
        invs = requests.get(f"{self.url}/resource_providers/{self.uuids[provider]}"
                            "/inventories", headers=HEADERS, timeout=10).json()
        return invs["inventories"][rc]["reserved"]

    def seconds_until(self, provider: str, rc: str, reserved: int,
                      change: Callable[[], None], phase: float,
                      timeout: float = 30) -> float:
        """``phase``: up to this long is waited first, at random, so the
        change does not fall at the same point of the poll each run."""
        time.sleep(random.uniform(0, phase))
        start = time.monotonic()
        change()
        while self.reserved(provider, rc) != reserved:
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"{provider} {rc}: not reserved {reserved} "
                                   f"within {timeout} s")
            time.sleep(0.01)
        return time.monotonic() - start


def faults(b: SysfsBuilder, name: str) -> dict[str, tuple]:
    """fault -> (provider, class, units out, break, mend)."""
    vf = b.vf_address(PF, 1)
    return {
        "vendor_ffff": (f"{name}_{NIC.upper()}", "CUSTOM_PCI_15B3_101B", 1,
                        lambda: b.set_vendor(NIC, "ffff"),
                        lambda: b.set_vendor(NIC, "15b3")),
        "aer_nonfatal": (f"{name}_{PF.upper()}", "CUSTOM_PCI_8086_10ED", 4,
                         lambda: b.set_aer(PF, nonfatal=1), lambda: b.set_aer(PF)),
        "vf_count_drift": (f"{name}_{PF.upper()}", "CUSTOM_PCI_8086_10ED", 4,
                           lambda: b.unplug_vf(vf), lambda: b.replug_vf(vf)),
        "link_down": (f"{name}_{NIC.upper()}", "CUSTOM_PCI_15B3_101B", 1,
                      lambda: b.set_link(NIC, IFNAME, up=False),
                      lambda: b.set_link(NIC, IFNAME, up=True)),
    }


def poll_cost(workdir: Path) -> tuple[int, float]:
    """One read of every device of a large host, median of RUNS."""
    b = SysfsBuilder(workdir / "large")
    addresses = []
    for i in range(LARGE_PFS):
        pf = f"0000:{0x10 + i:02x}:00.0"
        addresses += [pf] + b.add_pf(pf, "8086", "1572", "154c", numa_node=0,
                                     total_vfs=LARGE_VFS, num_vfs=LARGE_VFS)
        b.set_aer(pf)
    reader = SysfsReader(str(b.root))
    times = []
    for _ in range(RUNS):
        started = time.perf_counter()
        for address in addresses:
            reader.pci_health(address)
        times.append(time.perf_counter() - started)
    return len(addresses), statistics.median(times)


def run(workdir: Path) -> dict:
    placement = LocalPlacement(workdir / "placement").start()
    try:
        b, uri = build_host(workdir)
        name = f"benchhealth-{uuid.uuid4().hex[:6]}"
        agent = compose(load_config(
            ["--config-file", str(write_conf(workdir, placement.url, name, b.root, uri))]))
        agent.start()
        try:
            watcher = Watcher(placement.url, agent.sync.root_uuid)
            result: dict = {"case": "device_health", "runs": RUNS,
                            "poll_interval_s": agent.health.interval}
            everything = []
            for fault, (provider, rc, out, breaks, mends) in faults(b, name).items():
                outs, backs = [], []
                for _ in range(RUNS):
                    outs.append(watcher.seconds_until(provider, rc, out, breaks,
                                                      agent.health.interval))
                    backs.append(watcher.seconds_until(provider, rc, 0, mends,
                                                       agent.health.interval))
                everything += outs
                result[f"{fault}_out_median_s"] = round(statistics.median(outs), 3)
                result[f"{fault}_out_max_s"] = round(max(outs), 3)
                result[f"{fault}_back_median_s"] = round(statistics.median(backs), 3)
            result["out_median_s"] = round(statistics.median(everything), 3)
            result["out_max_s"] = round(max(everything), 3)
        finally:
            agent.stop()
        devices, seconds = poll_cost(workdir)
        result.update(poll_devices=devices, poll_s=round(seconds, 4))
        return result
    finally:
        placement.stop()
