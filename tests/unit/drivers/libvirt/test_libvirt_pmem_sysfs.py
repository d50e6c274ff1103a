"""nvdimm namespaces read from sysfs laid out as the kernel lays it out
(Documentation/driver-api/nvdimm/nvdimm.rst, ABI sysfs-bus-nvdimm and
sysfs-bus-dax, drivers/nvdimm/namespace_devs.c, drivers/dax/pmem.c):

- a namespace's ``mode`` says safe, memory, dax or raw (ndctl's sector,
  fsdax, devdax, raw), and ``holder`` names the device that claimed it;
- a devdax namespace's holder is an nd_dax device beside it in the region
  (regionN/daxN.M), and the dax device with the character device
  /dev/daxN.K is that holder's child (regionN/daxN.M/daxN.K), also linked
  from /sys/bus/dax/devices;
- the namespace's ``size`` is its raw size; the dax device's ``size`` is
  what is left after the kernel's metadata, which is what a guest can map.

These trees are written here, file by file, not by our fake sysfs writer.
"""
import os
from pathlib import Path

import pytest

from compute_agent.drivers.base import PmemNamespace
from compute_agent.drivers.fake_sysfs import SysfsBuilder
from compute_agent.drivers.libvirt import pmem
from compute_agent.drivers.libvirt.sysfs import SysfsReader

GIB = 1 << 30
BUS = "devices/LNXSYSTM:00/LNXSYBUS:00/ACPI0012:00/ndbus0"
NS_UUID = "5b6b3c1e-3f0a-4d52-9a7e-2b1c0d9e8f71"


