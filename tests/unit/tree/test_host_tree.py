"""Building the desired provider tree from a host and the operator policy."""
import json
import uuid

import pytest

from compute_agent.drivers.base import DeviceKind
from compute_agent.drivers.fake import host_from_dict
from compute_agent.exception import ConfigError
from compute_agent.tree.device_spec import parse_specs
from compute_agent.tree.host_tree import (
    MdevTypePolicy,
    TreeMode,
    TreePolicy,
    build_tree,
    child_uuid,
    gpu_provider_name,
    numa_provider_name,
    pci_provider_name,
    pmem_provider_name,
)
from compute_agent.tree.provider_tree import inventory, normalized_inventories

ROOT = "5e1c0c5a-8a4e-4d4b-9c0e-2f1d6b7a9c31"
HOST = "cmp1"

PF = "0000:3b:00.0"
WHOLE = "0000:5e:00.0"
IGNORED = "0000:60:00.0"
NO_NUMA = "0000:d8:00.0"
GPU = "0000:af:00.0"

VF_SPEC = json.dumps({"vendor_id": "8086", "product_id": "154c"})
WHOLE_SPEC = json.dumps({"vendor_id": "10de", "product_id": "1db4"})
NO_NUMA_SPEC = json.dumps({"address": NO_NUMA})


def host_dict(**overrides) -> dict:
    data = {
        "disk_gb": 100,
        "numa_cells": [
            {"id": 0, "cpus": "0-7", "memory_mb": 16384},
            {"id": 1, "cpus": "8-15", "memory_mb": 16384},
        ],
        "pci_devices": [
            {"address": PF, "vendor_id": "8086", "product_id": "1572",
             "numa_node": 0, "vfs": {"count": 8, "product_id": "154c"}},
            {"address": WHOLE, "vendor_id": "10de", "product_id": "1db4",
             "numa_node": 1},
            {"address": IGNORED, "vendor_id": "1234", "product_id": "5678",
             "numa_node": 0},
            {"address": NO_NUMA, "vendor_id": "15b3", "product_id": "1017"},
        ],
        "gpus": [
            {"address": GPU, "numa_node": 1,
             "mdev_types": {"nvidia-35": {"available_instances": 14},
                            "nvidia-36": {"available_instances": 8}},
             "mdevs": [{"uuid": str(uuid.UUID(int=1)), "type": "nvidia-35"},
                       {"uuid": str(uuid.UUID(int=2)), "type": "nvidia-35"},
                       {"uuid": str(uuid.UUID(int=3)), "type": "nvidia-36"}]},
        ],
        "pmem_namespaces": [
            {"name": "ns0", "size_bytes": 1 << 30, "numa_node": 0},
            {"name": "ns1", "size_bytes": 1 << 30, "numa_node": 0},
            {"name": "ns2", "size_bytes": 1 << 30, "numa_node": 1},
            {"name": "ns3", "size_bytes": 1 << 34, "numa_node": 1},
        ],
    }
    data.update(overrides)
    return data


def policy(**overrides) -> TreePolicy:
    values = dict(
        host=HOST, root_uuid=ROOT, reserved_memory_mb=512,
        reserved_disk_mb=2048,
        device_specs=parse_specs([VF_SPEC, WHOLE_SPEC, NO_NUMA_SPEC]),
        mdev_types=(MdevTypePolicy("nvidia-35"),),
        pmem_labels=(("SMALL", frozenset({"ns0", "ns1", "ns2"})),
                     ("LARGE", frozenset({"ns3"}))))
    values.update(overrides)
    return TreePolicy(**values)


def build(host=None, **policy_overrides):
    return build_tree(host_from_dict(host or host_dict()),
                      policy(**policy_overrides))


def summary(tree) -> dict:
    """name -> (parent name, normalized inventories, traits)."""
    out = {}
    for p in tree:
        parent = tree.get(p.parent_uuid).name if p.parent_uuid else None
        out[p.name] = (parent, normalized_inventories(p.inventories), p.traits)
    return out


def node(parent, invs, traits=()):
    return (parent, normalized_inventories(invs), frozenset(traits))


def n(suffix: str) -> str:
    return f"{HOST}_{suffix}"


# --- the full nested tree ----------------------------------------------------

