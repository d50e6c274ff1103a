"""Reading the host's devices from a sysfs tree under a configurable root.

Every method returns what it could read plus warnings: a device whose files
are missing, vanish mid-read or hold junk is left out with one warning
naming the device and the file, and the others are kept.
"""
from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TypeVar

from compute_agent.drivers.base import (
    Mdev,
    MdevType,
    NetLink,
    NumaCell,
    PciDevice,
    PciHealthSignals,
    PciKind,
    SriovFunctions,
)
from compute_agent.drivers.errors import InvalidHostData
from compute_agent.drivers.host_data import parse_hex_id, parse_int, parse_numa_node, parse_pci_address
from compute_agent.drivers.libvirt.capabilities import parse_sysfs_numa_node

_NODE_DIR = re.compile(r"^node(\d+)$")
_HUGEPAGES_DIR = re.compile(r"^hugepages-(\d+)kB$")
_VIRTFN_LINK = re.compile(r"^virtfn(\d+)$")
_VGPU_LINE = re.compile(r"^\s*(\d+)\s*:\s*(.*?)\s*$")
_NVIDIA_TYPE_PREFIX = "nvidia-"
# A device-dax instance: daxN.K (also how an nd_dax holder is named).
_DAX_DEVICE = re.compile(r"^dax\d+\.\d+$")
# The namespace mode the kernel writes for a namespace claimed by an nd_dax
# device (ndctl's devdax), and the driver that gives a dax device its
# character device (kmem instead onlines it as system RAM).
KERNEL_DAX_MODE = "dax"
_DEVICE_DAX_DRIVER = "device_dax"
# The AER statistics files (Documentation/ABI/testing/
# sysfs-bus-pci-devices-aer_stats): one "<error name> <count>" line per
# error, then the total of the error messages on a line of its own.
AER_TOTALS = {"aer_dev_fatal": "TOTAL_ERR_FATAL",
              "aer_dev_nonfatal": "TOTAL_ERR_NONFATAL",
              "aer_dev_correctable": "TOTAL_ERR_COR"}
# IFF_UP in a net interface's ``flags``: administratively up.
_IFF_UP = 0x1
# What one of a device's health files parses to.
_Parsed = TypeVar("_Parsed")


def parse_aer_total(text: str, device: str, file: str) -> int:
    """The TOTAL_ERR_* count of one AER statistics file."""
    key = AER_TOTALS[file]
    for line in text.splitlines():
        name, _, count = line.strip().rpartition(" ")
        if name.strip() == key:
            return parse_int(count, device, f"{file} {key}")
    raise InvalidHostData(device, file, f"no {key} line", text)


def nvidia_type_id(number: int) -> str:
    """The name the agent gives a vGPU type of NVIDIA's vendor-specific
    layout, as nova names mdev types: 557 -> "nvidia-557"."""
    return f"{_NVIDIA_TYPE_PREFIX}{number}"


def nvidia_type_number(type_id: str) -> int | None:
    """The number current_vgpu_type takes for a type id: "nvidia-557" ->
    557; None for a name of another form."""
    number = type_id.removeprefix(_NVIDIA_TYPE_PREFIX)
    if type_id == number or not number.isdigit() or number.startswith("0"):
        return None
    return int(number)


def parse_creatable_vgpu_types(table: str, address: str) -> dict[int, str]:
    """creatable_vgpu_types: a header line ("ID    : vGPU Name"), then one
    "<ID> : <name>" line per type the VF can create now."""
    names: dict[int, str] = {}
    for line in table.splitlines():
        match = _VGPU_LINE.match(line)
        if match:
            names[int(match.group(1))] = match.group(2)
        elif line.strip() and not line.lstrip().startswith("ID"):
            raise InvalidHostData(address, "nvidia/creatable_vgpu_types",
                                  "not an 'ID : name' line", line)
    return names


class SysfsFiles:
    """A sysfs tree's files under its root, read so that a file missing,
    vanished or unreadable raises InvalidHostData naming the device."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    @staticmethod
    def _read(path: str, device: str, field: str) -> str:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read().strip()
        except OSError as exc:
            raise InvalidHostData(device, field, exc.strerror or str(exc),
                                  path) from None

    @classmethod
    def _read_optional(cls, path: str, device: str, field: str
                       ) -> str | None:
        return (cls._read(path, device, field) if os.path.lexists(path)
                else None)

    @staticmethod
    def _listdir(path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []

    @staticmethod
    def _link_name(path: str) -> str | None:
        """The last component of a symlink's target: how sysfs names a
        device's driver, IOMMU group and PF."""
        try:
            return os.path.basename(os.readlink(path).rstrip("/"))
        except OSError:
            return None


