"""The driver interface and the host inventory it reports.

A driver reports what the host *has*, raw and unfiltered. Operator policy
(the PCI allowlist, enabled mdev types, pmem labels, CPU sets) is applied
later, by the pure tree builder in ``agent.host_tree``, so the same rules
hold for every driver.
"""
from __future__ import annotations

import abc
import enum
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Collection, get_args, get_type_hints

if TYPE_CHECKING:  # drivers.migration builds on this module's types
    from drivers.migration import LiveMigrationTarget


class PciKind(str, enum.Enum):
    """nova's PCI device types, by the same strings."""

    PF = "type-PF"
    VF = "type-VF"
    PCI = "type-PCI"


@dataclass(frozen=True)
class NumaCell:
    id: int
    cpus: frozenset[int]
    memory_mb: int
    # Each entry is one core's thread siblings.
    siblings: tuple[frozenset[int], ...] = ()
    # Page size in KiB -> number of pages.
    pages: tuple[tuple[int, int], ...] = ()
    # Other cell id -> distance.
    distances: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class PciDevice:
    address: str  # canonical, lower case: "0000:81:00.0"
    vendor_id: str  # four lower-case hex digits
    product_id: str
    kind: PciKind
    numa_node: int | None  # None when the device has no NUMA affinity (-1)
    parent_address: str | None = None  # the PF of a VF
    class_id: str | None = None  # "020000"
    iommu_group: int | None = None
    driver: str | None = None
    total_vfs: int = 0
    num_vfs: int = 0


@dataclass(frozen=True)
class MdevType:
    id: str  # "nvidia-35"
    available_instances: int
    name: str | None = None  # the vendor's display name, "GRID M60-2Q"
    device_api: str = "vfio-pci"


@dataclass(frozen=True)
class MdevParent:
    """A device that can host mediated devices: a physical GPU, or one of
    its VFs in NVIDIA's vendor-specific VFIO layout."""

    address: str
    numa_node: int | None
    types: tuple[MdevType, ...]
    vendor_id: str | None = None
    product_id: str | None = None


@dataclass(frozen=True)
class Mdev:
    uuid: str
    type_id: str
    parent_address: str


@dataclass(frozen=True)
class PmemNamespace:
    name: str  # the name the operator's [pmem] namespaces refers to
    size_bytes: int
    numa_node: int | None
    mode: str = "devdax"
    uuid: str | None = None
    dev: str | None = None  # "dax0.0"


