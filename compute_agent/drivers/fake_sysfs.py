"""A realistic, writable sysfs tree for tests and demos, and the matching
libvirt test-driver host XML, so a test sees one host through both views.

    builder = SysfsBuilder(tmp / "sys")
    builder.add_numa_node(0, "0-3", 8192)
    pf = builder.add_pf("0000:81:00.0", "8086", "10fb", "10ed",
                        numa_node=0, total_vfs=8, num_vfs=2)
    builder.write_test_driver_host_xml(tmp / "host.xml")
    # [DEFAULT] sysfs_root = tmp/sys, [libvirt] connection_uri =
    # "test://" + str(tmp / "host.xml")

Device directories live under devices/, and bus/, class/ and kernel/ hold
symlinks to them, as in the kernel's sysfs, because the readers follow
those links (physfn, virtfnN, driver, iommu_group, mdev_type).

SysfsBuilder is made of one part per kind of device, each writing that
kind's files (NumaNodeFiles, PciDeviceFiles, PciHealthFiles, MdevFiles,
NvidiaVgpuFiles, PmemFiles) and LibvirtHostView, which writes the test
driver's host file; a part that keeps state per PCI device extends how
devices are removed or VFs enabled.
"""
from __future__ import annotations

import os
import re
import shutil
import uuid as uuid_lib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from compute_agent.common.cpuset import parse_cpu_set
from compute_agent.common.pci_address import format_address, node_device_name, split_address
from compute_agent.drivers.errors import MdevError

# Where a PF's first VF sits, in routing ids (slot * 8 + function) past the
# PF: 0000:81:00.0 has its VFs at 0000:81:10.0, 0000:81:10.1, ...
_VF_OFFSET = 0x80
_NVIDIA_VENDOR = "10de"
# NVIDIA's vGPU type names: board, framebuffer GB, series ("NVIDIA L40-2Q").
_VGPU_SIZE = re.compile(r"-(\d+)[A-Z]+$")
# A namespace's mode by ndctl's name -> the word the kernel's mode file
# writes, and the kind of device that claims it (its ``holder``).
_KERNEL_MODES = {"sector": "safe", "fsdax": "memory", "devdax": "dax",
                 "raw": "raw"}
_HOLDER_KINDS = {"sector": "btt", "fsdax": "pfn", "devdax": "dax"}
_DAX_ALIGN = 2 << 20
_CONFIG_HEADER = 64
# The SCSI host number of the vport an NPIV HBA has made (add_npiv_hba).
_TEST_DRIVER_VPORT = 11
# The errors each AER statistics file lists, in the kernel's words, before
# its TOTAL_ERR_* line (Documentation/ABI/testing/
# sysfs-bus-pci-devices-aer_stats).
_AER_FILES = {
    "aer_dev_correctable": ("TOTAL_ERR_COR", (
        "Receiver Error", "Bad TLP", "Bad DLLP", "RELAY_NUM Rollover",
        "Replay Timer Timeout", "Advisory Non-Fatal",
        "Corrected Internal Error", "Header Log Overflow")),
    "aer_dev_fatal": ("TOTAL_ERR_FATAL", (
        "Undefined", "Data Link Protocol", "Surprise Down Error",
        "Poisoned TLP", "Flow Control Protocol", "Completion Timeout",
        "Completer Abort", "Unexpected Completion", "Receiver Overflow",
        "Malformed TLP", "ECRC", "Unsupported Request")),
    "aer_dev_nonfatal": ("TOTAL_ERR_NONFATAL", (
        "Undefined", "Data Link Protocol", "Surprise Down Error",
        "Poisoned TLP", "Flow Control Protocol", "Completion Timeout",
        "Completer Abort", "Unexpected Completion", "Receiver Overflow",
        "Malformed TLP", "ECRC", "Unsupported Request")),
}
# IFF_UP | IFF_BROADCAST | IFF_MULTICAST, and IFF_BROADCAST | IFF_MULTICAST:
# an interface brought up, and one left down.
_FLAGS_UP, _FLAGS_DOWN = 0x1003, 0x1002


