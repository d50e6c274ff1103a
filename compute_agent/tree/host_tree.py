"""Build the desired provider tree from a host inventory (pure).

This is where operator policy meets what the driver found: the PCI
allowlist, enabled mdev types, pmem labels, CPU sets, reservations and the
tree mode. Names follow nova's wherever nova has one, so a host that
nova-compute registered can be adopted in place.
"""
from __future__ import annotations

import enum
import math
import uuid
from collections import defaultdict
from collections.abc import Mapping, Set
from dataclasses import dataclass, field

import os_resource_classes as orc
import os_traits

from compute_agent.claims.choice import Pool, Slot
from compute_agent.common.pci_address import node_device_name
from compute_agent.drivers.base import DeviceKind, HostInventory, MdevParent, MdevType, PciDevice, PciKind
from compute_agent.exception import ConfigError
from compute_agent.tree.cpu_traits import cpu_feature_traits
from compute_agent.tree.device_spec import DeviceSpec, first_match
from compute_agent.tree.provider_tree import Inventory, Provider, ProviderTree, inventory


@dataclass(frozen=True)
class MdevTypePolicy:
    type_id: str
    resource_class: str = orc.VGPU
    # None: every GPU that offers the type.
    addresses: frozenset[str] | None = None


class TreeMode(enum.Enum):
    """The shape of the tree: where compute inventory goes and where a
    device provider hangs (the two rules below), as
    ``[compute] provider_tree_mode`` names them."""

    # nova's: everything on the root, devices directly under it.
    FLAT = "flat"
    # NUMA cells carry VCPU, PCPU and MEMORY_MB; devices under their cell.
    NESTED = "nested"
    # Compute on the root, so one class is never split across cells (a
    # flavor bigger than a cell fits); the cells still stand, with
    # HW_NUMA_ROOT, to hold the devices, so same_subtree still ties
    # devices to one cell.
    NUMA_DEVICES = "numa_devices"


def compute_on_cells(mode: TreeMode) -> bool:
    """Where compute inventory goes: VCPU, PCPU and MEMORY_MB on the NUMA
    cells' providers (True) or on the root (False). DISK_GB is always the
    root's."""
    return mode is TreeMode.NESTED


def devices_under_cells(mode: TreeMode) -> bool:
    """Where a device provider hangs: under its NUMA cell's provider (True)
    or directly under the root (False). The cells stand as providers
    exactly when something goes under them."""
    return mode in (TreeMode.NESTED, TreeMode.NUMA_DEVICES)


@dataclass(frozen=True)
class TreePolicy:
    host: str
    root_uuid: str
    mode: TreeMode = TreeMode.NESTED
    dedicated_cpus: frozenset[int] | None = None
    shared_cpus: frozenset[int] | None = None
    reserved_memory_mb: int = 0
    reserved_disk_mb: int = 0
    cpu_allocation_ratio: float = 4.0
    ram_allocation_ratio: float = 1.0
    disk_allocation_ratio: float = 1.0
    device_specs: tuple[DeviceSpec, ...] = ()
    mdev_types: tuple[MdevTypePolicy, ...] = ()
    # label -> namespace names
    pmem_labels: tuple[tuple[str, frozenset[str]], ...] = ()
    # On the root, so that a scheduler that asks for it (nova's does, with
    # root_required) keeps placing on this host.
    owner_trait: str = os_traits.OWNER_NOVA
    # [pci] vf_counts: PF address -> the VF count to restore after a reboot.
    vf_counts: tuple[tuple[str, int], ...] = ()


@dataclass
class BuiltTree:
    tree: ProviderTree
    warnings: list[str] = field(default_factory=list)
    # What stands behind each provider's inventory, for claims.
    pools: list[Pool] = field(default_factory=list)
    # Each one-time-use device's spec (its cleaning), by address.
    one_time_use: dict[str, DeviceSpec] = field(default_factory=dict)

    def pools_by_uuid(self, names: dict[str, str]) -> dict[str, dict[str, Pool]]:
        """The pools keyed by the UUIDs Placement uses for their providers:
        ``names`` maps a provider's name to its UUID there, and a provider
        not named keeps the UUID the model gave it."""
        out: dict[str, dict[str, Pool]] = {}
        for pool in self.pools:
            uuid = names.get(pool.provider_name) or self.tree.named(pool.provider_name).uuid
            out.setdefault(uuid, {})[pool.resource_class] = pool
        return out


def child_uuid(root_uuid: str, name: str) -> str:
    """Stable across restarts and known before creation, which the
    reshaper needs."""
    return str(uuid.uuid5(uuid.UUID(root_uuid), name))