@dataclass(frozen=True)
class HostInventory:
    """Everything a driver discovered in one pass. No I/O is left in it."""

    cpus: frozenset[int]
    memory_mb: int
    disk_gb: int
    uuid: str | None = None  # the hypervisor's host UUID, when it has one
    numa_cells: tuple[NumaCell, ...] = ()
    pci_devices: tuple[PciDevice, ...] = ()
    mdev_parents: tuple[MdevParent, ...] = ()
    mdevs: tuple[Mdev, ...] = ()
    pmem_namespaces: tuple[PmemNamespace, ...] = ()
    # Every feature the host CPU has, its named model's own included, by
    # libvirt's names ("avx2", "sse4.2").
    cpu_features: frozenset[str] = frozenset()
    # Devices the driver could not read, as "device: field: reason" lines.
    warnings: tuple[str, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class NetLink:
    """One network interface of a PCI device, as the kernel's
    sysfs-class-net ABI shows it under the device's ``net/<name>``."""

    name: str
    operstate: str  # RFC 2863's word: up, down, lowerlayerdown, unknown...
    # Physical link (``carrier`` 1/0); None when unreadable, which is what
    # the kernel answers for an interface that is administratively down.
    carrier: bool | None = None
    # IFF_UP of ``flags``; None when unreadable.
    admin_up: bool | None = None


@dataclass(frozen=True)
class PciHealthSignals:
    """What a PCI device's own files say of its health, raw: no judgement.
    None is "the device has no such file" (not AER capable, not a PF, no
    config file); a file that exists but could not be read is named in
    ``unreadable`` instead, never left as None."""

    address: str
    present: bool  # its sysfs directory exists
    vendor_id: str | None = None  # the ``vendor`` file, "ffff" when dead
    # The vendor id in the first two bytes of ``config``, read from the
    # device itself (``vendor`` may be what the kernel cached at probe).
    config_vendor_id: str | None = None
    # TOTAL_ERR_* of aer_dev_fatal, aer_dev_nonfatal, aer_dev_correctable.
    aer_fatal: int | None = None
    aer_nonfatal: int | None = None
    aer_correctable: int | None = None
    # A PF: the number written to sriov_numvfs, and how many of its
    # virtfnN links lead to a VF that still exists.
    sriov_numvfs: int | None = None
    vfs_present: int | None = None
    links: tuple[NetLink, ...] = ()
    # "file: reason" for each file that exists but could not be read.
    unreadable: tuple[str, ...] = ()


class DeviceKind(str, enum.Enum):
    """How an assigned device reaches the guest."""

    PCI = "pci"  # a whole PCI device, as a hostdev
    VF = "vf"  # an SR-IOV VF, as <interface type='hostdev'>
    MDEV = "mdev"  # a mediated device (vGPU), by its UUID
    PMEM = "pmem"  # a persistent-memory namespace, as an nvdimm
    PCPU = "pcpu"  # dedicated host CPUs, pinned
    NUMA = "numa"  # shared CPUs and memory of a NUMA cell
    # Amounts of the whole host, of no cell: DISK_GB, and the CPUs and
    # memory of a host without NUMA providers. They do not reach the guest.
    HOST_RESOURCES = "host_resources"

    @property
    def counted(self) -> bool:
        """Only an amount is recorded, of no device in particular: many
        assignments share the one device id."""
        return self in (DeviceKind.NUMA, DeviceKind.HOST_RESOURCES)


@dataclass(frozen=True)
class DeviceDetail:
    """What a guest definition needs of an assigned device besides its id.
    None is unknown or not applicable; NUMA node 0 is a node."""

    numa_node: int | None = None
    # PMEM: the namespace's size and the device the guest maps.
    size_bytes: int | None = None
    dev_path: str | None = None
    # MDEV: the parent address and type, so a missing mdev can be created.
    mdev_parent: str | None = None
    mdev_type: str | None = None

    def to_json(self) -> str:
        """The known fields as a JSON object, keys sorted."""
        return _encode_json({name: value for name in _DETAIL_TYPES
                             if (value := getattr(self, name)) is not None})

    @classmethod
    def from_json(cls, text: str) -> "DeviceDetail":
        """Read what ``to_json`` wrote, or the plain dict of the same keys
        that agents wrote before this class. Raises ValueError naming the
        first field that is not one of ours or not of its type."""
        obj = json.loads(text)
        if not isinstance(obj, dict):
            raise ValueError(f"detail: {text!r}: not a JSON object")
        for name, value in obj.items():
            expected = _DETAIL_TYPES.get(name)
            if expected is None:
                raise ValueError(f"detail.{name}: {value!r}: not a field of a "
                                 "device's detail")
            if value is not None and type(value) is not expected:
                raise ValueError(f"detail.{name}: {value!r}: must be "
                                 f"{expected.__name__}")
        return cls(**obj)


# Each field of DeviceDetail -> the type of its known values (int for
# "int | None").
_DETAIL_TYPES: dict[str, type] = {
    name: next(t for t in get_args(hint) if t is not type(None))
    for name, hint in get_type_hints(DeviceDetail).items()}
# Made once: json.dumps with any option builds a new encoder every call.
_encode_json = json.JSONEncoder(sort_keys=True).encode


@dataclass(frozen=True)
class GuestDevice:
    """One assigned device, as the guest definition needs it."""

    assignment_id: str
    kind: DeviceKind
    device_id: str  # PCI address, mdev UUID, namespace name, or cell number
    amount: int = 1
    cpus: frozenset[int] = frozenset()  # PCPU: the pinned host CPUs
    detail: DeviceDetail = DeviceDetail()


class HostResourceKind(str, enum.Enum):
    """How a running guest's live definition names a host resource it
    holds exclusively."""

    PCI_ADDRESS = "pci"  # a hostdev or hostdev interface: PCI, VF
    MDEV_UUID = "mdev"  # an mdev hostdev
    BACKING_PATH = "path"  # an nvdimm's backing device or file
    HOST_CPU = "cpu"  # a pinned host CPU


@dataclass(frozen=True)
class HostResource:
    kind: HostResourceKind
    id: str  # canonical: lower-case PCI address or UUID, a path, a CPU number


def device_resources(device: GuestDevice) -> frozenset[HostResource]:
    """What a guest given this device holds exclusively on the host, as
    its live definition names it. Shared CPUs and memory hold nothing."""
    kind = DeviceKind(device.kind)
    if kind in (DeviceKind.PCI, DeviceKind.VF):
        return frozenset({HostResource(HostResourceKind.PCI_ADDRESS, device.device_id)})
    if kind is DeviceKind.MDEV:
        return frozenset({HostResource(HostResourceKind.MDEV_UUID, device.device_id)})
    if kind is DeviceKind.PMEM and device.detail.dev_path:
        return frozenset({HostResource(HostResourceKind.BACKING_PATH,
                                       device.detail.dev_path)})
    if kind is DeviceKind.PCPU:
        return frozenset(HostResource(HostResourceKind.HOST_CPU, str(c))
                         for c in device.cpus)
    return frozenset()


@dataclass(frozen=True)
class GuestState:
    """A guest as the hypervisor holds it. A running guest's devices are
    those it was started with (``live``); a redefinition changes only the
    saved definition, until the guest is next started."""

    running: bool
    # Assignment ids in the live definition's metadata (empty when stopped).
    live: frozenset[str]
    # Assignment ids in the saved (persistent) definition.
    saved: frozenset[str]
    # The host resources the live guest holds (empty when stopped).
    live_resources: frozenset[HostResource] = frozenset()


@dataclass(frozen=True)
class ForeignGuest:
    """A guest defined on this host by someone else (nova-compute, before
    the agent took the host over): no metadata of ours. Its instance uuid
    is the domain's, as nova names its domains."""

    instance_uuid: str
    name: str
    running: bool
    vcpus: int
    memory_mb: int
    # What it holds exclusively: while it runs, what it was started with;
    # when stopped, what its saved definition takes back at its next start.
    resources: frozenset[HostResource] = frozenset()


@dataclass(frozen=True)
class GuestSpec:
    instance_uuid: str
    name: str
    vcpus: int
    memory_mb: int
    devices: tuple[GuestDevice, ...] = ()


class ComputeDriver(abc.ABC):
    """What the agent needs from a hypervisor driver."""

    def init_host(self) -> None:
        """Connect and prepare; called once before the first cycle."""

    @abc.abstractmethod
    def get_host_inventory(self) -> HostInventory:
        """Discover the host. Raises DriverUnavailable when the hypervisor
        cannot be reached; unreadable devices are skipped with a warning."""

    def register_change_listener(self, callback: Callable[[], None]) -> None:
        """Ask to be told when the host's devices change between periods.
        Drivers without change events ignore this."""

    def device_health(self, addresses: Collection[str]
                      ) -> dict[str, PciHealthSignals]:
        """Each PCI device's health signals, read now (cheap: a few small
        files each; called every second or two). A driver that cannot tell
        returns nothing for a device, which then goes unjudged."""
        return {}

    def cleanup(self) -> None:
        """Release connections and threads."""

    # --- guests: called outside the tracker's lock -----------------------

    @abc.abstractmethod
    def spawn(self, guest: GuestSpec) -> None:
        """Create missing mdevs, define the guest with its devices and the
        assignment ids in its metadata, and start it if it is stopped.
        Idempotent. A guest that is already running is redefined and keeps
        running on the devices it was started with: only a stop and a
        start (``power_off``, then ``spawn``) changes a live guest's
        devices."""

    @abc.abstractmethod
    def update_guest(self, guest: GuestSpec) -> None:
        """Redefine the guest with these devices, leaving it running or
        stopped as it was; a running guest keeps its live devices."""

    @abc.abstractmethod
    def power_off(self, instance_uuid: str) -> None:
        """Stop the guest, keeping its definition; a stopped or missing
        guest is left as it is."""

    @abc.abstractmethod
    def destroy(self, instance_uuid: str) -> None:
        """Stop and undefine the guest, if it exists."""

    @abc.abstractmethod
    def list_guests(self) -> dict[str, GuestState]:
        """Every guest this agent defined, by instance uuid, with its live
        and saved devices told apart."""

    def describe_guest(self, instance_uuid: str) -> GuestSpec | None:
        """The guest as its definition records it: name, vCPUs, memory,
        and for each device the assignment id, kind and device id its
        metadata carries (nothing else of a device is read back). None
        when there is no such guest of ours. Rebuilding a lost store
        (compute-agent-manage rebuild-store) reads this."""
        return None

    @abc.abstractmethod
    def guest_state(self, instance_uuid: str) -> GuestState | None:
        """One guest's state, or None when there is no guest of ours."""

    def guest_definition(self, instance_uuid: str, live: bool = False,
                         migratable: bool = False) -> str | None:
        """The hypervisor's own definition of the guest (libvirt: its domain
        XML; with ``live``, what a running guest runs with), for operators
        and tests; None when there is none. With ``migratable`` (and
        ``live``), in the form a destination accepts for a live migration
        (libvirt: without what only this host's daemon added), which the
        migration's rewrite starts from."""
        return None

    def guest_is_running(self, instance_uuid: str) -> bool:
        """Whether the guest exists and is running."""
        state = self.guest_state(instance_uuid)
        return state is not None and state.running

    # --- guests of others: adoption -----------------------------------------

    @abc.abstractmethod
    def list_foreign_guests(self) -> dict[str, ForeignGuest]:
        """Every guest defined here that is not ours (``list_guests`` does
        not list it), by instance uuid. Raises DriverUnavailable when the
        hypervisor cannot be asked, and InvalidHostData (drivers.errors)
        naming the guest whose definition cannot be read: a guest whose
        devices are unknown is not one without devices."""

    @abc.abstractmethod
    def ensure_mdev(self, mdev_uuid: str, parent: str, type_id: str) -> None:
        """Create the mdev if it does not exist (after a reboot, say).
        Raises MdevError when the parent does not offer the type."""

    @abc.abstractmethod
    def remove_mdev(self, mdev_uuid: str) -> None:
        """Remove the mdev if it exists."""

    def boot_id(self) -> str:
        """Changes at every host boot; claims record it."""
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()

    # --- live migration --------------------------------------------------

    @abc.abstractmethod
    def live_migrate(self, instance_uuid: str, dest_uri: str,
                     target: "LiveMigrationTarget") -> None:
        """Move the running guest, while it runs, to the hypervisor at
        ``dest_uri``, where it runs with ``target``'s destination devices in
        place of its own (the driver rewrites its own definition of the
        running guest for them) and is defined persistently. Returns once
        the source holds nothing of the guest, neither running nor
        defined. Raises LiveMigrationError naming the cause; a target that
        does not describe the running guest's devices is
        DEFINITION_REFUSED. For every cause but OUTCOME_UNKNOWN the guest
        still runs here as before and the destination holds nothing."""

    @abc.abstractmethod
    def migrating_out(self, instance_uuid: str) -> bool:
        """Whether the hypervisor is migrating the guest to another host
        right now. A migration can outlive the process that started it
        (libvirt's peer-to-peer migrations run inside libvirtd): an agent
        restarted mid-way finds its own still going. False for a guest
        that is not here."""

    @abc.abstractmethod
    def migration_uri(self) -> str:
        """Where a source's hypervisor reaches this one to migrate a guest
        here (libvirt: the destination libvirtd's URI)."""


class MigrationFailure(str, enum.Enum):
    """Why a live migration did not happen."""

    # No running guest of that uuid here: there is nothing to move live.
    NO_RUNNING_GUEST = "no_running_guest"
    # The hypervisor cannot live-migrate (libvirt's test driver).
    UNSUPPORTED = "unsupported"
    # The destination definition is not one this guest can run with
    # (malformed, another guest, a different virtual hardware).
    DEFINITION_REFUSED = "definition_refused"
    # The source's hypervisor could not reach the destination's.
    DESTINATION_UNREACHABLE = "destination_unreachable"
    # The move started and was abandoned: the destination could not start
    # the guest, or the transfer broke (the destination's QEMU died).
    ABORTED = "aborted"
    # The connection to the source's own hypervisor broke during the call,
    # or it reported success with the guest still here: where the guest
    # runs must be looked up on both hosts before anything is released.
    OUTCOME_UNKNOWN = "outcome_unknown"