def test_full_nested_tree():
    built = build()
    assert built.warnings == []
    assert summary(built.tree) == {
        HOST: node(None, {"DISK_GB": inventory(100, reserved=2)},
                   {"COMPUTE_NODE", "OWNER_NOVA"}),
        n("numa_0"): node(HOST, {
            "VCPU": inventory(8, allocation_ratio=4.0),
            "MEMORY_MB": inventory(16384, reserved=512)}, {"HW_NUMA_ROOT"}),
        n("numa_1"): node(HOST, {
            "VCPU": inventory(8, allocation_ratio=4.0),
            "MEMORY_MB": inventory(16384)}, {"HW_NUMA_ROOT"}),
        n("0000:3B:00.0"): node(n("numa_0"), {"CUSTOM_PCI_8086_154C": inventory(8)},
                                {"COMPUTE_MANAGED_PCI_DEVICE"}),
        n("0000:5E:00.0"): node(n("numa_1"),
                                {"CUSTOM_PCI_10DE_1DB4": inventory(1)},
                                {"COMPUTE_MANAGED_PCI_DEVICE"}),
        n("0000:D8:00.0"): node(HOST, {"CUSTOM_PCI_15B3_1017": inventory(1)},
                                {"COMPUTE_MANAGED_PCI_DEVICE"}),
        n("pci_0000_af_00_0"): node(n("numa_1"), {"VGPU": inventory(16)},
                                    {"CUSTOM_MDEV_TYPE_NVIDIA_35"}),
        n("pmem_SMALL_numa_0"): node(
            n("numa_0"), {"CUSTOM_PMEM_NAMESPACE_SMALL": inventory(2)}),
        n("pmem_SMALL_numa_1"): node(
            n("numa_1"), {"CUSTOM_PMEM_NAMESPACE_SMALL": inventory(1)}),
        n("pmem_LARGE_numa_1"): node(
            n("numa_1"), {"CUSTOM_PMEM_NAMESPACE_LARGE": inventory(1)}),
    }


def test_root_is_the_host_with_its_own_uuid():
    tree = build().tree
    assert tree.root.uuid == ROOT
    assert tree.root.name == HOST


def test_root_reports_compute_node_the_owner_and_the_cpu_features():
    tree = build(host_dict(cpu_features=["avx2", "sse4.2", "pni", "ds", "vmx"])).tree
    assert tree.root.traits == {"COMPUTE_NODE", "OWNER_NOVA", "HW_CPU_X86_AVX2",
                                "HW_CPU_X86_SSE42", "HW_CPU_X86_SSE3", "HW_CPU_X86_VMX"}


def test_root_reports_the_configured_owner_trait():
    assert build(owner_trait="CUSTOM_OWNER_ME").tree.root.traits == {
        "COMPUTE_NODE", "CUSTOM_OWNER_ME"}


def test_provider_names_follow_nova():
    assert pci_provider_name(HOST, PF) == "cmp1_0000:3B:00.0"
    assert gpu_provider_name(HOST, GPU) == "cmp1_pci_0000_af_00_0"
    assert numa_provider_name(HOST, 1) == "cmp1_numa_1"
    assert pmem_provider_name(HOST, "SMALL", 0) == "cmp1_pmem_SMALL_numa_0"
    assert pmem_provider_name(HOST, "SMALL", None) == "cmp1_pmem_SMALL"


def test_devices_in_a_pci_domain_past_ffff_get_nova_names():
    # Intel VMD puts the devices behind it in domains 10000 and up.
    host = host_dict(
        pci_devices=[{"address": "10000:e1:00.0", "vendor_id": "8086",
                      "product_id": "1572", "numa_node": 0,
                      "vfs": {"count": 2, "product_id": "154c"}}],
        gpus=[{"address": "10000:af:00.0", "numa_node": 1,
               "mdev_types": {"nvidia-35": {"available_instances": 4}}}])
    tree = build(host).tree
    assert pci_provider_name(HOST, "10000:e1:00.0") == "cmp1_10000:E1:00.0"
    assert gpu_provider_name(HOST, "10000:af:00.0") == (
        "cmp1_pci_10000_af_00_0")
    assert tree.by_name("cmp1_10000:E1:00.0").inventories[
        "CUSTOM_PCI_8086_154C"]["total"] == 2
    assert tree.by_name("cmp1_pci_10000_af_00_0").inventories[
        "VGPU"]["total"] == 4


# --- PCI ---------------------------------------------------------------------

def test_nothing_is_reported_without_an_allowlist():
    tree = build(device_specs=()).tree
    names = {p.name for p in tree}
    assert not any(":" in name for name in names)
    assert not any("PCI" in rc or rc == "SRIOV_NET_VF"
                   for p in tree for rc in p.inventories)


