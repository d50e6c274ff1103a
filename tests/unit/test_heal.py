"""The reserved-until-healed rule and the heal plan, without Placement."""
from __future__ import annotations

import pytest

from agent.claims import Pool, Slot
from agent.heal import Consumer, HealRefused, hold_unhealed, plan_heal
from agent.provider_tree import Provider, ProviderTree, inventory
from agent.state import Assignment, Migration
from drivers.base import DeviceKind

ROOT, CELL0, CELL1, PF = "root", "cell0", "cell1", "pf"


def flat() -> ProviderTree:
    return ProviderTree([
        Provider(ROOT, "h", None, {"VCPU": inventory(8), "MEMORY_MB": inventory(4096)},
                 generation=3),
        Provider(PF, "h_PF", ROOT, {"CUSTOM_PCI_8086_154C": inventory(4)},
                 frozenset({"COMPUTE_MANAGED_PCI_DEVICE"}), generation=1)])


def nested(pf_class: str = "CUSTOM_PCI_8086_154C") -> ProviderTree:
    return ProviderTree([
        Provider(ROOT, "h", None, {}),
        Provider(CELL0, "h_numa_0", ROOT, {"VCPU": inventory(4), "MEMORY_MB": inventory(2048)},
                 frozenset({"HW_NUMA_ROOT"})),
        Provider(CELL1, "h_numa_1", ROOT, {"VCPU": inventory(4), "MEMORY_MB": inventory(2048)},
                 frozenset({"HW_NUMA_ROOT"})),
        Provider(PF, "h_PF", CELL0, {pf_class: inventory(4)},
                 frozenset({"COMPUTE_MANAGED_PCI_DEVICE"}))])


def test_a_class_moved_off_a_used_provider_keeps_it_and_reserves_the_new_homes():
    held = hold_unhealed(flat(), nested(), {ROOT: {"VCPU": 2}})
    assert held.tree.get(ROOT).inventories["VCPU"] == flat().get(ROOT).inventories["VCPU"]
    for cell in (CELL0, CELL1):
        vcpu = held.tree.get(cell).inventories["VCPU"]
        assert vcpu["reserved"] == vcpu["total"]
        # Memory moves too, but nobody holds it: it goes live at once.
        assert held.tree.get(cell).inventories["MEMORY_MB"]["reserved"] == 0
    assert "MEMORY_MB" not in held.tree.get(ROOT).inventories


def test_nothing_used_goes_live_at_once():
    model = nested()
    assert hold_unhealed(flat(), model, {ROOT: {"VCPU": 0}}).tree is model


def test_a_device_whose_class_changes_reports_the_new_class_fully_reserved():
    held = hold_unhealed(flat(), nested("SRIOV_NET_VF"), {PF: {"CUSTOM_PCI_8086_154C": 1}})
    pf = held.tree.get(PF).inventories
    assert pf["CUSTOM_PCI_8086_154C"]["reserved"] == 0
    assert pf["SRIOV_NET_VF"]["reserved"] == 4


POOLS = {CELL0: {"VCPU": Pool("h_numa_0", "VCPU", DeviceKind.NUMA, 16, numa_node=0),
                 "MEMORY_MB": Pool("h_numa_0", "MEMORY_MB", DeviceKind.NUMA, 2048,
                                   numa_node=0)},
         CELL1: {"VCPU": Pool("h_numa_1", "VCPU", DeviceKind.NUMA, 16, numa_node=1),
                 "MEMORY_MB": Pool("h_numa_1", "MEMORY_MB", DeviceKind.NUMA, 2048,
                                   numa_node=1)},
         PF: {"SRIOV_NET_VF": Pool("h_PF", "SRIOV_NET_VF", DeviceKind.VF, 4,
                                   tuple(Slot(f"vf{i}", 0) for i in range(4)), 0)}}


def consumer(uuid: str, allocations: dict) -> Consumer:
    return Consumer(uuid, allocations, "p", "u", 1, "INSTANCE")


def vf_row(uuid: str, device: str) -> Assignment:
    return Assignment("a-" + uuid, uuid, uuid, "instance", None, "CUSTOM_PCI_8086_154C",
                      PF, DeviceKind.VF, device, 1, "claimed", "boot")


def test_cpu_and_memory_follow_the_instances_device_to_its_cell():
    model = nested("SRIOV_NET_VF")
    c = consumer("c1", {ROOT: {"VCPU": 2, "MEMORY_MB": 512},
                        PF: {"CUSTOM_PCI_8086_154C": 1}, "elsewhere": {"DISK_GB": 5}})
    plan = plan_heal(flat(), model, POOLS, {"c1": c}, [vf_row("c1", "vf2")], [])
    assert plan.consumers["c1"].allocations == {
        CELL0: {"VCPU": 2, "MEMORY_MB": 512}, PF: {"SRIOV_NET_VF": 1},
        "elsewhere": {"DISK_GB": 5}}
    assert plan.inventories[ROOT] == (3, {})


def test_instances_without_a_cell_go_by_the_even_rule():
    cs = {f"c{i}": consumer(f"c{i}", {ROOT: {"VCPU": 1, "MEMORY_MB": 1024}})
          for i in range(2)}
    plan = plan_heal(flat(), nested(), POOLS, cs, [], [])
    assert {c.allocations and next(iter(c.allocations)) for c in plan.consumers.values()} \
        == {CELL0, CELL1}


def test_an_instance_bigger_than_any_cell_is_refused_by_name():
    big = consumer("big", {ROOT: {"VCPU": 1, "MEMORY_MB": 4096}})
    with pytest.raises(HealRefused, match="big: needs"):
        plan_heal(flat(), nested(), POOLS, {"big": big}, [], [])


def test_a_consumer_in_the_middle_of_a_move_is_refused_by_name():
    c = consumer("c1", {ROOT: {"VCPU": 1}})
    move = Migration("m1", "c1", "resize", "source", "active")
    with pytest.raises(HealRefused, match="c1: is in the middle of a resize"):
        plan_heal(flat(), nested(), POOLS, {"c1": c}, [], [move])
