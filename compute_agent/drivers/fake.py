"""A complete in-memory driver for unit tests and for our users' own tests.

The host is described by a dict, or a JSON or YAML file of the same shape::

    disk_gb: 100
    numa_cells:
      - {id: 0, cpus: "0-7", memory_mb: 16384}
    pci_devices:
      - address: "0000:81:00.0"
        vendor_id: "8086"
        product_id: "1572"
        numa_node: 0
        vfs: {count: 8, product_id: "154c"}   # makes it a PF with 8 VFs
    gpus:
      - address: "0000:84:00.0"
        numa_node: 1
        mdev_types: {nvidia-35: {available_instances: 16}}
        mdevs: [{uuid: "…", type: nvidia-35}]
      - address: "0000:41:00.4"          # a VF in NVIDIA's vendor-specific
        vendor_vfio: true                # VFIO layout: it takes one of its
        mdev_types: {nvidia-557: {available_instances: 1}}   # types whole
    pmem_namespaces:
      - {name: ns0, size_bytes: 4294967296, numa_node: 0}

``cpus`` and ``memory_mb`` at the top level default to the cells' sums. A
test changes the host with ``set_host``, which notifies the agent as a real
driver's device events would.

With a ``state_file`` the hypervisor's state (guests, created mdevs) lives
in that file rather than in the process: guests outlive the agent, as a real
hypervisor's do, for tests that kill it. Every call reads the file and every
change rewrites it atomically (write, fsync, rename, fsync the directory)
under an flock, so several processes can share it: a live migration from
another process reaches it at ``fake-file://<path>``.
"""
from __future__ import annotations

import fcntl
import json
import os
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from compute_agent.common.cpuset import parse_cpu_set
from compute_agent.common.pci_address import canonical_address
from compute_agent.drivers.base import (
    DeviceDetail,
    DeviceKind,
    ForeignGuest,
    GuestDevice,
    GuestHolding,
    GuestSpec,
    GuestState,
    HostInventory,
    Mdev,
    MdevParent,
    MdevType,
    MigrationFailure,
    NumaCell,
    PciDevice,
    PciHealthSignals,
    PciKind,
    PmemNamespace,
    SriovFunctions,
    device_resources,
)
from compute_agent.drivers.driver import ComputeDriver
from compute_agent.drivers.errors import (
    InvalidFakeHost,
    InvalidMigrationTarget,
    LiveMigrationError,
    MdevError,
    SriovError,
)
from compute_agent.drivers.fake_sysfs import vf_address
from compute_agent.drivers.migration import LiveMigrationTarget, moved_guest


def _get(d: dict, key: str, where: str, kind=None, default: Any = ...):
    if not isinstance(d, dict):
        raise InvalidFakeHost(f"{where}: must be a mapping (value: {d!r})")
    if key not in d:
        if default is ...:
            raise InvalidFakeHost(f"{where}.{key}: missing")
        return default
    value = d[key]
    optional_null = value is None and default is not ...
    wrong_type = kind is not None and (not isinstance(value, kind)
                                       or (kind is int and isinstance(value, bool)))
    if wrong_type and not optional_null:
        raise InvalidFakeHost(f"{where}.{key}: expected {getattr(kind, '__name__', kind)} "
                              f"(value: {value!r})")
    return value


def _cpus(value, where: str) -> frozenset[int]:
    if isinstance(value, list):
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                   for c in value):
            raise InvalidFakeHost(f"{where}: CPU numbers must be whole numbers "
                                  f"(value: {value!r})")
        return frozenset(value)
    try:
        return parse_cpu_set(str(value), allow_exclusions=False)
    except ValueError as e:
        raise InvalidFakeHost(f"{where}: {e}") from None


def _address(entry: dict, where: str) -> str:
    address = _get(entry, "address", where, str)
    try:
        return canonical_address(address)
    except ValueError:
        raise InvalidFakeHost(f"{where}.address: expected dddd:bb:ss.f (a "
                              "domain of 4 to 8 hex digits) "
                              f"(value: {address!r})") from None