def pci_provider_name(host: str, address: str) -> str:
    return f"{host}_{address.upper()}"


def gpu_provider_name(host: str, address: str) -> str:
    """nova's: the host and the GPU's libvirt node-device name."""
    return f"{host}_{node_device_name(address)}"


def numa_provider_name(host: str, cell_id: int) -> str:
    return f"{host}_numa_{cell_id}"


def pmem_provider_name(host: str, label: str, cell_id: int | None) -> str:
    suffix = "" if cell_id is None else f"_numa_{cell_id}"
    return f"{host}_pmem_{label}{suffix}"


# os_traits and os_resource_classes are untyped: their names are str.

def mdev_type_trait(type_id: str) -> str:
    return str(os_traits.normalize_name(f"MDEV_TYPE_{type_id}"))


def pmem_resource_class(label: str) -> str:
    return str(orc.normalize_name(f"PMEM_NAMESPACE_{label}"))


def pci_resource_class(device: PciDevice, spec: DeviceSpec) -> str:
    """The spec's class, or nova's default: CUSTOM_PCI_<VENDOR>_<PRODUCT>
    of the device itself (of a VF for VFs), so nova's flavors and PCI
    aliases find it."""
    return spec.resource_class or str(orc.normalize_name(
        f"PCI_{device.vendor_id}_{device.product_id}"))


def physnet_trait(physical_network: str) -> str:
    return str(os_traits.normalize_name(f"PHYSNET_{physical_network}"))


def pci_traits(spec: DeviceSpec) -> frozenset[str]:
    """The traits of an allowlisted device's (or its VFs') provider."""
    physnet = ({physnet_trait(spec.physical_network)}
               if spec.physical_network else set())
    migratable = {os_traits.HW_PCI_LIVE_MIGRATABLE} if spec.live_migratable else set()
    one_time = {os_traits.HW_PCI_ONE_TIME_USE} if spec.one_time_use else set()
    return (frozenset({os_traits.COMPUTE_MANAGED_PCI_DEVICE}) | spec.traits | physnet
            | migratable | one_time)


def root_traits(inv: HostInventory, policy: TreePolicy) -> frozenset[str]:
    """The standard traits a scheduler relies on: a compute node, its
    owner, and what its CPU can do."""
    return (frozenset({os_traits.COMPUTE_NODE, policy.owner_trait})
            | cpu_feature_traits(inv.cpu_features))


