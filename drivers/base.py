"""The driver interface and the host inventory it reports.

A driver reports what the host *has*, raw and unfiltered. Operator policy
(the PCI allowlist, enabled mdev types, pmem labels, CPU sets) is applied
later, by the pure tree builder in ``agent.host_tree``, so the same rules
hold for every driver.
"""
from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from typing import Callable


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
    # Devices the driver could not read, as "device: field: reason" lines.
    warnings: tuple[str, ...] = field(default=(), compare=False)


class DeviceKind(str, enum.Enum):
    """How an assigned device reaches the guest."""

    PCI = "pci"  # a whole PCI device, as a hostdev
    VF = "vf"  # an SR-IOV VF, as <interface type='hostdev'>
    MDEV = "mdev"  # a mediated device (vGPU), by its UUID
    PMEM = "pmem"  # a persistent-memory namespace, as an nvdimm
    PCPU = "pcpu"  # dedicated host CPUs, pinned
    NUMA = "numa"  # shared CPUs and memory of a NUMA cell


@dataclass(frozen=True)
class GuestDevice:
    """One assigned device, as the guest definition needs it."""

    assignment_id: str
    kind: DeviceKind
    device_id: str  # PCI address, mdev UUID, namespace name, or cell number
    amount: int = 1
    numa_node: int | None = None
    # PCPU: the pinned host CPUs. PMEM: size_bytes and dev path. MDEV: the
    # parent address and type, so a missing mdev can be created.
    cpus: frozenset[int] = frozenset()
    size_bytes: int = 0
    dev_path: str | None = None
    mdev_parent: str | None = None
    mdev_type: str | None = None


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

    def cleanup(self) -> None:
        """Release connections and threads."""

    # --- guests: called outside the tracker's lock -----------------------

    @abc.abstractmethod
    def spawn(self, guest: GuestSpec) -> None:
        """Create missing mdevs, define the guest with its devices and the
        assignment ids in its metadata, and start it. Idempotent: a guest
        that already exists is redefined and left running."""

    @abc.abstractmethod
    def update_guest(self, guest: GuestSpec) -> None:
        """Redefine an existing guest with new devices (a move finishing
        here); it keeps running state as it was."""

    @abc.abstractmethod
    def destroy(self, instance_uuid: str) -> None:
        """Stop and undefine the guest, if it exists."""

    @abc.abstractmethod
    def list_guests(self) -> dict[str, frozenset[str]]:
        """Every guest this agent defined: instance uuid -> the assignment
        ids recorded in its metadata."""

    def guest_definition(self, instance_uuid: str) -> str | None:
        """The hypervisor's own definition of the guest (libvirt: its domain
        XML), for operators and tests; None when there is none."""
        return None

    def describe_guest(self, instance_uuid: str) -> GuestSpec | None:
        """The guest as its definition records it: name, vCPUs, memory,
        and for each device the assignment id, kind and device id its
        metadata carries (nothing else of a device is read back). None
        when there is no such guest of ours. Rebuilding a lost store
        (compute-agent-manage rebuild-store) reads this."""
        return None

    @abc.abstractmethod
    def guest_is_running(self, instance_uuid: str) -> bool:
        """Whether the guest exists and is running."""

    @abc.abstractmethod
    def ensure_mdev(self, mdev_uuid: str, parent: str, type_id: str) -> None:
        """Create the mdev if it does not exist (after a reboot, say)."""

    @abc.abstractmethod
    def remove_mdev(self, mdev_uuid: str) -> None:
        """Remove the mdev if it exists."""

    def boot_id(self) -> str:
        """Changes at every host boot; claims record it."""
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()


class DriverUnavailable(Exception):
    """The hypervisor cannot be reached right now; the cycle is skipped."""