def test_device_not_allowlisted_is_not_reported():
    names = {p.name for p in build().tree}
    assert pci_provider_name(HOST, IGNORED) not in names


def test_device_without_numa_affinity_goes_under_the_root():
    tree = build().tree
    assert tree.by_name(n("0000:D8:00.0")).parent_uuid == ROOT


def test_device_on_an_unknown_cell_goes_under_the_root_with_a_warning():
    host = host_dict()
    host["pci_devices"][1]["numa_node"] = 7
    built = build(host)
    assert built.tree.by_name(n("0000:5E:00.0")).parent_uuid == ROOT
    assert any(WHOLE in w and "7" in w for w in built.warnings)


def test_vf_spec_resource_class_and_traits_land_on_the_pf_provider():
    spec = json.dumps({"vendor_id": "8086", "product_id": "154c",
                       "resource_class": "fast-vf",
                       "traits": ["physnet1"]})
    tree = build(device_specs=parse_specs([spec])).tree
    pf = tree.by_name(n("0000:3B:00.0"))
    assert pf.inventories == {"CUSTOM_FAST_VF": inventory(8)}
    assert pf.traits == {"COMPUTE_MANAGED_PCI_DEVICE", "CUSTOM_PHYSNET1"}


def test_vfs_count_as_nova_s_class_of_the_vf_by_default():
    """A nova PCI alias asking for CUSTOM_PCI_8086_154C finds the VFs."""
    tree = build(device_specs=parse_specs([VF_SPEC])).tree
    assert tree.by_name(n("0000:3B:00.0")).inventories == {
        "CUSTOM_PCI_8086_154C": inventory(8)}


def test_a_spec_s_physical_network_becomes_a_physnet_trait():
    spec = json.dumps({"vendor_id": "8086", "product_id": "154c",
                       "physical_network": "phys-net.1"})
    whole = json.dumps({"address": WHOLE, "physical_network": "data"})
    tree = build(device_specs=parse_specs([spec, whole])).tree
    assert tree.by_name(n("0000:3B:00.0")).traits == {
        "COMPUTE_MANAGED_PCI_DEVICE", "CUSTOM_PHYSNET_PHYS_NET_1"}
    assert tree.by_name(n("0000:5E:00.0")).traits == {
        "COMPUTE_MANAGED_PCI_DEVICE", "CUSTOM_PHYSNET_DATA"}


def test_a_live_migratable_spec_marks_its_provider_as_nova_does():
    marked = json.dumps({"vendor_id": "8086", "product_id": "154c",
                         "live_migratable": "yes"})
    whole = json.dumps({"address": WHOLE})
    tree = build(device_specs=parse_specs([marked, whole])).tree
    assert tree.by_name(n("0000:3B:00.0")).traits == {
        "COMPUTE_MANAGED_PCI_DEVICE", "HW_PCI_LIVE_MIGRATABLE"}
    assert tree.by_name(n("0000:5E:00.0")).traits == {"COMPUTE_MANAGED_PCI_DEVICE"}


def test_vfs_of_one_pf_allowlisted_by_its_address_and_vf_product():
    spec = json.dumps({"address": PF, "product_id": "154c"})
    tree = build(device_specs=parse_specs([spec])).tree
    assert (tree.by_name(n("0000:3B:00.0")).inventories
            == {"CUSTOM_PCI_8086_154C": inventory(8)})


def test_whole_pf_allowlisted_uses_the_pci_class():
    spec = json.dumps({"vendor_id": "8086", "product_id": "1572"})
    tree = build(device_specs=parse_specs([spec])).tree
    assert (tree.by_name(n("0000:3B:00.0")).inventories
            == {"CUSTOM_PCI_8086_1572": inventory(1)})


def test_pf_and_its_own_vf_both_allowlisted_is_refused_naming_both_specs():
    pf_spec = json.dumps({"vendor_id": "8086", "product_id": "1572"})
    with pytest.raises(ConfigError) as err:
        build(device_specs=parse_specs([pf_spec, VF_SPEC]))
    message = str(err.value)
    assert "[pci] device_spec" in message
    assert pf_spec in message and VF_SPEC in message
    assert PF in message


# --- vGPU --------------------------------------------------------------------

