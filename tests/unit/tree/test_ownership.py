"""What the agent owns in Placement: others' traits and an operator's
reserved on device inventories survive every diff."""
from compute_agent.tree import ownership
from compute_agent.tree.provider_tree import (
    CreateProvider,
    DeleteProvider,
    Provider,
    ProviderTree,
    SetInventories,
    SetTraits,
    UpdateProvider,
    describe,
    diff,
    inventory,
)

ROOT = "00000000-0000-4000-8000-000000000000"
PF = "00000000-0000-4000-8000-000000000001"


def host(root_traits=frozenset(), pf_traits=frozenset(), vf_reserved=0, vfs=8,
         memory_reserved=512):
    return ProviderTree([
        Provider(ROOT, "h", None, {"MEMORY_MB": inventory(4096, reserved=memory_reserved)},
                 frozenset(root_traits)),
        Provider(PF, "h_0000:3B:00.0", ROOT,
                 {"CUSTOM_PCI_8086_154C": inventory(vfs, reserved=vf_reserved)},
                 frozenset(pf_traits)),
    ])


def test_outside_traits_are_kept_and_the_agents_are_put_back():
    current = host({"COMPUTE_STATUS_DISABLED", "CUSTOM_RACK_7", "COMPUTE_NODE"},
                   {"CUSTOM_OPERATOR_MARK"})
    desired = host({"COMPUTE_NODE", "OWNER_NOVA"},
                   {"COMPUTE_MANAGED_PCI_DEVICE"})
    assert diff(current, desired) == [
        SetTraits(ROOT, frozenset({"COMPUTE_STATUS_DISABLED", "CUSTOM_RACK_7",
                                   "COMPUTE_NODE", "OWNER_NOVA"})),
        SetTraits(PF, frozenset({"CUSTOM_OPERATOR_MARK",
                                 "COMPUTE_MANAGED_PCI_DEVICE"}))]


def test_an_idle_diff_with_outside_traits_is_empty():
    current = host({"COMPUTE_STATUS_DISABLED", "COMPUTE_NODE"})
    assert diff(current, host({"COMPUTE_NODE"})) == []


def test_a_trait_the_agent_stops_reporting_is_removed():
    current = host({"COMPUTE_NODE", "HW_CPU_X86_AVX2", "OWNER_CYBORG"},
                   {"CUSTOM_MDEV_TYPE_NVIDIA_35", "CUSTOM_PHYSNET_OLD"})
    desired = host({"COMPUTE_NODE"}, {"CUSTOM_MDEV_TYPE_NVIDIA_36"})
    assert diff(current, desired) == [
        SetTraits(ROOT, frozenset({"COMPUTE_NODE"})),
        SetTraits(PF, frozenset({"CUSTOM_MDEV_TYPE_NVIDIA_36"}))]


def test_a_spec_trait_moved_to_another_device_leaves_the_first():
    """A trait reported anywhere in the tree is the agent's everywhere."""
    current = host(pf_traits={"CUSTOM_FAST"})
    desired = host(root_traits={"CUSTOM_FAST"})
    assert SetTraits(PF, frozenset()) in diff(current, desired)


def test_cpu_traits_outside_the_feature_mapping_are_not_the_agents():
    assert "HW_CPU_X86_AMD_SEV" not in ownership.CPU_FEATURE_TRAITS
    assert "HW_CPU_X86_AVX2" in ownership.CPU_FEATURE_TRAITS
    assert "HW_CPU_X86_SSE3" in ownership.CPU_FEATURE_TRAITS


def test_an_operators_reserved_on_a_device_inventory_is_kept():
    assert diff(host(vf_reserved=2), host()) == []


def test_an_operators_reserved_survives_a_total_change():
    ops = diff(host(vf_reserved=2), host(vfs=6))
    assert ops == [SetInventories(PF, {"CUSTOM_PCI_8086_154C": inventory(6, reserved=2)})]


def test_an_operators_reserved_stays_below_a_shrunk_total():
    ops = diff(host(vf_reserved=4, vfs=8), host(vfs=2))
    assert ops == [SetInventories(PF, {"CUSTOM_PCI_8086_154C": inventory(2, reserved=1)})]


def test_the_agents_own_whole_reservation_ends_with_its_reason():
    """A device found wholly reserved (a kept provider whose device came
    back, new inventory now healed) goes back to what the agent reports."""
    ops = diff(host(vf_reserved=8), host())
    assert ops == [SetInventories(PF, {"CUSTOM_PCI_8086_154C": inventory(8)})]


def test_the_agents_reason_to_reserve_wins():
    ops = diff(host(vf_reserved=2), host(vf_reserved=8))
    assert ops == [SetInventories(PF, {"CUSTOM_PCI_8086_154C": inventory(8, reserved=8)})]


def test_a_health_reservation_is_the_agents_and_ends_when_the_device_recovers():
    """A provider marked unhealthy in Placement holds the agent's reserved,
    even a partial one (bad VFs), which would otherwise read as an
    operator's."""
    marked = {ownership.UNHEALTHY_TRAIT, ownership.UNHEALTHY_TRAIT + "_AER_FATAL"}
    current = host(pf_traits=marked | {"COMPUTE_MANAGED_PCI_DEVICE"}, vf_reserved=2)
    ops = diff(current, host(pf_traits={"COMPUTE_MANAGED_PCI_DEVICE"}))
    assert ops == [SetInventories(PF, {"CUSTOM_PCI_8086_154C": inventory(8)}),
                   SetTraits(PF, frozenset({"COMPUTE_MANAGED_PCI_DEVICE"}))]


def test_a_partial_reservation_without_the_mark_stays_the_operators():
    assert diff(host(vf_reserved=2), host(pf_traits=set())) == []


def test_reserved_on_host_classes_is_the_configs():
    ops = diff(host(memory_reserved=100), host(memory_reserved=512))
    assert ops == [SetInventories(ROOT, {"MEMORY_MB": inventory(4096, reserved=512)})]


# --- the log line of each write ------------------------------------------------

def test_each_change_is_described_by_provider_name_uuid_and_what_changed():
    before = host({"COMPUTE_NODE", "CUSTOM_A"}).get(ROOT)
    pf = host().get(PF)
    assert describe(CreateProvider(pf), None) == (
        f"created provider h_0000:3B:00.0 ({PF}) under {ROOT}")
    assert describe(DeleteProvider(PF, pf.name), pf) == (
        f"deleted provider h_0000:3B:00.0 ({PF})")
    assert describe(SetTraits(ROOT, frozenset({"CUSTOM_A", "OWNER_NOVA"})), before) == (
        f"provider h ({ROOT}): traits +OWNER_NOVA -COMPUTE_NODE")
    assert describe(SetInventories(PF, {"CUSTOM_PCI_8086_154C": inventory(6, reserved=2),
                                        "VGPU": inventory(1)}), pf) == (
        f"provider h_0000:3B:00.0 ({PF}): inventory CUSTOM_PCI_8086_154C "
        "total 8->6 reserved 0->2 max_unit 8->6, inventory VGPU added, total 1 reserved 0")
    assert describe(UpdateProvider(PF, "h_x", None), pf) == (
        f"provider h_0000:3B:00.0 ({PF}): renamed to h_x, parent {ROOT}->None")
