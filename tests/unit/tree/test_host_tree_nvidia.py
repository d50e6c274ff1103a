"""vGPUs on a GPU's SR-IOV VFs: NVIDIA's vendor-specific VFIO layout
(``/sys/bus/pci/devices/<vf>/nvidia/{creatable_vgpu_types,current_vgpu_type}``)
and mdevs on VFs. A VF hosts at most one vGPU."""
from __future__ import annotations

from compute_agent.drivers.base import (
    DeviceKind,
    HostInventory,
    Mdev,
    MdevParent,
    MdevType,
    NumaCell,
    PciDevice,
    PciKind,
)
from compute_agent.drivers.fake_sysfs import SysfsBuilder, VgpuCard
from compute_agent.drivers.libvirt.sysfs import SysfsReader
from compute_agent.tree.host_tree import (
    MdevTypePolicy,
    TreePolicy,
    build_tree,
    gpu_provider_name,
    numa_provider_name,
)

ROOT = "0f3e5a52-4f8b-4a43-9d8e-0c6a1b2d3e4f"
HOST = "gpuhost"
PF = "0000:41:00.0"
L40S = VgpuCard({557: "NVIDIA L40S-1Q", 558: "NVIDIA L40S-2Q"})


def policy(*types: str) -> TreePolicy:
    return TreePolicy(host=HOST, root_uuid=ROOT,
                      mdev_types=tuple(MdevTypePolicy(t) for t in types))


def vgpu_totals(built) -> dict[str, int]:
    """VF address -> its VGPU total, for every vGPU provider in the tree."""
    out = {}
    for p in built.tree:
        if "VGPU" in p.inventories:
            out[p.name] = p.inventories["VGPU"]["total"]
    return out


def name(address: str) -> str:
    return gpu_provider_name(HOST, address)


def host_from_sysfs(builder: SysfsBuilder) -> HostInventory:
    """The inventory the libvirt driver derives from these sysfs files
    (its sysfs half; libvirt lists the same PCI devices)."""
    reader = SysfsReader(str(builder.root))
    cells, w1 = reader.numa_cells(4)
    pci, w2 = reader.pci_devices()
    types, w3 = reader.mdev_types()
    mdevs, w4 = reader.mdevs()
    assert w1 + w2 + w3 + w4 == []
    return HostInventory(
        cpus=frozenset().union(*(c.cpus for c in cells)), memory_mb=8192,
        disk_gb=10, numa_cells=tuple(cells),
        pci_devices=tuple(pci.values()),
        mdev_parents=tuple(MdevParent(a, pci[a].numa_node, t,
                                      vendor_vfio=reader.vendor_vfio(a))
                           for a, t in sorted(types.items())),
        mdevs=tuple(mdevs))


def test_vendor_vfio_layout_counts_a_vf_in_use_as_one_used_instance(tmp_path):
    b = SysfsBuilder(tmp_path / "sys")
    b.add_numa_node(0, "0-7", 8192)
    free, used_2q, used_1q, also_free = b.add_nvidia_vf_layout(
        PF, "26b9", 0, L40S, num_vfs=4)
    b.set_current_vgpu_type(used_2q, 558)
    b.set_current_vgpu_type(used_1q, 557)

    built = build_tree(host_from_sysfs(b), policy("nvidia-558"))

    # One provider per VF that can take or holds a 2Q vGPU, each with
    # total 1, under the GPU's cell. The VF running a 1Q vGPU offers no
    # 2Q and is not reported; nor is the PF.
    assert vgpu_totals(built) == {name(free): 1, name(used_2q): 1,
                                  name(also_free): 1}
    cell = built.tree.by_name(numa_provider_name(HOST, 0))
    assert built.tree.by_name(name(used_2q)).parent_uuid == cell.uuid
    assert built.tree.by_name(name(used_2q)).traits == {
        "CUSTOM_MDEV_TYPE_NVIDIA_558"}


def test_a_vf_in_use_keeps_its_provider_when_current_vgpu_type_is_set(
        tmp_path):
    b = SysfsBuilder(tmp_path / "sys")
    b.add_numa_node(0, "0-7", 8192)
    (vf,) = b.add_nvidia_vf_layout(PF, "26b9", 0, L40S, num_vfs=1)
    before = build_tree(host_from_sysfs(b), policy("nvidia-558"))
    b.set_current_vgpu_type(vf, 558)  # an instance now runs on it
    after = build_tree(host_from_sysfs(b), policy("nvidia-558"))
    assert vgpu_totals(before) == vgpu_totals(after) == {name(vf): 1}


def _vf(address: str) -> PciDevice:
    return PciDevice(address, "10de", "2236", PciKind.VF, 0,
                     parent_address=PF)


def test_a_vf_hosts_at_most_one_vgpu_with_mdevs_too():
    """The mdev-bus flavour on VFs: each VF lists types of its own; its
    mdev, not current_vgpu_type, says it is taken."""
    a, b, c, d = (f"0000:41:00.{i}" for i in range(4, 8))
    t1, t2 = "nvidia-557", "nvidia-558"
    inv = HostInventory(
        cpus=frozenset(range(4)), memory_mb=8192, disk_gb=10,
        numa_cells=(NumaCell(0, frozenset(range(4)), 8192),),
        pci_devices=(PciDevice(PF, "10de", "2236", PciKind.PF, 0,
                               total_vfs=4, num_vfs=4),
                     _vf(a), _vf(b), _vf(c), _vf(d)),
        mdev_parents=(
            # a driver that claims more than one per VF is capped
            MdevParent(a, 0, (MdevType(t1, 2), MdevType(t2, 2))),
            # holds a t2 mdev: one used instance
            MdevParent(b, 0, (MdevType(t1, 0), MdevType(t2, 0))),
            # holds a t1 mdev: nothing of t2 left on it
            MdevParent(c, 0, (MdevType(t1, 0), MdevType(t2, 0))),
            # creates nothing now and holds nothing
            MdevParent(d, 0, (MdevType(t1, 0), MdevType(t2, 0)))),
        mdevs=(Mdev("9f2c1e34-6d0b-4c55-8a1e-3b7d2c4f5a60", t2, b),
               Mdev("9f2c1e34-6d0b-4c55-8a1e-3b7d2c4f5a61", t1, c)))
    assert vgpu_totals(build_tree(inv, policy(t2))) == {name(a): 1,
                                                        name(b): 1}