def test_vgpu_total_counts_existing_mdevs_of_the_enabled_type_only():
    tree = build(mdev_types=(MdevTypePolicy("nvidia-36"),)).tree
    gpu = tree.by_name(n("pci_0000_af_00_0"))
    assert gpu.inventories == {"VGPU": inventory(9)}
    assert gpu.traits == {"CUSTOM_MDEV_TYPE_NVIDIA_36"}


def test_gpu_without_an_enabled_type_is_not_reported():
    tree = build(mdev_types=()).tree
    assert tree.by_name(n("pci_0000_af_00_0")) is None


def test_mdev_type_restricted_to_other_addresses_skips_the_gpu():
    tree = build(mdev_types=(MdevTypePolicy(
        "nvidia-35", addresses=frozenset({"0000:00:01.0"})),)).tree
    assert tree.by_name(n("pci_0000_af_00_0")) is None


def test_mdev_type_with_a_custom_class():
    tree = build(mdev_types=(MdevTypePolicy("nvidia-35", "CUSTOM_VGPU_2Q"),)).tree
    assert (tree.by_name(n("pci_0000_af_00_0")).inventories
            == {"CUSTOM_VGPU_2Q": inventory(16)})


def test_gpu_both_passed_through_and_split_into_mdevs_is_refused():
    host = host_dict()
    host["pci_devices"].append({"address": GPU, "vendor_id": "10de",
                                "product_id": "1eb8", "numa_node": 1})
    spec = json.dumps({"address": GPU})
    with pytest.raises(ConfigError, match="0000:af:00.0"):
        build(host, device_specs=parse_specs([spec]))


# --- flat mode ---------------------------------------------------------------

def test_flat_mode_keeps_compute_on_the_root_and_devices_under_it():
    tree = build(mode=TreeMode.FLAT).tree
    root = tree.root
    assert root.inventories["VCPU"] == inventory(16, allocation_ratio=4.0)
    assert root.inventories["MEMORY_MB"] == inventory(32768, reserved=512)
    assert tree.by_name(n("numa_0")) is None
    assert all(p.parent_uuid == ROOT for p in tree if p is not root)
    assert (tree.by_name(n("pmem_SMALL")).inventories
            == {"CUSTOM_PMEM_NAMESPACE_SMALL": inventory(3)})
    assert tree.by_name(n("0000:3B:00.0")) is not None
    assert tree.by_name(n("pci_0000_af_00_0")) is not None


# --- numa_devices mode -------------------------------------------------------

def test_numa_devices_mode_keeps_compute_on_the_root_and_devices_under_their_cell():
    built = build(mode=TreeMode.NUMA_DEVICES)
    assert built.warnings == []
    nested = summary(build().tree)
    cells = {n("numa_0"), n("numa_1")}
    assert summary(built.tree) == {
        **{name: row for name, row in nested.items() if name not in cells | {HOST}},
        HOST: node(None, {"DISK_GB": inventory(100, reserved=2),
                          "VCPU": inventory(16, allocation_ratio=4.0),
                          "MEMORY_MB": inventory(32768, reserved=512)},
                   {"COMPUTE_NODE", "OWNER_NOVA"}),
        **{cell: node(HOST, {}, {"HW_NUMA_ROOT"}) for cell in cells}}
    # The devices' providers are the nested tree's, UUIDs and all: only
    # compute moves between the two modes.
    assert ({p.name: p.uuid for p in built.tree}
            == {p.name: p.uuid for p in build().tree})


@pytest.mark.parametrize("mode", list(TreeMode))
def test_pinned_cpus_keep_their_cell_in_every_mode(mode):
    built = build(mode=mode, dedicated_cpus=frozenset({1, 9}))
    slots = {s.device_id: s.numa_node for p in built.pools
             if p.resource_class == "PCPU" for s in p.slots}
    assert slots == {"1": 0, "9": 1}


def test_nested_host_without_cells_keeps_compute_on_the_root():
    host = {"cpus": "0-3", "memory_mb": 4096, "disk_gb": 10}
    tree = build(host).tree
    assert len(tree) == 1
    assert set(tree.root.inventories) == {"VCPU", "MEMORY_MB", "DISK_GB"}


@pytest.mark.parametrize("mode", list(TreeMode))
def test_counted_pools_of_the_root_are_host_resources_and_of_a_cell_numa(mode):
    kinds = {(p.provider_name, p.resource_class): p.kind
             for p in build(mode=mode).pools if p.kind.counted}
    if mode is TreeMode.NESTED:
        assert kinds == {(HOST, "DISK_GB"): DeviceKind.HOST_RESOURCES,
                         **{(n(f"numa_{c}"), rc): DeviceKind.NUMA
                            for c in (0, 1) for rc in ("VCPU", "MEMORY_MB")}}
    else:
        assert kinds == {(HOST, rc): DeviceKind.HOST_RESOURCES
                         for rc in ("DISK_GB", "VCPU", "MEMORY_MB")}


