"""The host inventory a driver reports, and the guests' data types; the
driver interface itself is compute_agent/drivers/driver.py.

A driver reports what the host *has*, raw and unfiltered. Operator policy
(the PCI allowlist, enabled mdev types, pmem labels, CPU sets) is applied
later, by the pure tree builder in ``compute_agent.tree.host_tree``, so the same rules
hold for every driver.
"""
from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import get_args, get_type_hints


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
class SriovFunctions:
    """An SR-IOV PF as the host shows it now, and the VFs that exist behind
    it (its ``virtfnN`` links), in the order of their index."""

    pf: PciDevice
    vfs: tuple[PciDevice, ...] = ()


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
    # A VF in NVIDIA's vendor-specific VFIO layout: no mdev is created on
    # it; it takes a type when the type's number is written to its
    # nvidia/current_vgpu_type, and then goes to the guest whole.
    vendor_vfio: bool = False


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
    # A GPU's VF in NVIDIA's vendor-specific VFIO layout, by its PCI
    # address: its vGPU type (detail.mdev_type) written to it at claim
    # time, then passed to the guest as a PCI hostdev.
    VGPU_VF = "vgpu_vf"
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
    def from_json(cls, text: str) -> DeviceDetail:
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
    if kind in (DeviceKind.PCI, DeviceKind.VF, DeviceKind.VGPU_VF):
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
class GuestHolding:
    """What one guest defined or running on this host holds exclusively,
    whoever defined it, read from its domain's devices and pinning (not
    from metadata): while it runs, what it runs with and what its
    definition takes back at its next start; when stopped, its definition."""

    uuid: str  # the domain's: the instance's, for ours and for nova's
    ours: bool  # it carries our metadata
    running: bool
    resources: frozenset[HostResource] = frozenset()


@dataclass(frozen=True)
class GuestSpec:
    instance_uuid: str
    name: str
    vcpus: int
    memory_mb: int
    devices: tuple[GuestDevice, ...] = ()


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