def _hex4(value, where: str) -> str:
    text = str(value).lower().removeprefix("0x")
    if len(text) > 4 or not all(c in "0123456789abcdef" for c in text) or not text:
        raise InvalidFakeHost(f"{where}: must be up to four hex digits (value: {value!r})")
    return text.rjust(4, "0")


def _numa(entry: dict, where: str) -> int | None:
    """-1 is how sysfs says "no NUMA affinity"; the fake accepts it too."""
    node = _get(entry, "numa_node", where, int, None)
    return None if node == -1 else node


def _pci(entry: dict, where: str) -> list[PciDevice]:
    address = _address(entry, where)
    vendor = _hex4(_get(entry, "vendor_id", where), f"{where}.vendor_id")
    product = _hex4(_get(entry, "product_id", where), f"{where}.product_id")
    numa = _numa(entry, where)
    vfs = _get(entry, "vfs", where, dict, None)
    if vfs is None:
        return [PciDevice(address, vendor, product, PciKind.PCI, numa)]
    count = _get(vfs, "count", f"{where}.vfs", int)
    vf_product = _hex4(_get(vfs, "product_id", f"{where}.vfs"), f"{where}.vfs.product_id")
    devices = [PciDevice(address, vendor, product, PciKind.PF, numa,
                         total_vfs=max(count, _get(vfs, "total", f"{where}.vfs", int, 0)),
                         num_vfs=count)]
    devices += [PciDevice(vf_address(address, i), vendor, vf_product, PciKind.VF,
                          numa, parent_address=address) for i in range(count)]
    return devices


def _gpu(entry: dict, where: str) -> tuple[MdevParent, list[Mdev]]:
    address = _address(entry, where)
    types = []
    for type_id, t in _get(entry, "mdev_types", where, dict).items():
        tw = f"{where}.mdev_types.{type_id}"
        types.append(MdevType(type_id, _get(t, "available_instances", tw, int),
                              _get(t, "name", tw, str, None),
                              _get(t, "device_api", tw, str, "vfio-pci")))
    parent = MdevParent(address, _numa(entry, where),
                        tuple(types),
                        _hex4(_get(entry, "vendor_id", where, default="10de"),
                              f"{where}.vendor_id"),
                        _hex4(_get(entry, "product_id", where, default="1eb8"),
                              f"{where}.product_id"),
                        vendor_vfio=_get(entry, "vendor_vfio", where, bool, False))
    mdevs = [Mdev(_get(m, "uuid", f"{where}.mdevs[{i}]", str),
                  _get(m, "type", f"{where}.mdevs[{i}]", str), address)
             for i, m in enumerate(_get(entry, "mdevs", where, list, []))]
    return parent, mdevs


def host_from_dict(data: dict) -> HostInventory:
    """Raises InvalidFakeHost naming the field that is wrong."""
    cells = tuple(
        NumaCell(_get(c, "id", f"numa_cells[{i}]", int),
                 _cpus(_get(c, "cpus", f"numa_cells[{i}]"), f"numa_cells[{i}].cpus"),
                 _get(c, "memory_mb", f"numa_cells[{i}]", int))
        for i, c in enumerate(_get(data, "numa_cells", "host", list, [])))
    pci = [d for i, e in enumerate(_get(data, "pci_devices", "host", list, []))
           for d in _pci(e, f"pci_devices[{i}]")]
    gpus = [_gpu(e, f"gpus[{i}]")
            for i, e in enumerate(_get(data, "gpus", "host", list, []))]
    pmem = tuple(
        PmemNamespace(_get(n, "name", f"pmem_namespaces[{i}]", str),
                      _get(n, "size_bytes", f"pmem_namespaces[{i}]", int),
                      _numa(n, f"pmem_namespaces[{i}]"),
                      dev=_get(n, "dev", f"pmem_namespaces[{i}]", str, None))
        for i, n in enumerate(_get(data, "pmem_namespaces", "host", list, [])))
    cpus = data.get("cpus")
    return HostInventory(
        cpus=(_cpus(cpus, "cpus") if cpus is not None
              else frozenset().union(*(c.cpus for c in cells))),
        memory_mb=_get(data, "memory_mb", "host", int, None)
        or sum(c.memory_mb for c in cells),
        disk_gb=_get(data, "disk_gb", "host", int, 0),
        uuid=_get(data, "uuid", "host", str, None),
        numa_cells=cells,
        pci_devices=tuple(pci),
        mdev_parents=tuple(p for p, _ in gpus),
        mdevs=tuple(m for _, ms in gpus for m in ms),
        pmem_namespaces=pmem,
        cpu_features=_cpu_features(_get(data, "cpu_features", "host", list, [])),
    )