class NumaReader(SysfsFiles):
    """The NUMA nodes: their CPUs, memory and huge pages."""

    def numa_cells(self, base_page_kib: int
                   ) -> tuple[list[NumaCell], list[str]]:
        """``base_page_kib``: the kernel's base page size, which the node
        files do not say."""
        base = self._path("devices", "system", "node")
        cells, warnings = [], []
        for entry in self._listdir(base):
            match = _NODE_DIR.match(entry)
            if not match:
                continue
            node_dir = os.path.join(base, entry)
            try:
                hugepages = {}
                for size_dir in self._listdir(os.path.join(node_dir,
                                                           "hugepages")):
                    size = _HUGEPAGES_DIR.match(size_dir)
                    if size:
                        field = f"hugepages/{size_dir}/nr_hugepages"
                        hugepages[int(size.group(1))] = self._read(
                            os.path.join(node_dir, field), entry, field)
                cells.append(parse_sysfs_numa_node(
                    int(match.group(1)),
                    self._read(os.path.join(node_dir, "cpulist"), entry,
                               "cpulist"),
                    self._read(os.path.join(node_dir, "meminfo"), entry,
                               "meminfo"),
                    hugepages, base_page_kib))
            except InvalidHostData as exc:
                warnings.append(str(exc))
        return cells, warnings


class PciReader(SysfsFiles):
    """PCI devices, SR-IOV PFs and their VFs."""

    def pci_addresses(self) -> list[str]:
        return self._listdir(self._path("bus", "pci", "devices"))

    def pci_device(self, address: str) -> PciDevice | None:
        """One device's files, or None when sysfs has no such device."""
        device_dir = self._path("bus", "pci", "devices", address)
        if not os.path.isdir(device_dir):
            return None
        address = parse_pci_address(address, address, "address")

        def read(name: str) -> str:
            return self._read(os.path.join(device_dir, name), address, name)

        def optional(name: str) -> str | None:
            return self._read_optional(os.path.join(device_dir, name),
                                       address, name)

        vendor = parse_hex_id(read("vendor"), address, "vendor")
        product = parse_hex_id(read("device"), address, "device")
        class_text = optional("class")
        class_id = None
        if class_text is not None:
            class_value = parse_int(class_text, address, "class", base=16,
                                    maximum=0xFFFFFF)
            class_id = f"{class_value:06x}"
        numa_text = optional("numa_node")
        numa_node = (None if numa_text is None
                     else parse_numa_node(numa_text, address))
        total_vfs = parse_int(optional("sriov_totalvfs") or "0", address,
                              "sriov_totalvfs")
        num_vfs = parse_int(optional("sriov_numvfs") or "0", address,
                            "sriov_numvfs")
        group = self._link_name(os.path.join(device_dir, "iommu_group"))
        iommu_group = (None if group is None
                       else parse_int(group, address, "iommu_group"))
        physfn = self._link_name(os.path.join(device_dir, "physfn"))
        parent = (None if physfn is None
                  else parse_pci_address(physfn, address, "physfn"))
        has_virtfn = any(e.startswith("virtfn")
                         for e in self._listdir(device_dir))
        kind = (PciKind.VF if parent else
                PciKind.PF if total_vfs > 0 or has_virtfn else PciKind.PCI)
        return PciDevice(
            address=address, vendor_id=vendor, product_id=product,
            kind=kind, numa_node=numa_node, parent_address=parent,
            class_id=class_id, iommu_group=iommu_group,
            driver=self._link_name(os.path.join(device_dir, "driver")),
            total_vfs=total_vfs, num_vfs=num_vfs)

    def sriov_functions(self, address: str) -> SriovFunctions | None:
        """The PF at ``address`` and the VFs its ``virtfnN`` links lead to
        (a link whose VF is gone is skipped: that VF does not exist), by
        index. None when sysfs has no such device. Raises InvalidHostData
        for a file that cannot be read."""
        pf = self.pci_device(address)
        if pf is None:
            return None
        device_dir = self._path("bus", "pci", "devices", address)
        links = sorted((int(m.group(1)), entry) for entry in self._listdir(device_dir)
                       if (m := _VIRTFN_LINK.match(entry)))
        vfs = []
        for _, entry in links:
            if not os.path.isdir(os.path.join(device_dir, entry)):
                continue
            name = self._link_name(os.path.join(device_dir, entry))
            vf = None if name is None else self.pci_device(name)
            if vf is not None:
                vfs.append(vf)
        return SriovFunctions(pf, tuple(vfs))

    def pci_refresh(self, device: PciDevice) -> PciDevice | None:
        """A device read before, with the fields that change while it stays
        plugged read again: its driver binding and, on a PF, its VF counts.
        None when sysfs has no such device any more."""
        device_dir = self._path("bus", "pci", "devices", device.address)
        if not os.path.isdir(device_dir):
            return None
        driver = self._link_name(os.path.join(device_dir, "driver"))
        if device.kind is not PciKind.PF:
            return replace(device, driver=driver)
        counts = [parse_int(self._read_optional(
            os.path.join(device_dir, name), device.address, name) or "0",
            device.address, name)
            for name in ("sriov_totalvfs", "sriov_numvfs")]
        return replace(device, driver=driver, total_vfs=counts[0],
                       num_vfs=counts[1])

    def pci_devices(self, addresses: Iterable[str] | None = None
                    ) -> tuple[dict[str, PciDevice], list[str]]:
        found, warnings = {}, []
        for address in (self.pci_addresses() if addresses is None
                        else addresses):
            try:
                device = self.pci_device(address)
            except InvalidHostData as exc:
                warnings.append(str(exc))
                continue
            if device is not None:
                found[device.address] = device
        return found, warnings