def _metadata_bytes(usable: int) -> int:
    """What the kernel keeps in a claimed namespace ahead of the data: an
    info block and a page array of 64 bytes per 4 KiB page, to 2 MiB."""
    need = (2 << 20) + usable // 64
    return -(-need // _DAX_ALIGN) * _DAX_ALIGN


@dataclass
class _Pci:
    address: str
    vendor: str
    product: str
    class_id: str
    numa_node: int | None
    driver: str | None
    iommu_group: int | None
    physfn: str | None = None
    total_vfs: int = 0
    vf_product: str | None = None
    vf_driver: str | None = None
    vfs: list[str] = field(default_factory=list)
    mdev_types: dict[str, tuple[str | None, int]] = field(default_factory=dict)
    vpd_serial: str | None = None


@dataclass(frozen=True)
class VgpuCard:
    """What a GPU in NVIDIA's vendor-specific VFIO layout offers, as
    NVIDIA's vGPU user guide tells: the vGPU ``types`` its VFs can create
    (id -> name, "NVIDIA L40-2Q": 2 GB of framebuffer); ``equal_size``
    (the default mode of these cards) lets every vGPU on the card be of one
    framebuffer size, so once a VF has a type the other VFs list only that
    size; in mixed-size mode they list every type that still fits
    ``framebuffer_gb`` (None: no limit)."""

    types: Mapping[int, str]
    equal_size: bool = False
    framebuffer_gb: int | None = None


@dataclass
class _VgpuCard:
    offer: VgpuCard
    current: dict[str, int] = field(default_factory=dict)  # VF -> type id


def vgpu_framebuffer_gb(name: str) -> int:
    """A vGPU type's framebuffer in GB, from NVIDIA's name for it: the
    number after the board's name, "NVIDIA L40-12Q" -> 12."""
    match = _VGPU_SIZE.search(name)
    if match is None:
        raise ValueError(f"vGPU type name {name!r}: no framebuffer size in it")
    return int(match.group(1))


def vf_address(pf_address: str, index: int) -> str:
    """Where a PF's VFs sit: its routing id + 0x80 + index, carrying into
    the next slot and bus as real SR-IOV devices do."""
    domain, bus, slot, function = split_address(pf_address)
    routing_id = (slot << 3 | function) + _VF_OFFSET + index
    bus += routing_id >> 8
    if bus > 0xFF:
        raise ValueError(f"VF {index} of {pf_address} is past bus ff")
    return format_address(domain, bus, (routing_id >> 3) & 0x1F,
                          routing_id & 7)


class _SysfsFiles:
    """The tree under its root, and how its files and links are written."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _write(self, path: Path, text: object) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{text}\n")

    def _link(self, link: Path, target: Path) -> None:
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():
            link.unlink()
        link.symlink_to(os.path.relpath(target, link.parent))


class NumaNodeFiles(_SysfsFiles):
    """The NUMA nodes: their CPUs, memory and huge pages."""

    def __init__(self, root: str | os.PathLike) -> None:
        super().__init__(root)
        self._numa: dict[int, tuple[str, int]] = {}

    def add_numa_node(self, node_id: int, cpus: str, memory_mb: int,
                      hugepages: dict[int, int] | None = None) -> None:
        """``cpus`` in the kernel's list syntax; ``hugepages`` maps a page
        size in KiB to a count (2 MiB and 1 GiB pages, 0 by default)."""
        node = self.root / "devices" / "system" / "node" / f"node{node_id}"
        self._write(node / "cpulist", cpus)
        self._write(node / "meminfo",
                    f"Node {node_id} MemTotal:       {memory_mb * 1024} kB\n"
                    f"Node {node_id} MemFree:        {memory_mb * 512} kB")
        pages = {2048: 0, 1048576: 0, **(hugepages or {})}
        for size, count in pages.items():
            self._write(node / "hugepages" / f"hugepages-{size}kB" /
                        "nr_hugepages", count)
        self._numa[node_id] = (cpus, memory_mb)


class PciDeviceFiles(_SysfsFiles):
    """PCI devices, their drivers and IOMMU groups, SR-IOV PFs and VFs."""

    def __init__(self, root: str | os.PathLike) -> None:
        super().__init__(root)
        self._pci: dict[str, _Pci] = {}
        self._next_group = 1

    @staticmethod
    def _write_config(path: Path, vendor: str, product: str) -> None:
        """The first 64 bytes of config space, what an unprivileged reader
        gets: vendor and device ids, little-endian, at offset 0."""
        header = (int(vendor, 16).to_bytes(2, "little")
                  + int(product, 16).to_bytes(2, "little"))
        (path / "config").write_bytes(header.ljust(_CONFIG_HEADER, b"\0"))

    def device_dir(self, address: str) -> Path:
        domain, bus, _, _ = split_address(address)
        return self.root / "devices" / f"pci{domain:04x}:{bus:02x}" / address

    def pf_of(self, vf: str) -> str:
        """The PF of VF ``vf``; ValueError for a device that is no VF."""
        pf = self._pci[vf].physfn
        if pf is None:
            raise ValueError(f"{vf} is not a VF")
        return pf

    def add_pci_device(self, address: str, vendor: str, product: str,
                       class_id: str = "030000", numa_node: int | None = None,
                       driver: str | None = None,
                       iommu_group: int | None = None) -> Path:
        if iommu_group is None:
            iommu_group = self._next_group
        self._next_group = max(self._next_group, iommu_group) + 1
        dev = _Pci(address, vendor, product, class_id, numa_node, driver,
                   iommu_group)
        self._pci[address] = dev
        path = self.device_dir(address)
        self._write(path / "vendor", f"0x{vendor}")
        self._write(path / "device", f"0x{product}")
        self._write_config(path, vendor, product)
        self._write(path / "class", f"0x{class_id}")
        self._write(path / "numa_node", -1 if numa_node is None else numa_node)
        self._link(self.root / "bus" / "pci" / "devices" / address, path)
        group_dir = self.root / "kernel" / "iommu_groups" / str(iommu_group)
        self._link(group_dir / "devices" / address, path)
        self._link(path / "iommu_group", group_dir)
        if driver:
            self._bind(address, driver)
        return path

    def _bind(self, address: str, driver: str) -> None:
        path = self.device_dir(address)
        driver_dir = self.root / "bus" / "pci" / "drivers" / driver
        driver_dir.mkdir(parents=True, exist_ok=True)
        self._link(path / "driver", driver_dir)
        self._link(driver_dir / address, path)
        self._pci[address].driver = driver

    def add_pf(self, address: str, vendor: str, product: str,
               vf_product: str, numa_node: int | None, total_vfs: int,
               num_vfs: int = 0, driver: str | None = None,
               vf_driver: str | None = None,
               class_id: str = "020000") -> list[str]:
        """An SR-IOV PF with ``num_vfs`` VFs enabled; returns their
        addresses."""
        self.add_pci_device(address, vendor, product, class_id, numa_node,
                            driver)
        pf = self._pci[address]
        pf.total_vfs, pf.vf_product = total_vfs, vf_product
        pf.vf_driver = vf_driver
        self._write(self.device_dir(address) / "sriov_totalvfs", total_vfs)
        self.set_num_vfs(address, num_vfs)
        return list(pf.vfs)

    vf_address = staticmethod(vf_address)

    def set_vpd_serial(self, address: str, serial_number: str) -> None:
        """Give a device VPD with this serial number in the test driver's
        host file (escaped there; libvirt 9.0 writes it back unescaped)."""
        self._pci[address].vpd_serial = serial_number

    def set_num_vfs(self, pf_address: str, num_vfs: int) -> list[str]:
        """Enable exactly ``num_vfs`` VFs, as writing sriov_numvfs does."""
        pf = self._pci[pf_address]
        if not 0 <= num_vfs <= pf.total_vfs:
            raise ValueError(f"{pf_address}: {num_vfs} VFs of "
                             f"{pf.total_vfs}")
        pf_dir = self.device_dir(pf_address)
        while len(pf.vfs) > num_vfs:
            vf = pf.vfs.pop()
            (pf_dir / f"virtfn{len(pf.vfs)}").unlink()
            self.remove_device(vf)
        while len(pf.vfs) < num_vfs:
            index = len(pf.vfs)
            vf = self.vf_address(pf_address, index)
            vf_dir = self.add_pci_device(vf, pf.vendor, pf.vf_product or
                                         pf.product, pf.class_id,
                                         pf.numa_node, pf.vf_driver)
            self._pci[vf].physfn = pf_address
            self._link(vf_dir / "physfn", pf_dir)
            self._link(pf_dir / f"virtfn{index}", vf_dir)
            pf.vfs.append(vf)
        self._write(pf_dir / "sriov_numvfs", num_vfs)
        return list(pf.vfs)

    def answer_sriov_writes(self) -> None:
        """Do what the kernel does within a write of a PF's
        ``sriov_numvfs`` (Documentation/ABI/testing/sysfs-bus-pci), which
        nothing in this tree reacts to: that many VFs are enabled, or all
        disabled for 0. A plain file cannot refuse a write as the kernel
        does: a non-zero count written while VFs exist, which the kernel
        refuses (EBUSY), raises here instead."""
        for address, pf in sorted(self._pci.items()):
            if not pf.total_vfs:
                continue
            written = int((self.device_dir(address) / "sriov_numvfs").read_text())
            if written == len(pf.vfs):
                continue
            if written and pf.vfs:
                raise ValueError(f"{address}: {written} written to sriov_numvfs while "
                                 f"{len(pf.vfs)} VFs exist: the kernel refuses it (EBUSY)")
            self.set_num_vfs(address, written)

    def remove_device(self, address: str) -> None:
        """Unplug a device, its VFs with it."""
        dev = self._pci.pop(address)
        for vf in list(dev.vfs):
            self.remove_device(vf)
        self._remove_files(address, dev)

    def _remove_files(self, address: str, dev: _Pci) -> None:
        for link in (self.root / "bus" / "pci" / "devices" / address,
                     self.root / "class" / "mdev_bus" / address,
                     self.root / "kernel" / "iommu_groups" /
                     str(dev.iommu_group) / "devices" / address,
                     self.root / "bus" / "pci" / "drivers" / str(dev.driver) /
                     address):
            if link.is_symlink():
                link.unlink()
        shutil.rmtree(self.device_dir(address), ignore_errors=True)

    def unplug_vf(self, vf: str) -> None:
        """Remove one VF alone, as writing its ``remove`` file does: its PF
        still counts it in sriov_numvfs and its virtfnN link dangles."""
        self._remove_files(vf, self._pci[vf])

    def replug_vf(self, vf: str) -> None:
        """The VF found again, as a rescan of the bus finds it."""
        dev = self._pci[vf]
        pf_dir = self.device_dir(self.pf_of(vf))
        self.add_pci_device(vf, dev.vendor, dev.product, dev.class_id,
                            dev.numa_node, dev.driver, dev.iommu_group)
        self._pci[vf] = dev
        self._link(self.device_dir(vf) / "physfn", pf_dir)


class PciHealthFiles(PciDeviceFiles):
    """What a failing PCI device's files show."""

    def set_vendor(self, address: str, vendor: str) -> None:
        """What the ``vendor`` file says: "ffff" once config space no
        longer answers."""
        self._write(self.device_dir(address) / "vendor", f"0x{vendor}")

    def set_config_space_dead(self, address: str, dead: bool = True) -> None:
        """Config space reads all ones (the device stopped answering), or
        its header again."""
        dev, path = self._pci[address], self.device_dir(address)
        if dead:
            (path / "config").write_bytes(b"\xff" * _CONFIG_HEADER)
        else:
            self._write_config(path, dev.vendor, dev.product)

    def set_aer(self, address: str, fatal: int = 0, nonfatal: int = 0,
                correctable: int = 0) -> None:
        """The device's AER statistics files, each error's line then its
        TOTAL_ERR_* line, the first error carrying the whole count."""
        for file, count in (("aer_dev_fatal", fatal),
                            ("aer_dev_nonfatal", nonfatal),
                            ("aer_dev_correctable", correctable)):
            total, errors = _AER_FILES[file]
            lines = [f"{name} {count if i == 0 else 0}"
                     for i, name in enumerate(errors)]
            self._write(self.device_dir(address) / file,
                        "\n".join(lines + [f"{total} {count}"]))

    def set_link(self, address: str, ifname: str, up: bool,
                 admin_up: bool = True) -> None:
        """The device's network interface ``net/<ifname>``, as the
        sysfs-class-net ABI shows it: ``operstate``, ``carrier`` (which an
        administratively down interface refuses to read: left out) and
        ``flags``."""
        iface = self.device_dir(address) / "net" / ifname
        self._write(iface / "operstate", "up" if up and admin_up else "down")
        self._write(iface / "flags",
                    f"0x{_FLAGS_UP if admin_up else _FLAGS_DOWN:x}")
        carrier = iface / "carrier"
        if admin_up:
            self._write(carrier, 1 if up else 0)
        elif carrier.exists():
            carrier.unlink()


class MdevFiles(PciDeviceFiles):
    """Mediated devices and the mdev parents that offer their types."""

    def __init__(self, root: str | os.PathLike) -> None:
        super().__init__(root)
        self._mdevs: dict[str, tuple[str, str]] = {}

    def remove_device(self, address: str) -> None:
        """Unplug a device, its mdevs and its VFs' with it."""
        for mdev_uuid, (parent, _) in list(self._mdevs.items()):
            if parent == address:
                del self._mdevs[mdev_uuid]
                (self.root / "bus" / "mdev" / "devices" / mdev_uuid).unlink()
        super().remove_device(address)

    def add_mdev_parent(self, address: str, numa_node: int | None,
                        types: dict[str, tuple[str | None, int]],
                        vendor: str = _NVIDIA_VENDOR,
                        product: str = "13f2") -> None:
        """A GPU offering mdev types: ``{type_id: (name, available)}``."""
        self.add_pci_device(address, vendor, product, "030000", numa_node)
        self.bind_mdev_driver(address, types)

    def bind_mdev_driver(self, address: str,
                         types: dict[str, tuple[str | None, int]],
                         driver: str = "nvidia") -> None:
        """The vendor's driver bound to a device (``types`` as for
        add_mdev_parent): probing it registers the device as an mdev parent,
        which adds its class/mdev_bus link and its mdev_supported_types
        (Documentation/driver-api/vfio-mediated-device.rst). The test
        driver's host file keeps what it was written with, as libvirt's
        view before its node-device event."""
        path = self.device_dir(address)
        self._bind(address, driver)
        self._link(self.root / "class" / "mdev_bus" / address, path)
        for type_id, (name, available) in types.items():
            type_dir = path / "mdev_supported_types" / type_id
            if name is not None:
                self._write(type_dir / "name", name)
            self._write(type_dir / "available_instances", available)
            self._write(type_dir / "device_api", "vfio-pci")
            (type_dir / "devices").mkdir(exist_ok=True)
        self._pci[address].mdev_types = dict(types)

    def unbind_mdev_driver(self, address: str) -> None:
        """The vendor's driver unbound: the device is no mdev parent any
        more, its mdev_supported_types and class/mdev_bus link gone. The
        kernel refuses while mdevs of it exist; so does this."""
        dev = self._pci[address]
        held = sorted(u for u, (parent, _) in self._mdevs.items()
                      if parent == address)
        if held:
            raise ValueError(f"{address}: mdevs {held} still exist")
        path = self.device_dir(address)
        shutil.rmtree(path / "mdev_supported_types")
        (self.root / "class" / "mdev_bus" / address).unlink()
        (self.root / "bus" / "pci" / "drivers" / str(dev.driver) / address).unlink()
        (path / "driver").unlink()
        dev.driver, dev.mdev_types = None, {}

    def add_mdev(self, mdev_uuid: str, parent: str, type_id: str) -> None:
        """Create an mdev; its type's available_instances drops by one."""
        dev = self._pci[parent]
        name, available = dev.mdev_types[type_id]
        dev.mdev_types[type_id] = (name, available - 1)
        type_dir = (self.device_dir(parent) / "mdev_supported_types" /
                    type_id)
        self._write(type_dir / "available_instances", available - 1)
        mdev_dir = self.device_dir(parent) / mdev_uuid
        mdev_dir.mkdir(parents=True)
        self._link(mdev_dir / "mdev_type", type_dir)
        self._link(type_dir / "devices" / mdev_uuid, mdev_dir)
        self._link(self.root / "bus" / "mdev" / "devices" / mdev_uuid,
                   mdev_dir)
        self._mdevs[mdev_uuid] = (parent, type_id)

    def remove_mdev(self, mdev_uuid: str) -> None:
        """Remove an mdev; its type's available_instances rises by one."""
        parent, type_id = self._mdevs.pop(mdev_uuid)
        dev = self._pci[parent]
        name, available = dev.mdev_types[type_id]
        dev.mdev_types[type_id] = (name, available + 1)
        type_dir = (self.device_dir(parent) / "mdev_supported_types" /
                    type_id)
        self._write(type_dir / "available_instances", available + 1)
        (self.root / "bus" / "mdev" / "devices" / mdev_uuid).unlink()
        (type_dir / "devices" / mdev_uuid).unlink()
        shutil.rmtree(self.device_dir(parent) / mdev_uuid)

    def answer_mdev_writes(self) -> None:
        """Do what the kernel does within the writes compute_agent.drivers.libvirt.mdev
        makes, which nothing in this tree reacts to: a UUID written to a
        type's ``create`` makes that mdev, ``1`` written to an mdev's
        ``remove`` removes it."""
        for mdev_uuid, (parent, _) in list(self._mdevs.items()):
            remove = self.device_dir(parent) / mdev_uuid / "remove"
            if remove.exists() and remove.read_text().strip() == "1":
                self.remove_mdev(mdev_uuid)
        for address, dev in self._pci.items():
            for type_id in dev.mdev_types:
                create = (self.device_dir(address) / "mdev_supported_types" /
                          type_id / "create")
                if create.exists():
                    self.add_mdev(create.read_text().strip(), address, type_id)
                    create.unlink()


class NvidiaVgpuFiles(PciDeviceFiles):
    """GPUs in NVIDIA's vendor-specific VFIO layout."""

    def __init__(self, root: str | os.PathLike) -> None:
        super().__init__(root)
        # PF address -> its vGPU state.
        self._vgpu_cards: dict[str, _VgpuCard] = {}

    def add_nvidia_vf_layout(self, pf_address: str, product: str,
                             numa_node: int | None, card: VgpuCard,
                             num_vfs: int = 4) -> list[str]:
        """A GPU in NVIDIA's vendor-specific VFIO layout: an SR-IOV PF whose
        VFs each list the vGPU types of the ``card`` they can create now in
        ``nvidia/creatable_vgpu_types``, under the header line, and take one
        when its id is written to ``nvidia/current_vgpu_type``. What the
        lists say follows the card's state (VgpuCard); a VF with a type
        lists none."""
        vfs = self.add_pf(pf_address, _NVIDIA_VENDOR, product, product,
                          numa_node, total_vfs=num_vfs, num_vfs=num_vfs,
                          driver="nvidia", vf_driver="nvidia",
                          class_id="030200")
        self._vgpu_cards[pf_address] = _VgpuCard(card)
        self._write_vgpu_files(pf_address)
        return vfs

    def set_num_vfs(self, pf_address: str, num_vfs: int) -> list[str]:
        """As for any PF; on a card's, the VFs added list what they can
        create, and a VF removed takes its type with it."""
        vfs = super().set_num_vfs(pf_address, num_vfs)
        if pf_address in self._vgpu_cards:
            self._write_vgpu_files(pf_address)
        return vfs

    def set_current_vgpu_type(self, vf_address: str, type_id: int) -> None:
        """What the NVIDIA driver does with ``type_id`` written to the VF's
        current_vgpu_type: 0 removes its type; another id gives it that
        type when the VF lists it as creatable now. Raises
        MdevError, changing nothing, as the driver fails the write."""
        pf = self.pf_of(vf_address)
        card = self._vgpu_cards[pf]
        current = card.current.get(vf_address, 0)
        if type_id == current:
            return
        if type_id and (current or type_id not in self._creatable(pf, vf_address)):
            raise MdevError(
                f"{vf_address}: vGPU type {type_id} is not creatable now "
                f"(current_vgpu_type {current})")
        if type_id:
            card.current[vf_address] = type_id
        else:
            card.current.pop(vf_address, None)
        self._write_vgpu_files(pf)

    def answer_vgpu_type_writes(self) -> None:
        """Do what the NVIDIA driver does within the writes a driver makes
        to current_vgpu_type, which nothing in this tree reacts to: each
        VF's file read back and taken as written; a write the driver
        would have refused is undone (the file says the type before it)."""
        for pf in self._vgpu_cards:
            # All read before any is answered: answering rewrites the
            # card's files. Types removed first, as they free room.
            written = {vf: int((self.device_dir(vf) / "nvidia" /
                                "current_vgpu_type").read_text().strip() or 0)
                       for vf in self._pci[pf].vfs}
            for vf, type_id in sorted(written.items(), key=lambda w: w[1] != 0):
                try:
                    self.set_current_vgpu_type(vf, type_id)
                except MdevError:
                    pass  # refused: the file says the type before it
            self._write_vgpu_files(pf)

    def forget_vgpu_types(self) -> None:
        """What a host reboot does to the vGPU types: every VF without."""
        for pf, card in self._vgpu_cards.items():
            card.current.clear()
            self._write_vgpu_files(pf)

    def _creatable(self, pf: str, vf: str) -> list[int]:
        card = self._vgpu_cards[pf]
        if vf in card.current:
            return []
        offer = card.offer
        in_use = [vgpu_framebuffer_gb(offer.types[t]) for t in card.current.values()]
        free_gb = (None if offer.framebuffer_gb is None
                   else offer.framebuffer_gb - sum(in_use))
        return [t for t, name in sorted(offer.types.items())
                if (not offer.equal_size or not in_use
                    or vgpu_framebuffer_gb(name) == in_use[0])
                and (free_gb is None or vgpu_framebuffer_gb(name) <= free_gb)]

    def _write_vgpu_files(self, pf: str) -> None:
        card = self._vgpu_cards[pf]
        # A VF removed (sriov_numvfs lowered) takes its type with it.
        card.current = {v: t for v, t in card.current.items()
                        if v in self._pci[pf].vfs}
        for vf in self._pci[pf].vfs:
            nvidia = self.device_dir(vf) / "nvidia"
            nvidia.mkdir(exist_ok=True)
            (nvidia / "creatable_vgpu_types").write_text(
                "ID    : vGPU Name\n" + "".join(
                    f"{t:<6}: {card.offer.types[t]}\n"
                    for t in self._creatable(pf, vf)))
            self._write(nvidia / "current_vgpu_type", card.current.get(vf, 0))


class PmemFiles(_SysfsFiles):
    """Persistent-memory namespaces, their claiming devices and dax devices."""

    def __init__(self, root: str | os.PathLike) -> None:
        super().__init__(root)
        self._holders: dict[tuple[int, str], int] = {}

    def add_pmem_namespace(self, region: int, index: int, size_bytes: int,
                           numa_node: int | None, alt_name: str = "",
                           mode: str = "devdax") -> str:
        """A namespace in ``mode`` as ndctl names it (``size_bytes`` 0: the
        region's idle seed), laid out as the kernel does: the namespace's
        ``mode`` is the kernel's word and a claimed one names its claiming
        device in ``holder``. A devdax namespace's holder is an nd_dax
        device beside it in the region, and the dax device with the
        character device /dev/daxN.K is that holder's child; ``size_bytes``
        is then the dax device's (usable) size, and the namespace's own
        ``size`` the raw one, larger by the kernel's metadata."""
        name = f"namespace{region}.{index}"
        region_dir = self.root / "devices" / "ndbus0" / f"region{region}"
        path = region_dir / name
        kernel_mode = _KERNEL_MODES[mode] if size_bytes else "raw"
        holder = ""
        if size_bytes and mode != "raw":
            # nd_dax, pfn and btt devices are numbered per region in the
            # order they are claimed, not after the namespace.
            holder = (f"{_HOLDER_KINDS[mode]}{region}."
                      f"{self._next_holder(region, mode)}")
        devdax = mode == "devdax" and size_bytes > 0
        raw_size = size_bytes + (_metadata_bytes(size_bytes) if devdax
                                 else 0)
        self._write(path / "size", raw_size)
        self._write(path / "mode", kernel_mode)
        self._write(path / "holder", holder)
        self._write(path / "uuid", uuid_lib.uuid5(uuid_lib.NAMESPACE_OID,
                                                  f"{self.root}/{name}"))
        self._write(path / "alt_name", alt_name)
        self._write(path / "numa_node", -1 if numa_node is None
                    else numa_node)
        self._link(self.root / "bus" / "nd" / "devices" / name, path)
        if holder:
            self._write(region_dir / holder / "namespace", name)
            self._link(self.root / "bus" / "nd" / "devices" / holder,
                       region_dir / holder)
        if devdax:
            self._add_dax_device(region_dir / holder, region, index,
                                 size_bytes, numa_node)
        return name

    def _next_holder(self, region: int, mode: str) -> int:
        key = (region, _HOLDER_KINDS[mode])
        self._holders[key] = self._holders.get(key, -1) + 1
        return self._holders[key]

    def _add_dax_device(self, holder_dir: Path, region: int, index: int,
                        size_bytes: int, numa_node: int | None) -> None:
        # The kernel names the dax device after the namespace it serves.
        dax = f"dax{region}.{index}"
        for directory in (holder_dir / "dax_region", holder_dir / dax):
            self._write(directory / "size", size_bytes)
            self._write(directory / "align", _DAX_ALIGN)
        self._write(holder_dir / "dax_region" / "id", region)
        self._write(holder_dir / dax / "numa_node",
                    -1 if numa_node is None else numa_node)
        self._link(self.root / "bus" / "dax" / "devices" / dax,
                   holder_dir / dax)
        driver_dir = self.root / "bus" / "dax" / "drivers" / "device_dax"
        driver_dir.mkdir(parents=True, exist_ok=True)
        self._link(holder_dir / dax / "driver", driver_dir)
        self._link(driver_dir / dax, holder_dir / dax)


class LibvirtHostView(NumaNodeFiles, MdevFiles):
    """The libvirt test driver's host file for the host built so far."""

    def __init__(self, root: str | os.PathLike) -> None:
        super().__init__(root)
        self._npiv_hba: int | None = None

    def add_npiv_hba(self, host: int) -> str:
        """A Fibre Channel HBA that can make NPIV vports, with one vport
        made, in the test driver's host file only (the agent reads nothing
        of Fibre Channel); returns the HBA's node-device name. A vHBA
        created on it through libvirt (``vhba_xml``) is the one node device
        the test driver creates and destroys, and so the one source of its
        node-device lifecycle events (CREATED, DELETED). libvirt 9.0's test
        driver makes each vHBA as a copy of the node device scsi_host11,
        which is therefore the made vport's name."""
        if host == _TEST_DRIVER_VPORT or self._npiv_hba is not None:
            raise ValueError(f"scsi_host{host}: one NPIV HBA per host file, "
                             f"not scsi_host{_TEST_DRIVER_VPORT} (its vport)")
        self._npiv_hba = host
        return f"scsi_host{host}"

    def test_driver_host_xml(self, memory_mb: int | None = None) -> str:
        """The libvirt test driver's host file for the same host: its CPUs,
        memory, the PCI and mdev node devices and the NPIV HBA built so
        far."""
        cpus = sum(len(parse_cpu_set(c, allow_exclusions=False))
                   for c, _ in self._numa.values()) or 4
        memory_mb = memory_mb or sum(m for _, m in self._numa.values()) or 8192
        parts = ["<node>",
                 f"  <cpu><mode>custom</mode><nodes>{max(len(self._numa), 1)}"
                 f"</nodes><sockets>1</sockets><cores>{cpus}</cores>"
                 f"<threads>1</threads><active>{cpus}</active>"
                 "<mhz>2400</mhz><model>x86_64</model></cpu>",
                 f"  <memory>{memory_mb * 1024}</memory>"]
        parts += [self._pci_xml(dev) for _, dev in sorted(self._pci.items())]
        parts += [_mdev_xml(u, parent, type_id)
                  for u, (parent, type_id) in sorted(self._mdevs.items())]
        if self._npiv_hba is not None:
            parts.append(_npiv_hba_xml(self._npiv_hba))
        parts.append("</node>")
        return "\n".join(parts) + "\n"

    def write_test_driver_host_xml(self, path: str | os.PathLike,
                                   memory_mb: int | None = None) -> str:
        """Write the host file; returns the URI that opens it."""
        path = Path(path).absolute()
        path.write_text(self.test_driver_host_xml(memory_mb))
        return f"test://{path}"

    def _pci_xml(self, dev: _Pci) -> str:
        domain, bus, slot, function = split_address(dev.address)
        caps = []
        if dev.total_vfs:
            caps.append(f"<capability type='virt_functions' "
                        f"maxCount='{dev.total_vfs}'>"
                        + "".join(_address_xml(vf) for vf in dev.vfs)
                        + "</capability>")
        if dev.physfn:
            caps.append("<capability type='phys_function'>"
                        f"{_address_xml(dev.physfn)}</capability>")
        if dev.mdev_types:
            caps.append("<capability type='mdev_types'>" + "".join(
                f"<type id={quoteattr(type_id)}>"
                + (f"<name>{escape(name)}</name>" if name else "")
                + "<deviceAPI>vfio-pci</deviceAPI>"
                f"<availableInstances>{available}</availableInstances>"
                "</type>"
                for type_id, (name, available) in dev.mdev_types.items())
                + "</capability>")
        if dev.vpd_serial is not None:
            caps.append("<capability type='vpd'><name>Example adapter</name>"
                        "<fields access='readonly'>"
                        "<change_level>A1</change_level>"
                        f"<serial_number>{escape(dev.vpd_serial)}"
                        "</serial_number></fields></capability>")
        numa = ("" if dev.numa_node is None
                else f"<numa node='{dev.numa_node}'/>")
        driver = (f"<driver><name>{escape(dev.driver)}</name></driver>"
                  if dev.driver else "")
        return (f"  <device><name>{node_device_name(dev.address)}</name>"
                f"<parent>computer</parent>{driver}"
                f"<capability type='pci'><class>0x{dev.class_id}</class>"
                f"<domain>{domain}</domain><bus>{bus}</bus>"
                f"<slot>{slot}</slot><function>{function}</function>"
                f"<product id='0x{dev.product}'/>"
                f"<vendor id='0x{dev.vendor}'/>{''.join(caps)}"
                f"<iommuGroup number='{dev.iommu_group}'>"
                f"{_address_xml(dev.address)}</iommuGroup>{numa}"
                "</capability></device>")


class SysfsBuilder(LibvirtHostView, PciHealthFiles, NvidiaVgpuFiles, PmemFiles):
    """One host, built part by part, in sysfs and in the test driver's host
    file."""

    def reboot(self) -> None:
        """What a host reboot leaves: every mdev gone, every PF without VFs
        (sriov_numvfs 0, its VFs' directories and virtfnN links gone); a
        VF enabled again later gets a new IOMMU group number, as groups are
        numbered at each boot in the order devices are found."""
        for mdev_uuid in list(self._mdevs):
            self.remove_mdev(mdev_uuid)
        for address, pf in sorted(self._pci.items()):
            if pf.total_vfs:
                self.set_num_vfs(address, 0)


def _address_xml(address: str) -> str:
    domain, bus, slot, function = split_address(address)
    return (f"<address domain='0x{domain:04x}' bus='0x{bus:02x}' "
            f"slot='0x{slot:02x}' function='0x{function:x}'/>")


def _mdev_xml(mdev_uuid: str, parent: str, type_id: str) -> str:
    parent_name = node_device_name(parent)
    name = f"mdev_{mdev_uuid.replace('-', '_')}_{parent_name[4:]}"
    return (f"  <device><name>{name}</name><parent>{parent_name}</parent>"
            f"<capability type='mdev'><type id={quoteattr(type_id)}/>"
            f"<uuid>{mdev_uuid}</uuid></capability></device>")


def _scsi_host_xml(host: int, parent: str, wwnn: str, wwpn: str,
                   max_vports: int | None) -> str:
    """A Fibre Channel SCSI host as libvirt's node-device XML describes
    one; ``max_vports``, when given, says it can make NPIV vports."""
    vport_ops = ("" if max_vports is None else
                 f"<capability type='vport_ops'><max_vports>{max_vports}"
                 "</max_vports><vports>1</vports></capability>")
    return (f"  <device><name>scsi_host{host}</name><parent>{parent}</parent>"
            f"<capability type='scsi_host'><host>{host}</host>"
            f"<unique_id>{host}</unique_id><capability type='fc_host'>"
            f"<wwnn>{wwnn}</wwnn><wwpn>{wwpn}</wwpn>"
            f"<fabric_wwn>2001000dec9877c1</fabric_wwn></capability>"
            f"{vport_ops}</capability></device>")


def _npiv_hba_xml(host: int) -> str:
    return "\n".join((
        _scsi_host_xml(host, "computer", f"2000{host:012x}", f"1000{host:012x}", 127),
        _scsi_host_xml(_TEST_DRIVER_VPORT, f"scsi_host{host}", f"2001{host:012x}",
                       f"2002{host:012x}", None)))


def vhba_xml(hba: str, index: int) -> str:
    """The XML that asks libvirt (nodeDeviceCreateXML) for vHBA number
    ``index`` on the NPIV HBA named ``hba``: its parent and its own
    world-wide node and port names."""
    return (f"<device><parent>{escape(hba)}</parent>"
            "<capability type='scsi_host'><capability type='fc_host'>"
            f"<wwnn>2003{index:012x}</wwnn><wwpn>2004{index:012x}</wwpn>"
            "</capability></capability></device>")