# --- CPU sets ----------------------------------------------------------------

def test_dedicated_and_shared_sets_split_pcpu_and_vcpu_per_cell():
    tree = build(dedicated_cpus=frozenset({0, 1, 2, 8}),
                 shared_cpus=frozenset({3, 4, 9, 10, 11})).tree
    cell0 = tree.by_name(n("numa_0")).inventories
    cell1 = tree.by_name(n("numa_1")).inventories
    assert cell0["PCPU"] == inventory(3)
    assert cell0["VCPU"] == inventory(2, allocation_ratio=4.0)
    assert cell1["PCPU"] == inventory(1)
    assert cell1["VCPU"] == inventory(3, allocation_ratio=4.0)


def test_dedicated_set_alone_leaves_no_vcpu():
    tree = build(dedicated_cpus=frozenset(range(4))).tree
    cell0 = tree.by_name(n("numa_0")).inventories
    cell1 = tree.by_name(n("numa_1")).inventories
    assert cell0["PCPU"] == inventory(4)
    assert "VCPU" not in cell0
    assert "VCPU" not in cell1 and "PCPU" not in cell1


def test_shared_set_alone_limits_vcpu():
    tree = build(shared_cpus=frozenset({0, 1, 8})).tree
    assert tree.by_name(n("numa_0")).inventories["VCPU"]["total"] == 2
    assert tree.by_name(n("numa_1")).inventories["VCPU"]["total"] == 1
    assert all("PCPU" not in p.inventories for p in tree)


def test_overlapping_cpu_sets_are_refused_naming_both_options():
    with pytest.raises(ConfigError) as err:
        build(dedicated_cpus=frozenset({0, 1, 2}), shared_cpus=frozenset({2, 3}))
    message = str(err.value)
    assert "cpu_dedicated_set" in message and "cpu_shared_set" in message
    assert "2" in message


@pytest.mark.parametrize("option", ["dedicated_cpus", "shared_cpus"])
def test_cpus_not_on_the_host_are_refused_naming_the_option(option):
    with pytest.raises(ConfigError) as err:
        build(**{option: frozenset({1, 99})})
    message = str(err.value)
    name = {"dedicated_cpus": "[compute] cpu_dedicated_set",
            "shared_cpus": "[compute] cpu_shared_set"}[option]
    assert name in message
    assert "99" in message


# --- memory and disk ---------------------------------------------------------

def test_reserved_memory_is_on_the_first_cell_only():
    host = host_dict(numa_cells=[
        {"id": 1, "cpus": "8-15", "memory_mb": 16384},
        {"id": 0, "cpus": "0-7", "memory_mb": 16384}])
    tree = build(host, reserved_memory_mb=1024).tree
    assert tree.by_name(n("numa_0")).inventories["MEMORY_MB"]["reserved"] == 1024
    assert tree.by_name(n("numa_1")).inventories["MEMORY_MB"]["reserved"] == 0


MEMORYLESS_CELLS = [{"id": 0, "cpus": "0-7", "memory_mb": 0},
                    {"id": 1, "cpus": "8-15", "memory_mb": 16384}]


def test_memoryless_cell_has_cpus_and_no_memory_inventory():
    # Placement refuses an inventory of total 0, so the class is left out.
    tree = build(host_dict(numa_cells=MEMORYLESS_CELLS)).tree
    cell0 = tree.by_name(n("numa_0")).inventories
    assert set(cell0) == {"VCPU"} and cell0["VCPU"]["total"] == 8
    assert tree.by_name(n("numa_1")).inventories["MEMORY_MB"]["total"] == 16384


def test_reserved_memory_goes_to_the_first_cell_with_memory():
    tree = build(host_dict(numa_cells=MEMORYLESS_CELLS),
                 reserved_memory_mb=1024).tree
    assert tree.by_name(n("numa_1")).inventories["MEMORY_MB"]["reserved"] == 1024


def test_reserved_memory_is_capped_at_the_cell_size():
    tree = build(reserved_memory_mb=1 << 20).tree
    assert tree.by_name(n("numa_0")).inventories["MEMORY_MB"]["reserved"] == 16384