class PciHealthReader(SysfsFiles):
    """What a failing PCI device's files show: config space, AER counts,
    VFs gone, and its network links."""

    def pci_health(self, address: str) -> PciHealthSignals:
        """A device's health signals; never raises: a file that exists but
        cannot be read or parsed is named in ``unreadable``."""
        device_dir = self._path("bus", "pci", "devices", address)
        if not os.path.isdir(device_dir):
            return PciHealthSignals(address, present=False)
        unreadable: list[str] = []

        def field(name: str, parse: Callable[[str], _Parsed]) -> _Parsed | None:
            """The parsed file, None when there is no such file."""
            path = os.path.join(device_dir, name)
            try:
                text = self._read_optional(path, address, name)
                return None if text is None else parse(text)
            except InvalidHostData as exc:
                unreadable.append(f"{name}: {exc.reason}")
                return None

        vendor = field("vendor", lambda t: parse_hex_id(t, address, "vendor"))
        aer = {name: field(name, functools.partial(parse_aer_total, device=address, file=name))
               for name in AER_TOTALS}
        numvfs = field("sriov_numvfs",
                       lambda t: parse_int(t, address, "sriov_numvfs"))
        present_vfs = None if numvfs is None else sum(
            1 for e in self._listdir(device_dir)
            if e.startswith("virtfn")
            and os.path.isdir(os.path.join(device_dir, e)))
        return PciHealthSignals(
            address, True, vendor,
            self._config_vendor(os.path.join(device_dir, "config"), unreadable),
            aer["aer_dev_fatal"], aer["aer_dev_nonfatal"],
            aer["aer_dev_correctable"], numvfs, present_vfs,
            self._net_links(os.path.join(device_dir, "net"), unreadable),
            tuple(unreadable))

    @staticmethod
    def _config_vendor(path: str, unreadable: list[str]) -> str | None:
        """The vendor id in config space (little-endian at offset 0), read
        from the device: all ones when it no longer answers."""
        try:
            with open(path, "rb") as f:
                head = f.read(2)
        except FileNotFoundError:
            return None
        except OSError as exc:
            unreadable.append(f"config: {exc.strerror or exc}")
            return None
        if len(head) < 2:
            unreadable.append(f"config: {len(head)} bytes, not a config space")
            return None
        return f"{int.from_bytes(head, 'little'):04x}"

    def _net_links(self, net_dir: str, unreadable: list[str]
                   ) -> tuple[NetLink, ...]:
        links = []
        for name in self._listdir(net_dir):
            iface = os.path.join(net_dir, name)
            try:
                operstate = self._read(os.path.join(iface, "operstate"),
                                       name, "operstate")
            except InvalidHostData as exc:
                unreadable.append(f"net/{name}/operstate: {exc.reason}")
                continue
            links.append(NetLink(name, operstate,
                                 self._net_flag(os.path.join(iface, "carrier")),
                                 self._admin_up(os.path.join(iface, "flags"))))
        return tuple(links)

    @staticmethod
    def _net_flag(path: str) -> bool | None:
        """``carrier``: the kernel refuses the read (EINVAL) while the
        interface is administratively down: unknown, then."""
        try:
            with open(path, encoding="ascii") as f:
                return {"1": True, "0": False}.get(f.read().strip())
        except (OSError, ValueError):
            return None

    @staticmethod
    def _admin_up(path: str) -> bool | None:
        try:
            with open(path, encoding="ascii") as f:
                return bool(int(f.read().strip(), 16) & _IFF_UP)
        except (OSError, ValueError):
            return None