def write(path: Path, text: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{text}\n")


def link(link_path: Path, target: Path) -> None:
    link_path.parent.mkdir(parents=True, exist_ok=True)
    link_path.symlink_to(os.path.relpath(target, link_path.parent))


def namespace(root: Path, region: int, index: int, size: int, mode: str,
              holder: str = "", alt_name: str = "", numa_node: int = 0,
              ns_uuid: str | None = None) -> Path:
    path = root / BUS / f"region{region}" / f"namespace{region}.{index}"
    for name, text in (("size", size), ("mode", mode), ("holder", holder),
                       ("alt_name", alt_name), ("numa_node", numa_node),
                       ("devtype", "nd_namespace_pmem"),
                       ("nstype", 4), ("force_raw", 0)):
        write(path / name, text)
    if ns_uuid:
        write(path / "uuid", ns_uuid)
    link(root / "bus" / "nd" / "devices" / path.name, path)
    return path


def nd_dax(root: Path, region: int, holder: str, claimed: str,
           dax_device: str | None, usable: int, driver: str = "device_dax"
           ) -> None:
    """The nd_dax device ``holder`` claiming ``claimed``, and its dax
    device with its own size and driver."""
    path = root / BUS / f"region{region}" / holder
    write(path / "namespace", claimed)
    write(path / "mode", "pmem")
    write(path / "align", 2097152)
    link(root / "bus" / "nd" / "devices" / holder, path)
    if dax_device is None:
        return
    write(path / "dax_region" / "id", region)
    write(path / "dax_region" / "size", usable)
    write(path / "dax_region" / "align", 2097152)
    dev = path / dax_device
    write(dev / "size", usable)
    write(dev / "numa_node", 0)
    write(dev / "target_node", 2)
    link(root / "bus" / "dax" / "devices" / dax_device, dev)
    drivers = root / "bus" / "dax" / "drivers" / driver
    drivers.mkdir(parents=True, exist_ok=True)
    link(dev / "driver", drivers)


@pytest.fixture
def host(tmp_path):
    root = tmp_path / "sys"
    # devdax, claimed by dax0.1, whose dax device is dax0.0: the numbers
    # of the nd_dax device and of the dax device need not agree.
    namespace(root, 0, 0, 64 * GIB, "dax", "dax0.1", "ns0", 0, NS_UUID)
    nd_dax(root, 0, "dax0.1", "namespace0.0", "dax0.0", 63 * GIB + (1 << 21))
    # the region's idle seeds: a namespace of size 0, an unclaimed nd_dax
    namespace(root, 0, 1, 0, "raw")
    nd_dax(root, 0, "dax0.2", "", None, 0)
    # fsdax (kernel: memory), sector (kernel: safe) and raw namespaces
    namespace(root, 1, 0, 16 * GIB, "memory", "pfn1.0", "fs", 1)
    namespace(root, 1, 1, 8 * GIB, "safe", "btt1.0", "sect", 1)
    namespace(root, 1, 2, 4 * GIB, "raw", "", "plain", 1)
    return root


def read(root):
    return pmem.read_namespaces(SysfsReader(str(root)), None)


def test_devdax_namespace_has_its_dax_device_and_usable_size(host):
    found, warnings = read(host)
    assert warnings == []
    assert found[0] == PmemNamespace(
        name="ns0", size_bytes=63 * GIB + (1 << 21), numa_node=0,
        mode="devdax", uuid=NS_UUID, dev="dax0.0")


def test_kernel_mode_names_become_ndctls(host):
    found, _ = read(host)
    assert [(n.name, n.mode, n.dev, n.size_bytes) for n in found[1:]] == [
        ("fs", "fsdax", None, 16 * GIB),
        ("sect", "sector", None, 8 * GIB),
        ("plain", "raw", None, 4 * GIB)]


def test_unknown_mode_is_a_warning_naming_the_namespace(host):
    write(host / BUS / "region1" / "namespace1.2" / "mode", "mystery")
    found, warnings = read(host)
    assert "plain" not in [n.name for n in found]
    assert len(warnings) == 1
    assert warnings[0].startswith("namespace1.2: mode: not one of the "
                                  "kernel's")
    assert "'mystery'" in warnings[0]


def test_devdax_whose_holder_has_no_dax_device_is_a_warning(host):
    namespace(host, 2, 0, 8 * GIB, "dax", "dax2.0", "nodev")
    nd_dax(host, 2, "dax2.0", "namespace2.0", None, 0)
    found, warnings = read(host)
    assert "nodev" not in [n.name for n in found]
    assert warnings == [w for w in warnings if w.startswith("namespace2.0: ")]
    assert len(warnings) == 1 and "dax2.0" in warnings[0]


def test_dax_device_given_to_kmem_has_no_character_device(host):
    # Onlined as system RAM (daxctl reconfigure-device -m system-ram): the
    # device is bound to kmem and /dev/daxN.K is gone.
    namespace(host, 2, 0, 8 * GIB, "dax", "dax2.0", "ram")
    nd_dax(host, 2, "dax2.0", "namespace2.0", "dax2.0", 7 * GIB, "kmem")
    found, warnings = read(host)
    assert "ram" not in [n.name for n in found]
    assert len(warnings) == 1
    assert warnings[0].startswith("namespace2.0: ") and "kmem" in warnings[0]


def test_fake_sysfs_writes_what_the_reader_reads_back(tmp_path):
    builder = SysfsBuilder(tmp_path / "sys")
    builder.add_pmem_namespace(0, 0, 4 * GIB, 0, alt_name="ns0")
    builder.add_pmem_namespace(0, 1, 2 * GIB, 0, alt_name="ns1")
    builder.add_pmem_namespace(1, 0, 8 * GIB, None, alt_name="fs",
                               mode="fsdax")
    found, warnings = read(builder.root)
    assert warnings == []
    assert [(n.name, n.mode, n.dev, n.size_bytes, n.numa_node)
            for n in found] == [("ns0", "devdax", "dax0.0", 4 * GIB, 0),
                                ("ns1", "devdax", "dax0.1", 2 * GIB, 0),
                                ("fs", "fsdax", None, 8 * GIB, None)]
    # The kernel's layout: the raw size is larger, the namespace's mode is
    # the kernel's word, and the dax device is not inside the namespace.
    ns_dir = Path(os.path.realpath(builder.root / "bus/nd/devices/namespace0.0"))
    assert (ns_dir / "mode").read_text().strip() == "dax"
    assert int((ns_dir / "size").read_text()) > 4 * GIB
    assert not any(e.startswith("dax") for e in os.listdir(ns_dir))
    holder = (ns_dir / "holder").read_text().strip()
    assert (ns_dir.parent / holder / "dax0.0" / "size").is_file()
    assert (builder.root / "bus/dax/devices/dax0.0").resolve() == (
        ns_dir.parent / holder / "dax0.0")
