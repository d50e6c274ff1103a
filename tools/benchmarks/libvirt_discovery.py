"""Benchmark: the libvirt driver's discovery on a large host.

A host of 8 NUMA cells, 16 SR-IOV PFs with 64 VFs each, 16 mdev-capable
GPUs and 32 pmem namespaces, described twice by SysfsBuilder: as the libvirt
test driver's host file and as a fake sysfs tree. No Placement is involved.

    from tools.benchmarks import libvirt_discovery
    figures = libvirt_discovery.run(pathlib.Path("/tmp/bench"))

Figures (seconds unless named otherwise):

- ``full_discovery_s``: a fresh driver's first ``get_host_inventory()``
  (every node device's XML read and parsed), median over fresh drivers;
- ``unchanged_cycle_s``: ``get_host_inventory()`` again on a warm driver
  with nothing changed, median over repeats;
- ``unchanged_cycle_xmldesc_calls``: node-device ``XMLDesc`` calls in one
  unchanged cycle, counted by wrapping ``virNodeDevice.XMLDesc``: it must
  be 0;
- ``speedup``: full_discovery_s / unchanged_cycle_s.
"""
from __future__ import annotations

import json
import pathlib
import statistics
import sys
import time

import libvirt
from oslo_config import cfg

from compute_agent import config
from compute_agent.drivers.fake_sysfs import SysfsBuilder
from compute_agent.drivers.libvirt.driver import LibvirtDriver

CELLS = 8
CPUS_PER_CELL = 4
MEMORY_MB_PER_CELL = 65536
PFS = 16
VFS_PER_PF = 64
GPUS = 16
NAMESPACES = 32
FRESH_DRIVERS = 5
WARM_REPEATS = 7


def build_host(workdir: pathlib.Path) -> tuple[SysfsBuilder, str]:
    """Write the sysfs tree and host file; returns the builder and URI."""
    sysfs = SysfsBuilder(workdir / "sys")
    for cell in range(CELLS):
        first = cell * CPUS_PER_CELL
        sysfs.add_numa_node(cell, f"{first}-{first + CPUS_PER_CELL - 1}",
                            MEMORY_MB_PER_CELL, {2048: 1024})
    for i in range(PFS):
        sysfs.add_pf(f"0000:{0x10 + i:02x}:00.0", "8086", "1572", "154c",
                     numa_node=i % CELLS, total_vfs=VFS_PER_PF,
                     num_vfs=VFS_PER_PF, driver="i40e", vf_driver="iavf")
    for i in range(GPUS):
        sysfs.add_mdev_parent(f"0000:{0x80 + i:02x}:00.0", i % CELLS,
                              {"nvidia-35": ("GRID M60-2Q", 16),
                               "nvidia-36": ("GRID M60-4Q", 8)})
    for i in range(NAMESPACES):
        sysfs.add_pmem_namespace(i // 4, i % 4, 64 << 30, (i // 4) % CELLS,
                                 alt_name=f"ns{i}")
    uri = sysfs.write_test_driver_host_xml(workdir / "host.xml")
    return sysfs, uri


def make_driver(workdir: pathlib.Path, sysfs: SysfsBuilder, uri: str
                ) -> LibvirtDriver:
    conf = cfg.ConfigOpts()
    config.register_opts(conf)
    conf([], default_config_files=[])
    conf.set_override("sysfs_root", str(sysfs.root))
    conf.set_override("connection_uri", uri, "libvirt")
    conf.set_override("instances_path", str(workdir / "instances"), "libvirt")
    driver = LibvirtDriver(conf)
    driver.init_host()
    return driver


class XMLDescCounter:
    """Counts virNodeDevice.XMLDesc calls while active."""

    def __init__(self) -> None:
        self.calls = 0
        self._real = libvirt.virNodeDevice.XMLDesc

    def __enter__(self) -> XMLDescCounter:
        real, counter = self._real, self

        def counting(dev, flags=0):
            counter.calls += 1
            return real(dev, flags)

        libvirt.virNodeDevice.XMLDesc = counting
        return self

    def __exit__(self, *exc) -> None:
        libvirt.virNodeDevice.XMLDesc = self._real


def _timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def run(workdir: pathlib.Path) -> dict:
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    build_s, (sysfs, uri) = _timed(lambda: build_host(workdir))

    full, inventory = [], None
    with XMLDescCounter() as first_counter:
        for _ in range(FRESH_DRIVERS):
            driver = make_driver(workdir, sysfs, uri)
            try:
                seconds, inventory = _timed(driver.get_host_inventory)
            finally:
                driver.cleanup()
            full.append(seconds)
    xmldesc_full = first_counter.calls // FRESH_DRIVERS

    driver = make_driver(workdir, sysfs, uri)
    try:
        driver.get_host_inventory()
        warm = []
        with XMLDescCounter() as counter:
            for _ in range(WARM_REPEATS):
                seconds, again = _timed(driver.get_host_inventory)
                warm.append(seconds)
        unchanged_same = again == inventory
    finally:
        driver.cleanup()

    vfs = sum(1 for d in inventory.pci_devices if d.parent_address)
    full_s, warm_s = statistics.median(full), statistics.median(warm)
    return {
        "host": {"numa_cells": len(inventory.numa_cells),
                 "cpus": len(inventory.cpus),
                 "pci_devices": len(inventory.pci_devices), "vfs": vfs,
                 "mdev_parents": len(inventory.mdev_parents),
                 "pmem_namespaces": len(inventory.pmem_namespaces),
                 "warnings": len(inventory.warnings)},
        "build_fixture_s": round(build_s, 3),
        "full_discovery_s": round(full_s, 4),
        "full_discovery_runs_s": [round(s, 4) for s in full],
        "full_discovery_xmldesc_calls": xmldesc_full,
        "unchanged_cycle_s": round(warm_s, 4),
        "unchanged_cycle_runs_s": [round(s, 4) for s in warm],
        "unchanged_cycle_xmldesc_calls": counter.calls // WARM_REPEATS,
        "unchanged_cycle_same_inventory": unchanged_same,
        "speedup": round(full_s / warm_s, 2) if warm_s else None,
    }


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(run(pathlib.Path(sys.argv[1] if len(sys.argv) > 1
                                          else tmp)), indent=2))