def _cpu_features(value: list) -> frozenset[str]:
    if not all(isinstance(f, str) and f.strip() for f in value):
        raise InvalidFakeHost(f"host.cpu_features: must be feature names "
                              f"(value: {value!r})")
    return frozenset(f.strip().lower() for f in value)


def load_host_file(path: str | Path) -> HostInventory:
    text = Path(path).read_text()
    try:
        data = (json.loads(text) if str(path).endswith(".json")
                else yaml.safe_load(text))
    except (ValueError, yaml.YAMLError) as e:
        raise InvalidFakeHost(f"{path}: not valid JSON/YAML: {e}") from None
    return host_from_dict(data or {})


@dataclass
class FakeGuest:
    """A guest as a hypervisor holds it: its saved definition, and while it
    runs the definition it was started with."""

    saved: GuestSpec
    live: GuestSpec | None = None

    def state(self) -> GuestState:
        live = self.live.devices if self.live else ()
        return GuestState(self.live is not None, _ids(live), _ids(self.saved.devices),
                          _resources(live))

    def holding(self) -> GuestHolding:
        live = self.live.devices if self.live else ()
        return GuestHolding(self.saved.instance_uuid, True, self.live is not None,
                            _resources(live) | _resources(self.saved.devices))


@dataclass
class FakeForeignGuest:
    """A guest of someone else's: its saved definition, and while it runs
    the one it was started with."""

    saved: ForeignGuest
    live: ForeignGuest | None = None

    def holding(self) -> GuestHolding:
        live = self.live.resources if self.live else frozenset()
        return GuestHolding(self.saved.instance_uuid, False, self.live is not None,
                            live | self.saved.resources)


def _ids(devices) -> frozenset[str]:
    return frozenset(d.assignment_id for d in devices)


def _resources(devices) -> frozenset:
    return frozenset(r for d in devices for r in device_resources(d))


def fake_definition(guest: GuestSpec) -> str:
    """The fake's own form of a guest definition (what libvirt's domain XML
    is to the libvirt driver): the GuestSpec as JSON."""
    return json.dumps({
        "instance_uuid": guest.instance_uuid, "name": guest.name,
        "vcpus": guest.vcpus, "memory_mb": guest.memory_mb,
        "devices": [{"assignment_id": d.assignment_id, "kind": DeviceKind(d.kind).value,
                     "device_id": d.device_id, "amount": d.amount,
                     "cpus": sorted(d.cpus), "detail": json.loads(d.detail.to_json())}
                    for d in guest.devices]}, sort_keys=True)


def parse_fake_definition(text: str) -> GuestSpec:
    """The GuestSpec ``fake_definition`` wrote."""
    data = json.loads(text)
    return GuestSpec(data["instance_uuid"], data["name"], data["vcpus"],
                     data["memory_mb"], tuple(
                         GuestDevice(d["assignment_id"], DeviceKind(d["kind"]),
                                     d["device_id"], d["amount"], frozenset(d["cpus"]),
                                     DeviceDetail.from_json(json.dumps(d["detail"])))
                         for d in data["devices"]))


# A persisted fake hypervisor's URI: the file it keeps its state in.
FILE_URI = "fake-file://"