def test_a_whole_gpu_still_counts_mdevs_plus_available():
    gpu = "0000:06:00.0"
    inv = HostInventory(
        cpus=frozenset(range(4)), memory_mb=8192, disk_gb=10,
        pci_devices=(PciDevice(gpu, "10de", "13f2", PciKind.PCI, None),),
        mdev_parents=(MdevParent(gpu, None, (MdevType("nvidia-35", 3),)),),
        mdevs=(Mdev("9f2c1e34-6d0b-4c55-8a1e-3b7d2c4f5a62", "nvidia-35", gpu),))
    assert vgpu_totals(build_tree(inv, policy("nvidia-35"))) == {name(gpu): 4}


L40 = {557: "NVIDIA L40-12Q", 558: "NVIDIA L40-24Q"}


def vgpu_offers(built) -> dict[str, tuple[str, int]]:
    """VF provider -> (its type trait, reserved units)."""
    return {p.name: (next(iter(p.traits)), p.inventories["VGPU"]["reserved"])
            for p in built.tree if "VGPU" in p.inventories}


def test_a_pf_address_names_every_vf_of_the_gpu_and_a_vf_address_one(tmp_path):
    b = SysfsBuilder(tmp_path / "sys")
    b.add_numa_node(0, "0-7", 8192)
    vfs = b.add_nvidia_vf_layout(PF, "26b5", 0, VgpuCard(L40), num_vfs=3)
    other = b.add_nvidia_vf_layout("0000:42:00.0", "26b5", 0, VgpuCard(L40), num_vfs=2)
    by_pf = TreePolicy(host=HOST, root_uuid=ROOT, mdev_types=(
        MdevTypePolicy("nvidia-557", addresses=frozenset({PF, other[1]})),))
    built = build_tree(host_from_sysfs(b), by_pf)
    assert vgpu_totals(built) == {name(vf): 1 for vf in vfs + [other[1]]}
    # Each VF is a slot of its own, the VF itself, typed at claim time.
    pool = next(p for p in built.pools if p.provider_name == name(vfs[0]))
    assert (pool.kind, [s.device_id for s in pool.slots], pool.mdev_type,
            pool.mdev_parent) == (DeviceKind.VGPU_VF, [vfs[0]], "nvidia-557", None)


def test_each_vf_is_offered_as_one_type_and_reserved_while_it_can_create_none(tmp_path):
    b = SysfsBuilder(tmp_path / "sys")
    b.add_numa_node(0, "0-7", 8192)
    vfs = b.add_nvidia_vf_layout(PF, "26b5", 0, VgpuCard({**L40, 560: "NVIDIA L40-48Q"},
                                                         framebuffer_gb=48))
    # 558 first, on the last two VFs; 557 on the GPU.
    mixed = TreePolicy(host=HOST, root_uuid=ROOT, mdev_types=(
        MdevTypePolicy("nvidia-558", addresses=frozenset(vfs[2:])),
        MdevTypePolicy("nvidia-557", addresses=frozenset({PF}))))
    t557, t558 = "CUSTOM_MDEV_TYPE_NVIDIA_557", "CUSTOM_MDEV_TYPE_NVIDIA_558"
    assert vgpu_offers(build_tree(host_from_sysfs(b), mixed)) == {
        name(vfs[0]): (t557, 0), name(vfs[1]): (t557, 0),
        name(vfs[2]): (t558, 0), name(vfs[3]): (t558, 0)}
    # 36 GB taken: the 24 GB type no longer fits, so VF3 is offered as the
    # 12 GB one it still lists; VF2 holds its type.
    b.set_current_vgpu_type(vfs[2], 558)
    b.set_current_vgpu_type(vfs[0], 557)
    assert vgpu_offers(build_tree(host_from_sysfs(b), mixed)) == {
        name(vfs[0]): (t557, 0), name(vfs[1]): (t557, 0),
        name(vfs[2]): (t558, 0), name(vfs[3]): (t557, 0)}
    # All 48 GB taken: the free VFs list nothing and stay, reserved.
    b.set_current_vgpu_type(vfs[0], 0)
    b.set_current_vgpu_type(vfs[3], 558)
    assert vgpu_offers(build_tree(host_from_sysfs(b), mixed)) == {
        name(vfs[0]): (t557, 1), name(vfs[1]): (t557, 1),
        name(vfs[2]): (t558, 0), name(vfs[3]): (t558, 0)}
    # A VF holding a type no policy enables is not this agent's.
    b.set_current_vgpu_type(vfs[3], 0)
    b.set_current_vgpu_type(vfs[2], 0)
    b.set_current_vgpu_type(vfs[1], 560)
    assert name(vfs[1]) not in vgpu_offers(build_tree(host_from_sysfs(b), mixed))