class MdevReader(PciReader):
    """Mediated devices and the types their parents offer, on the mdev bus
    and in NVIDIA's vendor-specific VFIO layout."""

    def mdev_types(self) -> tuple[dict[str, tuple[MdevType, ...]],
                                  list[str]]:
        """Parent address -> the types it offers, from both the mdev bus
        and NVIDIA's vendor-specific VFIO layout."""
        parents: dict[str, tuple[MdevType, ...]] = {}
        warnings: list[str] = []
        base = self._path("class", "mdev_bus")
        for address in self._listdir(base):
            try:
                canonical = parse_pci_address(address, address, "address")
            except InvalidHostData:
                continue  # a non-PCI parent (s390 ccw/ap): not ours
            types_dir = os.path.join(base, address, "mdev_supported_types")
            types = []
            for type_id in self._listdir(types_dir):
                try:
                    types.append(self._mdev_type(
                        os.path.join(types_dir, type_id), canonical, type_id))
                except InvalidHostData as exc:
                    warnings.append(str(exc))
            parents[canonical] = tuple(types)
        for address in self.pci_addresses():
            nvidia_dir = self._path("bus", "pci", "devices", address,
                                    "nvidia")
            if not os.path.isdir(nvidia_dir):
                continue
            try:
                canonical = parse_pci_address(address, address, "address")
                parents[canonical] = self._nvidia_types(nvidia_dir, canonical)
            except InvalidHostData as exc:
                warnings.append(str(exc))
        return parents, warnings

    def _mdev_type(self, type_dir: str, address: str, type_id: str
                   ) -> MdevType:
        field = f"mdev_supported_types/{type_id}"
        # A type can vanish between listdir and read (the driver reloaded):
        # reading its files then fails, and the type is skipped.
        available = parse_int(
            self._read(os.path.join(type_dir, "available_instances"),
                       address, f"{field}/available_instances"),
            address, f"{field}/available_instances")
        name = self._read_optional(os.path.join(type_dir, "name"), address,
                                   f"{field}/name")
        api = self._read_optional(os.path.join(type_dir, "device_api"),
                                  address, f"{field}/device_api")
        return MdevType(id=type_id, available_instances=available,
                        name=name or None, device_api=api or "vfio-pci")

    def _nvidia_types(self, nvidia_dir: str, address: str
                      ) -> tuple[MdevType, ...]:
        """A VF in the vendor-specific layout hosts at most one vGPU: it
        offers each creatable type once while current_vgpu_type is 0."""
        names = parse_creatable_vgpu_types(
            self._read(os.path.join(nvidia_dir, "creatable_vgpu_types"),
                       address, "nvidia/creatable_vgpu_types"), address)
        current = self.current_vgpu_type(address)
        if current:
            return (MdevType(nvidia_type_id(current), 0, names.get(current)),)
        return tuple(MdevType(nvidia_type_id(type_id), 1, name)
                     for type_id, name in sorted(names.items()))

    def nvidia_dir(self, address: str) -> str:
        """A VF's directory of NVIDIA's vendor-specific VFIO files."""
        return self._path("bus", "pci", "devices", address, "nvidia")

    def vendor_vfio(self, address: str) -> bool:
        """Whether the device is a VF in NVIDIA's vendor-specific layout."""
        return os.path.isdir(self.nvidia_dir(address))

    def current_vgpu_type(self, address: str) -> int:
        """The number in a VF's current_vgpu_type: 0 when it has none."""
        field = "nvidia/current_vgpu_type"
        return parse_int(self._read(os.path.join(self.nvidia_dir(address),
                                                 "current_vgpu_type"),
                                    address, field), address, field)

    def creatable_vgpu_types(self, address: str) -> dict[int, str]:
        """The types a VF can take now, by number, as its driver lists
        them at this moment."""
        return parse_creatable_vgpu_types(self._read(
            os.path.join(self.nvidia_dir(address), "creatable_vgpu_types"),
            address, "nvidia/creatable_vgpu_types"), address)

    def mdevs(self) -> tuple[list[Mdev], list[str]]:
        base = self._path("bus", "mdev", "devices")
        found, warnings = [], []
        for name in self._listdir(base):
            type_link = os.path.join(base, name, "mdev_type")
            # .../<parent>/mdev_supported_types/<type>
            type_dir = os.path.realpath(type_link)
            parent = os.path.basename(os.path.dirname(os.path.dirname(
                type_dir)))
            try:
                if not os.path.isdir(type_dir):
                    raise InvalidHostData(name, "mdev_type",
                                          "missing or dangling", type_link)
                found.append(Mdev(
                    uuid=name.lower(), type_id=os.path.basename(type_dir),
                    parent_address=parse_pci_address(parent, name,
                                                     "mdev_type parent")))
            except InvalidHostData as exc:
                warnings.append(str(exc))
        return found, warnings