def test_reserved_disk_is_rounded_up_to_whole_gigabytes():
    tree = build(reserved_disk_mb=1025).tree
    assert tree.root.inventories["DISK_GB"]["reserved"] == 2


def test_allocation_ratios_come_from_the_policy():
    tree = build(cpu_allocation_ratio=2.0, ram_allocation_ratio=1.5,
                 disk_allocation_ratio=3.0).tree
    cell = tree.by_name(n("numa_0")).inventories
    assert cell["VCPU"]["allocation_ratio"] == 2.0
    assert cell["MEMORY_MB"]["allocation_ratio"] == 1.5
    assert tree.root.inventories["DISK_GB"]["allocation_ratio"] == 3.0


# --- UUIDs -------------------------------------------------------------------

def test_child_uuids_are_uuid5_of_the_root_and_name():
    tree = build().tree
    for p in tree:
        if p.uuid != ROOT:
            assert p.uuid == str(uuid.uuid5(uuid.UUID(ROOT), p.name))
    # Pinned across releases: the first 16 bytes of SHA-1 over ROOT's bytes
    # then b"cmp1_numa_0", with RFC 4122's version 5 and variant bits set,
    # computed once with hashlib rather than uuid5.
    assert tree.by_name(n("numa_0")).uuid == "66c3b1d7-cf6d-51d0-906b-02671e2c1c3a"
    assert child_uuid(ROOT, n("numa_0")) == "66c3b1d7-cf6d-51d0-906b-02671e2c1c3a"


def test_two_builds_give_the_same_tree():
    first, second = build().tree, build().tree
    assert summary(first) == summary(second)
    assert {p.name: p.uuid for p in first} == {p.name: p.uuid for p in second}


def test_another_root_gives_other_child_uuids():
    other = str(uuid.UUID(int=42))
    a, b = build().tree, build(root_uuid=other).tree
    assert (a.by_name(n("numa_0")).uuid != b.by_name(n("numa_0")).uuid)


# --- pmem --------------------------------------------------------------------

def test_missing_pmem_namespace_warns_and_is_not_reported():
    built = build(pmem_labels=(("SMALL", frozenset({"ns0", "nsX"})),))
    assert any("nsX" in w for w in built.warnings)
    assert (built.tree.by_name(n("pmem_SMALL_numa_0")).inventories
            == {"CUSTOM_PMEM_NAMESPACE_SMALL": inventory(1)})


def test_namespace_under_two_labels_is_refused():
    with pytest.raises(ConfigError, match="ns0"):
        build(pmem_labels=(("A", frozenset({"ns0"})), ("B", frozenset({"ns0"}))))


def test_pmem_namespace_without_numa_goes_under_the_root():
    host = host_dict(pmem_namespaces=[{"name": "ns0", "size_bytes": 1 << 30}])
    tree = build(host, pmem_labels=(("SMALL", frozenset({"ns0"})),)).tree
    p = tree.by_name(n("pmem_SMALL"))
    assert p.parent_uuid == ROOT
    assert p.inventories == {"CUSTOM_PMEM_NAMESPACE_SMALL": inventory(1)}


def test_a_one_time_use_spec_marks_its_provider_and_its_slots():
    """nova's trait on the provider, for a whole device and, beyond nova,
    for a PF whose VFs are one-time-use; the pools say which slots are,
    and the built tree keeps each one's spec for its cleaning."""
    vfs = json.dumps({"vendor_id": "8086", "product_id": "154c", "one_time_use": "yes"})
    whole = json.dumps({"address": WHOLE, "one_time_use": "yes",
                        "clean_command": ["/bin/true"]})
    built = build(device_specs=parse_specs([vfs, whole, NO_NUMA_SPEC]))
    for name in ("0000:3B:00.0", "0000:5E:00.0"):
        assert "HW_PCI_ONE_TIME_USE" in built.tree.by_name(n(name)).traits
    assert "HW_PCI_ONE_TIME_USE" not in built.tree.by_name(n("0000:D8:00.0")).traits
    by_name = {p.provider_name: p for p in built.pools}
    assert by_name[n("0000:5E:00.0")].one_time_use == {WHOLE}
    assert len(by_name[n("0000:3B:00.0")].one_time_use) == 8
    assert by_name[n("0000:D8:00.0")].one_time_use == frozenset()
    assert built.one_time_use[WHOLE].clean_command == ("/bin/true",)
    assert NO_NUMA not in built.one_time_use