class _Builder:
    def __init__(self, inv: HostInventory, policy: TreePolicy):
        self.inv = inv
        self.policy = policy
        self.tree = ProviderTree()
        self.warnings: list[str] = []
        self.cells = {c.id: c for c in inv.numa_cells}
        self.pools: list[Pool] = []
        # Decided once for the whole host; each step below reads them.
        self.shared_cpus, self.dedicated_cpus = self.cpu_split()
        self.allowlisted = {d.address: s for d in inv.pci_devices
                            if (s := first_match(policy.device_specs, d)) is not None}
        self.one_time_use = {a: s for a, s in self.allowlisted.items() if s.one_time_use}
        self.pf_of = {d.address: d.parent_address for d in inv.pci_devices
                      if d.parent_address}

    def add(self, name: str, parent: Provider,
            inventories: Mapping[str, Inventory] | None = None,
            traits: Set[str] = frozenset()) -> Provider:
        existing = self.tree.by_name(name)
        if existing is not None:
            existing.inventories.update(inventories or {})
            existing.traits = existing.traits | traits
            return existing
        p = Provider(uuid=child_uuid(self.policy.root_uuid, name), name=name,
                     parent_uuid=parent.uuid, inventories=dict(inventories or {}),
                     traits=frozenset(traits))
        self.tree.add(p)
        return p

    def parent_for(self, numa_node: int | None, what: str) -> Provider:
        """The provider a device of ``numa_node`` hangs under."""
        if not devices_under_cells(self.policy.mode) or numa_node is None:
            return self.root
        if numa_node not in self.cells:
            self.warnings.append(f"{what}: numa_node: cell {numa_node} is not "
                                 "among the host's cells; placed under the root")
            return self.root
        return self.tree[child_uuid(self.policy.root_uuid,
                                    numa_provider_name(self.policy.host, numa_node))]

    # --- compute --------------------------------------------------------

    def cpu_split(self) -> tuple[frozenset[int], frozenset[int]]:
        """(shared, dedicated) host CPUs."""
        p, host_cpus = self.policy, self.inv.cpus
        for option, cpus in (("[compute] cpu_dedicated_set", p.dedicated_cpus),
                             ("[compute] cpu_shared_set", p.shared_cpus)):
            if cpus and not cpus <= host_cpus:
                raise ConfigError(f"{option}: CPUs {sorted(cpus - host_cpus)} "
                                  "are not on this host")
        if p.dedicated_cpus and p.shared_cpus and p.dedicated_cpus & p.shared_cpus:
            raise ConfigError(
                "[compute] cpu_dedicated_set and cpu_shared_set overlap on CPUs "
                f"{sorted(p.dedicated_cpus & p.shared_cpus)}")
        if p.dedicated_cpus is None:
            shared = p.shared_cpus if p.shared_cpus is not None else host_cpus
            return shared, frozenset()
        return p.shared_cpus or frozenset(), p.dedicated_cpus

    def cell_of_cpu(self, cpu: int) -> int | None:
        return next((c.id for c in self.inv.numa_cells if cpu in c.cpus), None)

    def compute_inventory(self, provider_name: str, numa_node: int | None,
                          cpus: frozenset[int], memory_mb: int,
                          reserve_memory: bool) -> dict[str, Inventory]:
        p = self.policy
        out: dict[str, Inventory] = {}
        pinned = sorted(cpus & self.dedicated_cpus)
        if pinned:
            # Each pinned CPU keeps its cell, on the root too, so that a
            # claim still prefers the cell of the instance's devices.
            self.pools.append(Pool(provider_name, orc.PCPU, DeviceKind.PCPU,
                                   len(pinned), tuple(Slot(str(c), self.cell_of_cpu(c))
                                                      for c in pinned), numa_node))
            out[orc.PCPU] = inventory(len(pinned))
        if cpus & self.shared_cpus:
            out[orc.VCPU] = inventory(len(cpus & self.shared_cpus),
                                      allocation_ratio=p.cpu_allocation_ratio)
        if memory_mb > 0:
            reserved = min(p.reserved_memory_mb, memory_mb) if reserve_memory else 0
            out[orc.MEMORY_MB] = inventory(memory_mb, reserved=reserved,
                                           allocation_ratio=p.ram_allocation_ratio)
        self.counted(provider_name, numa_node, out, skip=(orc.PCPU,))
        return out

    def counted(self, provider_name: str, numa_node: int | None,
                invs: Mapping[str, Inventory], skip: tuple[str, ...] = ()) -> None:
        for rc, rec in invs.items():
            if rc not in skip:
                kind = (DeviceKind.HOST_RESOURCES if numa_node is None
                        else DeviceKind.NUMA)
                self.pools.append(Pool(provider_name, rc, kind, rec["total"],
                                       numa_node=numa_node))

    def build_root(self) -> None:
        p, inv = self.policy, self.inv
        invs = {}
        if inv.disk_gb > 0:
            invs[orc.DISK_GB] = inventory(
                inv.disk_gb,
                reserved=min(inv.disk_gb, math.ceil(p.reserved_disk_mb / 1024)),
                allocation_ratio=p.disk_allocation_ratio)
        if inv.disk_gb > 0:
            self.counted(p.host, None, invs)
        if not compute_on_cells(p.mode) or not inv.numa_cells:
            invs.update(self.compute_inventory(p.host, None, inv.cpus,
                                               inv.memory_mb, True))
        self.root = Provider(uuid=p.root_uuid, name=p.host, inventories=invs,
                             traits=root_traits(inv, p))
        self.tree.add(self.root)

    def build_cells(self) -> None:
        mode = self.policy.mode
        if not devices_under_cells(mode):
            return
        cells = sorted(self.inv.numa_cells, key=lambda c: c.id)
        # A memory-less cell has no MEMORY_MB to hold the reservation.
        reserving = next((c.id for c in cells if c.memory_mb > 0), None)
        for cell in cells:
            name = numa_provider_name(self.policy.host, cell.id)
            invs = (self.compute_inventory(name, cell.id, cell.cpus, cell.memory_mb,
                                           cell.id == reserving)
                    if compute_on_cells(mode) else {})
            self.add(name, self.root, invs, frozenset({os_traits.HW_NUMA_ROOT}))

    # --- PCI ------------------------------------------------------------

    def build_pci(self) -> None:
        devices = {d.address: d for d in self.inv.pci_devices}
        matched = self.allowlisted
        vf_slots: dict[str, dict[str, list[Slot]]] = defaultdict(lambda: defaultdict(list))
        vf_traits: dict[str, set[str]] = defaultdict(set)
        for address, spec in sorted(matched.items()):
            device = devices[address]
            if device.kind is PciKind.VF and device.parent_address:
                pf_spec = matched.get(device.parent_address)
                if pf_spec is not None:
                    raise ConfigError(
                        f"[pci] device_spec: PF {device.parent_address} and its "
                        f"VF {address} are both allowlisted, by {pf_spec.text} "
                        f"and {spec.text}; allowlist one or the other")
                vf_slots[device.parent_address][pci_resource_class(device, spec)].append(
                    Slot(address, device.numa_node))
                vf_traits[device.parent_address] |= pci_traits(spec)
                continue
            rc = pci_resource_class(device, spec)
            name = pci_provider_name(self.policy.host, address)
            self.pools.append(Pool(name, rc, DeviceKind.PCI, 1,
                                   (Slot(address, device.numa_node),),
                                   device.numa_node,
                                   one_time_use=self.one_time_slots([Slot(address)])))
            self.add(name,
                     self.parent_for(device.numa_node, address),
                     {rc: inventory(1)}, pci_traits(spec))
        for pf_address, by_rc in sorted(vf_slots.items()):
            pf = devices.get(pf_address)
            numa = pf.numa_node if pf else next(iter(by_rc.values()))[0].numa_node
            name = pci_provider_name(self.policy.host, pf_address)
            for rc, slots in by_rc.items():
                self.pools.append(Pool(name, rc, DeviceKind.VF, len(slots),
                                       tuple(slots), numa,
                                       one_time_use=self.one_time_slots(slots)))
            self.add(name, self.parent_for(numa, pf_address),
                     {rc: inventory(len(slots)) for rc, slots in by_rc.items()},
                     vf_traits[pf_address])

    def one_time_slots(self, slots: list[Slot]) -> frozenset[str]:
        return frozenset(s.device_id for s in slots if s.device_id in self.one_time_use)

    # --- vGPU -----------------------------------------------------------

    def mdev_policy_for(self, parent: MdevParent) -> MdevTypePolicy | None:
        offered = {t.id for t in parent.types}
        return next((tp for tp in self.naming(parent) if tp.type_id in offered), None)

    def naming(self, parent: MdevParent) -> list[MdevTypePolicy]:
        """The enabled types whose device_addresses take this GPU: all of
        them, its own address, or (for a VF) its PF's, which names every
        VF of the GPU. In the config's order."""
        pf = self.pf_of.get(parent.address)
        return [tp for tp in self.policy.mdev_types
                if tp.addresses is None or parent.address in tp.addresses
                or (pf is not None and pf in tp.addresses)]

    def vf_vgpus(self, parent: MdevParent, mdev_type: MdevType) -> int:
        """How many vGPUs of ``mdev_type`` a GPU's SR-IOV VF with mdevs
        accounts for: a VF hosts at most one vGPU, so 0 or 1. It holds one
        when an mdev of the type sits on it."""
        on_vf = [m for m in self.inv.mdevs
                 if m.parent_address == parent.address]
        if any(m.type_id == mdev_type.id for m in on_vf):
            return 1
        if on_vf:
            return 0  # it holds a vGPU of another type
        return 1 if mdev_type.available_instances > 0 else 0

    def build_vgpu(self) -> None:
        vfs = {d.address for d in self.inv.pci_devices
               if d.kind is PciKind.VF}
        for parent in sorted(self.inv.mdev_parents, key=lambda g: g.address):
            if parent.vendor_vfio:
                self.build_vgpu_vf(parent)
                continue
            tp = self.mdev_policy_for(parent)
            if tp is None:
                continue
            self.check_not_allowlisted(parent, tp)
            mdev_type = next(t for t in parent.types if t.id == tp.type_id)
            existing = sorted(m.uuid for m in self.inv.mdevs
                              if m.parent_address == parent.address
                              and m.type_id == tp.type_id)
            if parent.address in vfs:
                total = self.vf_vgpus(parent, mdev_type)
            else:
                total = mdev_type.available_instances + len(existing)
            if total <= 0:
                continue
            name = gpu_provider_name(self.policy.host, parent.address)
            self.pools.append(Pool(name, tp.resource_class, DeviceKind.MDEV, total,
                                   tuple(Slot(u, parent.numa_node) for u in existing),
                                   parent.numa_node, parent.address, tp.type_id))
            self.add(name,
                     self.parent_for(parent.numa_node, parent.address),
                     {tp.resource_class: inventory(total)},
                     frozenset({mdev_type_trait(tp.type_id)}))

    def check_not_allowlisted(self, parent: MdevParent, tp: MdevTypePolicy) -> None:
        if parent.address in self.allowlisted:
            raise ConfigError(
                f"GPU {parent.address} is both in [pci] device_spec and in "
                f"[mdev_{tp.type_id}]; a device is passed through whole "
                "or split into mdevs, not both")

    def build_vgpu_vf(self, parent: MdevParent) -> None:
        """A VF in NVIDIA's vendor-specific VFIO layout: one provider with
        one unit, of the one type vgpu_vf_offer gives it, the VF itself
        its slot (it takes the type at claim time and goes to the guest
        whole); reserved while it can create no enabled type."""
        offer = vgpu_vf_offer(parent, self.naming(parent))
        if offer is None:
            return
        tp, creatable = offer
        self.check_not_allowlisted(parent, tp)
        name = gpu_provider_name(self.policy.host, parent.address)
        self.pools.append(Pool(name, tp.resource_class, DeviceKind.VGPU_VF, 1,
                               (Slot(parent.address, parent.numa_node),),
                               parent.numa_node, mdev_type=tp.type_id))
        self.add(name, self.parent_for(parent.numa_node, parent.address),
                 {tp.resource_class: inventory(1, reserved=0 if creatable else 1)},
                 frozenset({mdev_type_trait(tp.type_id)}))

    # --- vPMEM ----------------------------------------------------------

    def build_pmem(self) -> None:
        by_name = {ns.name: ns for ns in self.inv.pmem_namespaces}
        owner: dict[str, str] = {}
        groups: dict[tuple[str, int | None], list[Slot]] = defaultdict(list)
        for label, names in self.policy.pmem_labels:
            for name in sorted(names):
                if name in owner:
                    raise ConfigError(f"[pmem] namespaces: {name} is under both "
                                      f"{owner[name]} and {label}")
                owner[name] = label
                ns = by_name.get(name)
                if ns is None:
                    self.warnings.append(f"pmem namespace {name}: name: not "
                                         "found on this host; not reported")
                    continue
                cell = ns.numa_node if (devices_under_cells(self.policy.mode)
                                        and ns.numa_node in self.cells) else None
                groups[(label, cell)].append(Slot(
                    name, ns.numa_node, ns.size_bytes,
                    f"/dev/{ns.dev}" if ns.dev else None))
        for (label, cell), slots in sorted(groups.items(),
                                           key=lambda kv: (kv[0][0], kv[0][1] or -1)):
            name = pmem_provider_name(self.policy.host, label, cell)
            rc = pmem_resource_class(label)
            self.pools.append(Pool(name, rc, DeviceKind.PMEM, len(slots),
                                   tuple(slots), cell))
            self.add(name, self.parent_for(cell, f"pmem {label}"),
                     {rc: inventory(len(slots))})