class NvdimmReader(SysfsFiles):
    """Persistent-memory namespaces and their dax devices."""

    def nd_namespaces(self) -> tuple[list[dict[str, str | None]],
                                     list[str]]:
        """Each namespace under ndctl's key names, still as text, except
        ``mode``, which stays the kernel's word (safe, memory, dax, raw);
        pmem.py validates them the same way as ndctl's JSON.

        For a dax namespace, ``chardev`` and ``size`` are its dax device's:
        the namespace's own size is the raw one, metadata included."""
        base = self._path("bus", "nd", "devices")
        records, warnings = [], []
        for name in self._listdir(base):
            if not name.startswith("namespace"):
                continue
            try:
                records.append(self._nd_namespace(os.path.join(base, name),
                                                  name))
            except InvalidHostData as exc:
                warnings.append(str(exc))
        return records, warnings

    def _nd_namespace(self, ns_dir: str, name: str
                      ) -> dict[str, str | None]:
        record: dict[str, str | None] = {
            key: self._read_optional(os.path.join(ns_dir, file), name, file)
            for key, file in (("size", "size"), ("mode", "mode"),
                              ("uuid", "uuid"), ("name", "alt_name"),
                              ("numa_node", "numa_node"))}
        record["dev"] = name
        record["chardev"] = None
        if record["mode"] == KERNEL_DAX_MODE:
            chardev, size = self._dax_device(ns_dir, name)
            record.update(chardev=chardev, size=size)
        return record

    def _dax_device(self, ns_dir: str, name: str) -> tuple[str, str]:
        """The character device and usable size of a dax namespace: its
        ``holder`` is an nd_dax device beside it in the region, whose one
        child daxN.K is the dax device (/dev/daxN.K)."""
        holder = self._read(os.path.join(ns_dir, "holder"), name, "holder")
        if not _DAX_DEVICE.match(holder):
            raise InvalidHostData(name, "holder", "not an nd_dax device "
                                  "daxN.M, though the mode is dax", holder)
        holder_dir = os.path.join(os.path.dirname(os.path.realpath(ns_dir)),
                                  holder)
        devices = [e for e in self._listdir(holder_dir)
                   if _DAX_DEVICE.match(e)
                   and os.path.isdir(os.path.join(holder_dir, e))]
        if len(devices) != 1:
            raise InvalidHostData(
                name, "holder", f"{holder} has {len(devices)} dax devices, "
                "not one", holder_dir)
        device_dir = os.path.join(holder_dir, devices[0])
        field = f"{holder}/{devices[0]}"
        driver = self._link_name(os.path.join(device_dir, "driver"))
        if driver != _DEVICE_DAX_DRIVER:
            raise InvalidHostData(
                name, f"{field}/driver", "not bound to device_dax, so there "
                "is no character device", driver)
        # Checked here, so that a bad value is blamed on this file.
        size = parse_int(self._read(os.path.join(device_dir, "size"), name,
                                    f"{field}/size"), name, f"{field}/size")
        return devices[0], str(size)


class SysfsReader(NumaReader, PciHealthReader, MdevReader, NvdimmReader):
    """Every reader of one sysfs tree, as the driver reads the host."""