class FakeNetwork:
    """Fake hypervisors that reach one another by URI, as the libvirtds of
    hosts on one network do: where a live migration finds its
    destination."""

    def __init__(self) -> None:
        self._drivers: dict[str, FakeDriver] = {}

    def join(self, uri: str, driver: FakeDriver) -> None:
        self._drivers[uri] = driver

    def find(self, uri: str) -> FakeDriver | None:
        return self._drivers.get(uri)


class FakeDriver(ComputeDriver):
    """Guests live in ``guests`` (instance uuid -> FakeGuest) and behave as
    libvirt's do: redefining a running guest changes only its saved
    definition. mdevs it creates join the host's inventory, as the kernel's
    would. With a ``network`` it is the hypervisor at ``uri`` there, which
    live migrations reach. With a ``state_file`` its guests and created
    mdevs live in that file (see the module's doc)."""

    def __init__(self, host: HostInventory | dict | None = None,
                 boot_id: str = "fake-boot-1", *, network: FakeNetwork | None = None,
                 uri: str | None = None, state_file: str | Path | None = None):
        if isinstance(host, dict):
            host = host_from_dict(host)
        self.host = host or HostInventory(cpus=frozenset(range(4)),
                                          memory_mb=8192, disk_gb=100)
        self._listeners: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self.guests: dict[str, FakeGuest] = {}
        # Guests someone else defined (add_foreign_guest).
        self.foreign: dict[str, FakeForeignGuest] = {}
        self.created_mdevs: dict[str, tuple[str, str]] = {}
        # Vendor-specific VFIO VF -> the vGPU type it was given.
        self.vgpu_types: dict[str, str] = {}
        # Health signals a test set (set_device_health); every other
        # device of the host reads as present and well.
        self._health: dict[str, PciHealthSignals] = {}
        self.current_boot_id = boot_id
        # PF address -> the VF count written since the host file's (a
        # reboot writes 0 to every PF, as the kernel starts without VFs).
        self.num_vfs: dict[str, int] = {}
        self._network = network
        self.state_file = Path(state_file).absolute() if state_file else None
        # Without a network no migration reaches it: a URI of its own still
        # names it, unreachable. A persisted one is reached through its file.
        self.uri = uri or (f"{FILE_URI}{self.state_file}" if self.state_file
                           else f"fake:///{boot_id}")
        if network is not None and uri is not None:
            network.join(uri, self)
        if self.state_file is not None:
            with self._held(write=True):  # an existing file is read, kept
                pass

    @classmethod
    def from_conf(cls, conf) -> FakeDriver:
        host = load_host_file(conf.fake.host_file) if conf.fake.host_file else None
        return cls(host, state_file=conf.fake.state_file)

    # --- the hypervisor's state: in memory, or in a file ----------------------

    @contextmanager
    def _held(self, write: bool = False) -> Iterator[None]:
        """The hypervisor's state, to read (or change, with ``write``):
        with a state file, read from it under its lock first, and written
        back after a change."""
        with self._lock:
            state_file = self.state_file
            if state_file is None:
                yield
                return
            lock = os.open(f"{state_file}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self._load(state_file)
                yield
                if write:
                    self._save(state_file)
            finally:
                os.close(lock)

    def _load(self, state_file: Path) -> None:
        if not state_file.exists():
            return
        data = json.loads(state_file.read_text())
        self.created_mdevs = {u: (p, t) for u, (p, t) in data["created_mdevs"].items()}
        self.vgpu_types = dict(data.get("vgpu_types", {}))
        # Absent from a file written before the fake knew reboots.
        self.current_boot_id = data.get("boot_id", self.current_boot_id)
        self.num_vfs = dict(data.get("num_vfs", {}))
        self.guests = {u: FakeGuest(parse_fake_definition(g["saved"]),
                                    parse_fake_definition(g["live"]) if g["live"] else None)
                       for u, g in data["guests"].items()}

    def _save(self, state_file: Path) -> None:
        """Atomically: a change either happened or did not, as libvirt's."""
        data = {"created_mdevs": self.created_mdevs, "vgpu_types": self.vgpu_types,
                "boot_id": self.current_boot_id, "num_vfs": self.num_vfs,
                "guests": {u: {"saved": fake_definition(g.saved),
                               "live": fake_definition(g.live) if g.live else None}
                           for u, g in self.guests.items()}}
        tmp = state_file.with_name(state_file.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, json.dumps(data, sort_keys=True).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, state_file)
        directory = os.open(state_file.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def _reach(self, uri: str) -> FakeDriver | None:
        """The hypervisor at ``uri``: on this one's network, or a persisted
        one's file."""
        if uri.startswith(FILE_URI):
            path = Path(uri[len(FILE_URI):])
            return FakeDriver(state_file=path) if path.is_file() else None
        return self._network.find(uri) if self._network else None

    def get_host_inventory(self) -> HostInventory:
        with self._held():
            created = dict(self.created_mdevs)
            typed = dict(self.vgpu_types)
            num_vfs = dict(self.num_vfs)
        host = self._with_vf_counts(num_vfs)
        if not created and not typed:
            return host
        used = Counter(created.values())
        parents = tuple(
            # A VF with a type offers that type alone, with no instance left.
            replace(p, types=tuple(replace(t, available_instances=0) for t in p.types
                                   if t.id == typed[p.address]))
            if p.address in typed else
            replace(p, types=tuple(replace(t, available_instances=max(
                0, t.available_instances - used[(p.address, t.id)])) for t in p.types))
            for p in host.mdev_parents)
        mdevs = host.mdevs + tuple(Mdev(u, t, p) for u, (p, t) in sorted(created.items()))
        return replace(host, mdev_parents=parents, mdevs=mdevs)

    def _with_vf_counts(self, num_vfs: dict[str, int]) -> HostInventory:
        """The host file's host with each PF's VFs as its written count
        makes them: VF i at vf_address(PF, i), of the host file's VF ids."""
        if not num_vfs:
            return self.host
        devices = []
        for d in self.host.pci_devices:
            if d.parent_address in num_vfs:
                continue
            if d.address not in num_vfs:
                devices.append(d)
                continue
            count = num_vfs[d.address]
            devices.append(replace(d, num_vfs=count))
            devices += [PciDevice(vf_address(d.address, i), d.vendor_id,
                                  self._vf_product(d), PciKind.VF, d.numa_node,
                                  parent_address=d.address) for i in range(count)]
        return replace(self.host, pci_devices=tuple(devices))

    def _vf_product(self, pf: PciDevice) -> str:
        return next((d.product_id for d in self.host.pci_devices
                     if d.parent_address == pf.address), pf.product_id)

    def sriov_functions(self, pf_address: str) -> SriovFunctions | None:
        devices = self.get_host_inventory().pci_devices
        pf = next((d for d in devices if d.address == pf_address), None)
        if pf is None:
            return None
        return SriovFunctions(pf, tuple(sorted(
            (d for d in devices if d.parent_address == pf_address), key=lambda d: d.address)))

    def set_num_vfs(self, pf_address: str, count: int) -> None:
        """As the kernel takes a write of sriov_numvfs: ERANGE above
        sriov_totalvfs, EBUSY for a new non-zero count while VFs exist."""
        with self._held(write=True):
            pf = next((d for d in self._with_vf_counts(self.num_vfs).pci_devices
                       if d.address == pf_address), None)
            if pf is None or pf.kind is not PciKind.PF:
                raise SriovError(f"{pf_address}: cannot set {count} VFs: not an SR-IOV PF")
            if count > pf.total_vfs:
                raise SriovError(f"{pf_address}: cannot set {count} VFs: Numerical result "
                                 "out of range")
            if count and pf.num_vfs and count != pf.num_vfs:
                raise SriovError(f"{pf_address}: cannot set {count} VFs: Device or "
                                 "resource busy")
            self.num_vfs[pf_address] = count

    # --- guests ---------------------------------------------------------

    def spawn(self, guest: GuestSpec) -> None:
        self._define(guest)
        with self._held(write=True):
            g = self.guests[guest.instance_uuid]
            if g.live is None:
                g.live = g.saved

    def update_guest(self, guest: GuestSpec) -> None:
        self._define(guest)

    def _define(self, guest: GuestSpec) -> None:
        for d in guest.devices:
            if DeviceKind(d.kind) is DeviceKind.VGPU_VF:
                self.set_vgpu_type(d.device_id, d.detail.mdev_type or "")
            elif d.detail.mdev_parent:
                self.ensure_mdev(d.device_id, d.detail.mdev_parent, d.detail.mdev_type or "")
        with self._held(write=True):
            existing = self.guests.get(guest.instance_uuid)
            if existing is None:
                self.guests[guest.instance_uuid] = FakeGuest(guest)
            else:
                existing.saved = guest

    def power_off(self, instance_uuid: str) -> None:
        # Any guest of that uuid, ours or another manager's, as libvirt's.
        with self._held(write=True):
            g = self.guests.get(instance_uuid) or self.foreign.get(instance_uuid)
            if g is not None:
                g.live = None

    def destroy(self, instance_uuid: str) -> None:
        with self._held(write=True):
            self.guests.pop(instance_uuid, None)
            self.foreign.pop(instance_uuid, None)

    def list_guests(self) -> dict[str, GuestState]:
        with self._held():
            return {u: g.state() for u, g in self.guests.items()}

    def guest_holdings(self, reread: bool = False) -> dict[str, GuestHolding]:
        # Nothing is kept between calls: every answer is read whole.
        with self._held():
            guests: list[tuple[str, FakeGuest | FakeForeignGuest]] = [
                *self.foreign.items(), *self.guests.items()]
            return {u: g.holding() for u, g in guests}

    def describe_guest(self, instance_uuid: str) -> GuestSpec | None:
        with self._held():
            guest = self.guests.get(instance_uuid)
        if guest is None:
            return None
        # As a domain's XML names them: kind and id, without our detail.
        return replace(guest.saved, devices=tuple(
            GuestDevice(d.assignment_id, d.kind, d.device_id) for d in guest.saved.devices))

    def guest_state(self, instance_uuid: str) -> GuestState | None:
        with self._held():
            g = self.guests.get(instance_uuid)
            return None if g is None else g.state()

    # --- guests of others: adoption -------------------------------------

    def add_foreign_guest(self, guest: ForeignGuest) -> None:
        """Another manager (nova-compute) defines ``guest`` on this host and
        starts it when ``guest.running``. A guest already running is only
        redefined: it keeps holding what it was started with."""
        with self._lock:
            found = self.foreign.get(guest.instance_uuid)
            live = found.live if found is not None else None
            self.foreign[guest.instance_uuid] = FakeForeignGuest(
                replace(guest, running=False),
                live or (guest if guest.running else None))

    def list_foreign_guests(self) -> dict[str, ForeignGuest]:
        with self._lock:
            return {u: g.live or g.saved for u, g in self.foreign.items()}

    def guest_definition(self, instance_uuid: str, live: bool = False,
                         migratable: bool = False) -> str | None:
        with self._held():
            g = self.guests.get(instance_uuid)
        if g is None:
            return None
        return fake_definition(g.live if live and g.live is not None else g.saved)

    # --- live migration ---------------------------------------------------

    def live_migrate(self, instance_uuid: str, dest_uri: str,
                     target: LiveMigrationTarget) -> None:
        """Refuses as libvirt does, and otherwise moves the guest in one
        step: running on the destination with ``target``'s devices, defined
        there so, gone from here."""
        what = f"{instance_uuid} to {dest_uri}"
        with self._held():
            guest = self.guests.get(instance_uuid)
            live = guest.live if guest is not None else None
        if live is None:
            raise LiveMigrationError(MigrationFailure.NO_RUNNING_GUEST,
                                     f"{what}: no such guest running here")
        dest = self._reach(dest_uri)
        if dest is None:
            raise LiveMigrationError(MigrationFailure.DESTINATION_UNREACHABLE,
                                     f"{what}: no hypervisor there")
        if dest is self or dest_uri == self.uri:
            raise LiveMigrationError(MigrationFailure.ABORTED,
                                     f"{what}: the destination is this host")
        try:
            moved = moved_guest(live, target)
        except InvalidMigrationTarget as e:
            raise LiveMigrationError(MigrationFailure.DEFINITION_REFUSED,
                                     f"{what}: {e}") from None
        with dest._held(write=True):
            dest.guests[instance_uuid] = FakeGuest(moved, moved)
        with self._held(write=True):
            self.guests.pop(instance_uuid, None)

    def migrating_out(self, instance_uuid: str) -> bool:
        # Its migrations are one step, inside the call that makes them:
        # none outlives its caller.
        return False

    def migration_uri(self) -> str:
        return self.uri

    def ensure_mdev(self, mdev_uuid: str, parent: str, type_id: str) -> None:
        with self._held(write=True):
            if any(m.uuid == mdev_uuid for m in self.host.mdevs):
                return
            offered = {(p.address, t.id) for p in self.host.mdev_parents for t in p.types}
            if (parent, type_id) not in offered:
                raise MdevError(f"{parent}: no mdev type {type_id} to create "
                                f"{mdev_uuid} from")
            self.created_mdevs[mdev_uuid] = (parent, type_id)

    def remove_mdev(self, mdev_uuid: str) -> None:
        with self._held(write=True):
            self.created_mdevs.pop(mdev_uuid, None)

    def set_vgpu_type(self, vf_address: str, type_id: str) -> None:
        with self._held(write=True):
            current = self.vgpu_types.get(vf_address)
            if current == type_id:
                return
            parent = next((p for p in self.host.mdev_parents
                           if p.address == vf_address and p.vendor_vfio), None)
            if parent is None:
                raise MdevError(f"{vf_address}: not a VF in NVIDIA's vendor-specific "
                                "VFIO layout")
            if current is not None:
                raise MdevError(f"{vf_address}: has vGPU type {current}, not {type_id}")
            if not any(t.id == type_id and t.available_instances > 0 for t in parent.types):
                raise MdevError(f"{vf_address}: cannot create vGPU type {type_id} now")
            self.vgpu_types[vf_address] = type_id

    def clear_vgpu_type(self, vf_address: str, type_id: str) -> None:
        with self._held(write=True):
            if self.vgpu_types.get(vf_address) == type_id:
                del self.vgpu_types[vf_address]

    def boot_id(self) -> str:
        with self._held():
            return self.current_boot_id

    def reboot(self, boot_id: str) -> None:
        """What a host reboot does to it: guests stop, created mdevs and
        the VFs' vGPU types vanish, every PF is left without VFs."""
        with self._held(write=True):
            self.created_mdevs.clear()
            self.vgpu_types.clear()
            self.num_vfs = {d.address: 0 for d in self.host.pci_devices
                            if d.kind is PciKind.PF}
            for g in self.guests.values():
                g.live = None
            for foreign in self.foreign.values():
                foreign.live = None
            self.current_boot_id = boot_id

    def set_host(self, host: HostInventory | dict) -> None:
        self.host = host_from_dict(host) if isinstance(host, dict) else host
        for listener in self._listeners:
            listener()

    def register_change_listener(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def set_device_health(self, signals: PciHealthSignals) -> None:
        """What the device's files say from now on, as a watcher will read
        it at its next poll (health changes raise no event)."""
        with self._lock:
            self._health[signals.address] = signals

    def device_health(self, addresses: Collection[str]
                      ) -> dict[str, PciHealthSignals]:
        host = self.get_host_inventory()
        vendors: dict[str, str | None] = {d.address: d.vendor_id for d in host.pci_devices}
        vendors.update((p.address, p.vendor_id) for p in host.mdev_parents)
        with self._lock:
            return {a: self._health.get(a) or PciHealthSignals(
                        a, a in vendors, vendors.get(a))
                    for a in addresses}
