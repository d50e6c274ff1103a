"""The libvirt driver: what the host has, from libvirt first and sysfs second.

libvirt names the devices; sysfs supplements what libvirt's XML omits or
holds stale (SR-IOV counts, driver, available mdev instances, the NVIDIA
vendor-specific layout), and supplies NUMA cells when libvirt reports none.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from urllib.parse import urlsplit

import libvirt

from compute_agent.drivers.base import (
    DeviceKind,
    ForeignGuest,
    GuestHolding,
    GuestSpec,
    GuestState,
    HostInventory,
    Mdev,
    MdevParent,
    MigrationFailure,
    PciDevice,
    PciHealthSignals,
    PciKind,
    SriovFunctions,
)
from compute_agent.drivers.driver import ComputeDriver
from compute_agent.drivers.errors import InvalidHostData, LiveMigrationError, MdevError, MigrationXmlError
from compute_agent.drivers.libvirt import capabilities, nodedev, pmem
from compute_agent.drivers.libvirt.connection import Connection, is_connection_error
from compute_agent.drivers.libvirt.guest_xml import parse_guest
from compute_agent.drivers.libvirt.guests import GuestManager
from compute_agent.drivers.libvirt.host_cpu import HostCpuFeatures
from compute_agent.drivers.libvirt.mdev import MdevSysfs
from compute_agent.drivers.libvirt.migration_xml import rewrite_for_destination
from compute_agent.drivers.libvirt.sriov import write_num_vfs
from compute_agent.drivers.libvirt.sysfs import SysfsReader
from compute_agent.drivers.libvirt.vendor_vfio import VgpuTypeWriter
from compute_agent.drivers.migration import LiveMigrationTarget
from compute_agent.drivers.warnings_once import WarningsOnce

LOG = logging.getLogger(__name__)
_GIB = 1024 ** 3
_DEVICE_FLAGS = (libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_PCI_DEV
                 | libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV)
# What a driver that does not know a listing flag answers (the test driver
# says "unsupported flags" with VIR_ERR_INVALID_ARG).
_FLAG_REFUSED = frozenset({libvirt.VIR_ERR_INVALID_ARG,
                           libvirt.VIR_ERR_NO_SUPPORT})


@dataclass(frozen=True)
class _Cached:
    """A node device's parse result; a device whose XML could not be used
    is cached too, with its warning, so it is not re-read every cycle."""

    device: nodedev.NodeDevice | None
    warning: str | None = None


class LibvirtDriver(ComputeDriver):
    def __init__(self, conf) -> None:
        self._conf = conf
        self._sysfs = SysfsReader(conf.sysfs_root)
        self._conn = Connection(conf.libvirt.connection_uri,
                                on_event=self._on_event)
        self._listeners: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._cache: dict[str, _Cached] = {}
        # address -> the device as sysfs showed it, kept as long as the
        # node-device cache: its fixed files are read once, and only what
        # can change while it stays plugged is read again each cycle.
        self._sysfs_cache: dict[str, PciDevice] = {}
        self._cache_generation = 0
        self._cache_stale = False
        # Whether this connection's driver takes the ACTIVE listing flag;
        # None until tried.
        self._lists_active_only: bool | None = None
        self._warnings_log = WarningsOnce(LOG)
        self._cpu_features = HostCpuFeatures(self._conn)
        self._guests = GuestManager(self._conn, MdevSysfs(conf.sysfs_root),
                                    conf.libvirt.virt_type)
        self._vgpu_types = VgpuTypeWriter(self._sysfs)

    def init_host(self) -> None:
        self._conn.call(lambda conn: conn.getLibVersion())

    def register_change_listener(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def cleanup(self) -> None:
        self._conn.close()

    def get_host_inventory(self) -> HostInventory:
        with self._lock:
            return self._inventory()

    def device_health(self, addresses: Collection[str]
                      ) -> dict[str, PciHealthSignals]:
        # Straight from sysfs: no libvirt call, so a poll never waits on
        # libvirtd nor on a cycle holding the driver's lock.
        return {a: self._sysfs.pci_health(a) for a in addresses}

    # Guests are the GuestManager's business; these only satisfy the
    # driver interface.
    def spawn(self, guest: GuestSpec) -> None:
        self._take_vgpu_types(guest)
        self._guests.spawn(guest)

    def update_guest(self, guest: GuestSpec) -> None:
        self._take_vgpu_types(guest)
        self._guests.update_guest(guest)

    def _take_vgpu_types(self, guest: GuestSpec) -> None:
        """Each vGPU VF of the guest given its type before the guest is
        defined on it (again after a host reboot, which clears them)."""
        for device in guest.devices:
            if DeviceKind(device.kind) is not DeviceKind.VGPU_VF:
                continue
            if not device.detail.mdev_type:
                raise MdevError(f"{guest.instance_uuid}: vGPU VF {device.device_id} "
                                "has no vGPU type recorded")
            self.set_vgpu_type(device.device_id, device.detail.mdev_type)

    def destroy(self, instance_uuid: str) -> None:
        self._guests.destroy(instance_uuid)

    def power_off(self, instance_uuid: str) -> None:
        self._guests.power_off(instance_uuid)

    def list_guests(self) -> dict[str, GuestState]:
        return self._guests.list_guests()

    def list_foreign_guests(self) -> dict[str, ForeignGuest]:
        return self._guests.list_foreign_guests()

    def guest_holdings(self, reread: bool = False) -> dict[str, GuestHolding]:
        return self._guests.guest_holdings(reread)

    def guest_state(self, instance_uuid: str) -> GuestState | None:
        return self._guests.guest_state(instance_uuid)

    def guest_definition(self, instance_uuid: str, live: bool = False,
                         migratable: bool = False) -> str | None:
        return self._guests.guest_xml(instance_uuid, live, migratable)

    def describe_guest(self, instance_uuid: str) -> GuestSpec | None:
        text = self._guests.guest_xml(instance_uuid)
        return None if text is None else parse_guest(text)

    def ensure_mdev(self, mdev_uuid: str, parent: str, type_id: str) -> None:
        self._guests.ensure_mdev(mdev_uuid, parent, type_id)

    def remove_mdev(self, mdev_uuid: str) -> None:
        self._guests.remove_mdev(mdev_uuid)

    def set_vgpu_type(self, vf_address: str, type_id: str) -> None:
        if self._vgpu_types.set(vf_address, type_id):
            self._vgpu_types_changed()

    def clear_vgpu_type(self, vf_address: str, type_id: str) -> None:
        if self._vgpu_types.clear(vf_address, type_id):
            self._vgpu_types_changed()

    def _vgpu_types_changed(self) -> None:
        """A VF took or gave back a type: what its siblings can create
        changed with it, and no event says so. The agent is told, as of a
        device event, so that it reads the lists again now."""
        for listener in list(self._listeners):
            listener()

    def sriov_functions(self, pf_address: str) -> SriovFunctions | None:
        # From sysfs: libvirt learns of new VFs from udev, later.
        return self._sysfs.sriov_functions(pf_address)

    def set_num_vfs(self, pf_address: str, count: int) -> None:
        try:
            write_num_vfs(self._conf.sysfs_root, pf_address, count)
        finally:
            # Whatever the kernel did, the next cycle reads the devices
            # afresh rather than wait for libvirt's events.
            self._cache_stale = True

    def boot_id(self) -> str:
        with open(self._conf.boot_id_file, encoding="ascii") as f:
            return f.read().strip()

    def live_migrate(self, instance_uuid: str, dest_uri: str,
                     target: LiveMigrationTarget) -> None:
        """The running guest's migratable XML (libvirt refuses the plain
        live XML, and XML written afresh, as changed virtual hardware),
        rewritten for the target's devices, is the destination's XML."""
        source = self._guests.guest_xml(instance_uuid, live=True, migratable=True)
        if source is None:
            raise LiveMigrationError(MigrationFailure.NO_RUNNING_GUEST,
                                     f"{instance_uuid} to {dest_uri}: no such guest here")
        try:
            dest_xml = rewrite_for_destination(source, target)
        except MigrationXmlError as e:
            raise LiveMigrationError(MigrationFailure.DEFINITION_REFUSED,
                                     f"{instance_uuid} to {dest_uri}: {e}") from None
        self._guests.live_migrate(instance_uuid, dest_uri, dest_xml)

    def migrating_out(self, instance_uuid: str) -> bool:
        return self._guests.migrating_out(instance_uuid)

    def migration_uri(self) -> str:
        return (self._conf.libvirt.live_migration_uri
                or default_migration_uri(self._conf.libvirt.connection_uri,
                                         self._conf.host))

    def _inventory(self) -> HostInventory:
        warnings: list[str] = []
        caps = self._capabilities(warnings)
        info = self._conn.call(lambda conn: conn.getInfo())
        sysfs_cells, more = self._sysfs.numa_cells(
            caps.base_page_kib if caps and caps.base_page_kib
            else local_base_page_kib())
        warnings += more
        cells = capabilities.merge_cells(caps.cells if caps else (),
                                         sysfs_cells)
        cpus = (frozenset().union(*(cell.cpus for cell in cells))
                or frozenset(range(info[2])))

        devices = self._conn.call(self._node_devices)
        for cached in devices:
            if cached.warning:
                warnings.append(cached.warning)
        parsed = [c.device for c in devices if c.device is not None]
        pci_devices, more = self._pci_devices(parsed)
        warnings += more
        mdev_parents, more = self._mdev_parents(parsed, pci_devices)
        warnings += more
        mdevs, more = self._mdevs(parsed)
        warnings += more
        try:
            namespaces, more = pmem.read_namespaces(
                self._sysfs, self._conf.pmem.ndctl_json)
            warnings += more
        except InvalidHostData as exc:
            namespaces = []
            warnings.append(str(exc))

        warnings = list(dict.fromkeys(warnings))
        self._warnings_log.log_cycle(warnings)
        return HostInventory(
            cpus=cpus, memory_mb=info[1], disk_gb=self._disk_gb(),
            uuid=caps.uuid if caps else None, numa_cells=cells,
            pci_devices=tuple(pci_devices), mdev_parents=mdev_parents,
            mdevs=mdevs, pmem_namespaces=tuple(namespaces),
            cpu_features=self._cpu_features.features(caps) if caps else frozenset(),
            warnings=tuple(warnings))

    def _capabilities(self, warnings: list[str]
                      ) -> capabilities.Capabilities | None:
        text = self._conn.call(lambda conn: conn.getCapabilities())
        try:
            caps = capabilities.parse_capabilities(text)
        except InvalidHostData as exc:
            warnings.append(str(exc))
            return None
        warnings.extend(caps.warnings)
        return caps

    def _node_devices(self, conn: libvirt.virConnect) -> list[_Cached]:
        """Runs inside Connection.call, so a reconnect replays it whole on
        the new connection, whose devices the cache must not assume."""
        generation = self._conn.generation
        if self._cache_stale or self._cache_generation != generation:
            self._cache_stale = False
            self._cache_generation = generation
            self._cache.clear()
            self._sysfs_cache.clear()
            self._lists_active_only = None
        listed: dict[str, _Cached] = {}
        for dev in self._active_devices(conn):
            name = dev.name()
            if name not in self._cache:
                try:
                    text = dev.XMLDesc(0)
                except libvirt.libvirtError as exc:
                    if is_connection_error(exc):
                        raise
                    # Gone between listing and reading: not cached, so it
                    # is looked at again next cycle.
                    listed[name] = _Cached(None, f"{name}: xml: {exc}")
                    continue
                found, warnings = nodedev.parse_node_devices([(name, text)])
                self._cache[name] = _Cached(
                    found[0] if found else None,
                    warnings[0] if warnings else None)
            listed[name] = self._cache[name]
        for name in set(self._cache) - set(listed):
            del self._cache[name]
        return list(listed.values())

    def _active_devices(self, conn: libvirt.virConnect
                        ) -> list[libvirt.virNodeDevice]:
        """The devices that exist now. libvirt >= 7.3 also lists mdevs that
        are defined (mdevctl) but not started, which hold no vGPU, unless
        asked for active ones only. A driver that does not know that flag
        (the test driver, libvirt < 7.3) defines no such mdevs, so its
        whole list is active."""
        if self._lists_active_only is not False:
            try:
                devices = conn.listAllDevices(
                    _DEVICE_FLAGS
                    | libvirt.VIR_CONNECT_LIST_NODE_DEVICES_ACTIVE)
                self._lists_active_only = True
                return devices
            except libvirt.libvirtError as exc:
                if (is_connection_error(exc)
                        or exc.get_error_code() not in _FLAG_REFUSED):
                    raise
                self._lists_active_only = False
        return conn.listAllDevices(_DEVICE_FLAGS)

    def _pci_devices(self, parsed: list[nodedev.NodeDevice]
                     ) -> tuple[list[PciDevice], list[str]]:
        from_libvirt = {d.pci.address: d.pci for d in parsed if d.pci}
        cache = self._sysfs_cache
        for address in set(cache) - set(from_libvirt):
            del cache[address]
        from_sysfs, warnings = self._sysfs.pci_devices(
            [a for a in from_libvirt if a not in cache])
        for address, known in list(cache.items()):
            try:
                fresh = self._sysfs.pci_refresh(known)
            except InvalidHostData as exc:
                fresh = None
                warnings.append(str(exc))
            if fresh is None:
                del cache[address]  # read again whole next cycle
            else:
                from_sysfs[address] = fresh
        cache.update(from_sysfs)
        merged = [_supplement(device, from_sysfs.get(address))
                  for address, device in sorted(from_libvirt.items())]
        return merged, warnings

    def _mdev_parents(self, parsed: list[nodedev.NodeDevice],
                      pci_devices: list[PciDevice]
                      ) -> tuple[tuple[MdevParent, ...], list[str]]:
        from_libvirt = {d.mdev_parent.address: d.mdev_parent.types
                        for d in parsed if d.mdev_parent}
        from_sysfs, warnings = self._sysfs.mdev_types()
        parents = []
        for pci in pci_devices:
            types = {t.id: t for t in from_libvirt.get(pci.address, ())}
            for fresh in from_sysfs.get(pci.address, ()):
                old = types.get(fresh.id)
                types[fresh.id] = fresh if old is None else replace(
                    fresh, name=fresh.name or old.name)
            # A vendor-VFIO VF that can create nothing now is still one.
            vendor_vfio = self._sysfs.vendor_vfio(pci.address)
            if types or vendor_vfio:
                parents.append(MdevParent(
                    pci.address, pci.numa_node,
                    tuple(types[i] for i in sorted(types)),
                    pci.vendor_id, pci.product_id, vendor_vfio=vendor_vfio))
        return tuple(parents), warnings

    def _mdevs(self, parsed: list[nodedev.NodeDevice]
               ) -> tuple[tuple[Mdev, ...], list[str]]:
        mdevs = {d.mdev.uuid: d.mdev for d in parsed if d.mdev}
        from_sysfs, warnings = self._sysfs.mdevs()
        mdevs.update((m.uuid, m) for m in from_sysfs)
        return tuple(mdevs[u] for u in sorted(mdevs)), warnings

    def _disk_gb(self) -> int:
        # Before the first instance the directory may not exist yet; its
        # nearest existing parent is on the file system it will be on.
        path = os.path.abspath(self._conf.libvirt.instances_path)
        while not os.path.exists(path) and os.path.dirname(path) != path:
            path = os.path.dirname(path)
        stat = os.statvfs(path)
        return stat.f_blocks * stat.f_frsize // _GIB

    def _on_event(self, kind: str, name: str, event: int) -> None:
        if kind != "nodedev":
            LOG.debug("libvirt %s event %s for %s", kind, event, name)
            if kind == "domain":
                # Defined, started, stopped or undefined, maybe by someone
                # else: what it holds is read again.
                self._guests.forget(name=name)
            return
        LOG.debug("node device %s event %s: dropping the device cache",
                  name, event)
        self._cache_stale = True
        for listener in list(self._listeners):
            listener()


def default_migration_uri(connection_uri: str, host: str) -> str:
    """Where another host's libvirtd reaches this one: a URI that names a
    host already does; a local one ('qemu:///system', over a UNIX socket)
    becomes its driver over TCP at ``host``, nova's default scheme."""
    parts = urlsplit(connection_uri)
    if parts.hostname:
        return connection_uri
    driver = parts.scheme.split("+", 1)[0]
    return f"{driver}+tcp://{host}{parts.path or '/system'}"


def local_base_page_kib() -> int:
    """The base page size of the kernel we run on, whose sysfs we read."""
    return os.sysconf("SC_PAGE_SIZE") // 1024


def _supplement(device: PciDevice, sysfs: PciDevice | None) -> PciDevice:
    """libvirt's fields win; sysfs fills the gaps and, for a PF, gives the
    current VF counts (the cached XML may predate a change to them)."""
    if sysfs is None:
        return device
    sriov = sysfs.total_vfs > 0
    return replace(
        device,
        kind=sysfs.kind if device.kind is PciKind.PCI else device.kind,
        numa_node=(device.numa_node if device.numa_node is not None
                   else sysfs.numa_node),
        parent_address=device.parent_address or sysfs.parent_address,
        class_id=device.class_id or sysfs.class_id,
        iommu_group=(device.iommu_group if device.iommu_group is not None
                     else sysfs.iommu_group),
        driver=device.driver or sysfs.driver,
        total_vfs=sysfs.total_vfs if sriov else device.total_vfs,
        num_vfs=sysfs.num_vfs if sriov else device.num_vfs)