def vgpu_vf_offer(vf: MdevParent, naming: list[MdevTypePolicy]
                  ) -> tuple[MdevTypePolicy, bool] | None:
    """The one enabled type a VF of NVIDIA's vendor-specific layout is
    offered as, and whether it can take it now; ``naming``: the enabled
    types whose device_addresses take the VF, in the config's order.

    One type per VF, one unit: Placement then holds each VF once,
    whatever classes the types have, and can never hand one VF out
    for two types (a VF that could create two would otherwise count
    twice). A VF holding a type is offered as that type (not ours when
    that type is not enabled); a free one as the first type in the
    config's order that it lists as creatable now; one that lists none
    (a sibling took another size on an equal-size card, or the
    framebuffer is spent) stays, as the first type naming it, with its
    unit reserved until it can create one again. None when no enabled
    type names it."""
    if not naming:
        return None
    held = [t for t in vf.types if t.available_instances == 0]
    if held:
        tp = next((tp for tp in naming if tp.type_id == held[0].id), None)
        return None if tp is None else (tp, True)
    creatable = {t.id for t in vf.types}
    tp = next((tp for tp in naming if tp.type_id in creatable), None)
    return (naming[0], False) if tp is None else (tp, True)


def build_tree(inv: HostInventory, policy: TreePolicy) -> BuiltTree:
    """Raises ConfigError when the policy contradicts itself on this host."""
    b = _Builder(inv, policy)
    b.build_root()
    b.build_cells()
    b.build_pci()
    b.build_vgpu()
    b.build_pmem()
    return BuiltTree(b.tree, b.warnings, b.pools, b.one_time_use)
