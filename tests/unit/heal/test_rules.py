"""The reserved-until-healed rule and the heal plan, without Placement."""
from __future__ import annotations

import dataclasses
import uuid as uuid_lib
from collections import defaultdict

import pytest

from compute_agent.claims.choice import Pool, Slot
from compute_agent.claims.model import Assignment, Migration
from compute_agent.drivers.base import DeviceKind
from compute_agent.heal.errors import HealRefused
from compute_agent.heal.rules import Consumer, Model, capacity, hold_unhealed, plan_heal
from compute_agent.tree.device_spec import parse_specs
from compute_agent.tree.host_tree import TreeMode
from compute_agent.tree.provider_tree import Provider, ProviderTree, inventory

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
    plan = plan_heal(Model(flat(), model, POOLS), {"c1": c}, [vf_row("c1", "vf2")], [])
    assert plan.consumers["c1"].allocations == {
        CELL0: {"VCPU": 2, "MEMORY_MB": 512}, PF: {"SRIOV_NET_VF": 1},
        "elsewhere": {"DISK_GB": 5}}
    assert plan.inventories[ROOT] == (3, {})


def test_instances_without_a_cell_go_by_the_even_rule():
    cs = {f"c{i}": consumer(f"c{i}", {ROOT: {"VCPU": 1, "MEMORY_MB": 1024}})
          for i in range(2)}
    plan = plan_heal(Model(flat(), nested(), POOLS), cs, [], [])
    assert {c.allocations and next(iter(c.allocations)) for c in plan.consumers.values()} \
        == {CELL0, CELL1}


def test_an_instance_bigger_than_any_cell_is_refused_by_name():
    big = consumer("big", {ROOT: {"VCPU": 1, "MEMORY_MB": 4096}})
    with pytest.raises(HealRefused, match="big: needs"):
        plan_heal(Model(flat(), nested(), POOLS), {"big": big}, [], [])


def test_a_consumer_in_the_middle_of_a_move_is_refused_by_name():
    c = consumer("c1", {ROOT: {"VCPU": 1}})
    move = Migration("m1", "c1", "resize", "source", "active")
    with pytest.raises(HealRefused, match="c1: is in the middle of a resize"):
        plan_heal(Model(flat(), nested(), POOLS), {"c1": c}, [], [move])


# --- switching between any two tree modes ---------------------------------------

MODE_HOST = {
    "disk_gb": 100,
    "numa_cells": [{"id": 0, "cpus": "0-7", "memory_mb": 16384},
                   {"id": 1, "cpus": "8-15", "memory_mb": 16384}],
    "pci_devices": [{"address": "0000:3b:00.0", "vendor_id": "8086",
                     "product_id": "1572", "numa_node": 0,
                     "vfs": {"count": 4, "product_id": "154c"}}],
    "gpus": [{"address": "0000:af:00.0", "numa_node": 1,
              "mdev_types": {"nvidia-35": {"available_instances": 3}},
              "mdevs": [{"uuid": "00000000-0000-0000-0000-00000000000a",
                         "type": "nvidia-35"}]}],
    "pmem_namespaces": [{"name": "ns0", "size_bytes": 1 << 30, "numa_node": 0},
                        {"name": "ns1", "size_bytes": 1 << 30, "numa_node": 1}],
}
MODE_ROOT = "4d8e7c51-2b0a-4f0e-9d61-1c3a5b7e9f02"
VF_RC, PMEM_RC = "CUSTOM_PCI_8086_154C", "CUSTOM_PMEM_NAMESPACE_SMALL"
# consumer -> (its NUMA cell, its counted resources, its devices by kind
# and id). Under nested, the counted resources sit on the cell, as a
# scheduler would have put them; the plain guest's cell 0 is also where
# the even rule sends it.
MODE_GUESTS = {
    "c1-vgpu": (1, {"VCPU": 2, "MEMORY_MB": 2048},
                [(DeviceKind.MDEV, "00000000-0000-0000-0000-00000000000a")]),
    "c2-vf": (0, {"VCPU": 1, "MEMORY_MB": 1024}, [(DeviceKind.VF, "0000:3b:10.0")]),
    "c3-pinned": (1, {"MEMORY_MB": 2048}, [(DeviceKind.PCPU, "12"),
                                          (DeviceKind.PCPU, "13"),
                                          (DeviceKind.PMEM, "ns1")]),
    "c4-plain": (0, {"VCPU": 1, "MEMORY_MB": 512}, []),
}


def mode_tree(mode):
    from compute_agent.drivers.fake import host_from_dict
    from compute_agent.tree.host_tree import MdevTypePolicy, TreePolicy, build_tree

    return build_tree(host_from_dict(MODE_HOST), TreePolicy(
        host="h", root_uuid=MODE_ROOT, mode=mode,
        dedicated_cpus=frozenset(range(12, 16)), shared_cpus=frozenset(range(12)),
        mdev_types=(MdevTypePolicy("nvidia-35"),),
        pmem_labels=(("SMALL", frozenset({"ns0", "ns1"})),),
        device_specs=parse_specs(['{"vendor_id": "8086", "product_id": "154c"}'])))


def placed(mode, tree: ProviderTree, built) -> dict:
    """consumer -> (allocations by provider uuid, assignments) as the
    agent's claims in ``mode`` leave them."""
    from compute_agent.tree.host_tree import compute_on_cells, numa_provider_name

    uuid_of = {p.name: p.uuid for p in tree}
    device_pool = {(pool.kind, s.device_id): pool for pool in built.pools
                   for s in pool.slots}
    out = {}
    for consumer, (cell, counted, devices) in MODE_GUESTS.items():
        allocations: dict[str, dict[str, int]] = {}
        rows = []
        on_cell = compute_on_cells(mode)
        home = uuid_of[numa_provider_name("h", cell) if on_cell else "h"]
        for rc, n in counted.items():
            allocations.setdefault(home, {})[rc] = n
            rows.append(Assignment(f"a-{consumer}-{rc}", consumer, consumer, "instance",
                                   None, rc, home,
                                   DeviceKind.NUMA if on_cell else DeviceKind.HOST_RESOURCES,
                                   str(cell) if on_cell else "host", n, "claimed", "boot"))
        for kind, device in devices:
            pool = device_pool[(kind, device)]
            rp = uuid_of[pool.provider_name]
            res = allocations.setdefault(rp, {})
            res[pool.resource_class] = res.get(pool.resource_class, 0) + 1
            rows.append(Assignment(f"a-{consumer}-{device}", consumer, consumer,
                                   "instance", None, pool.resource_class, rp, kind,
                                   device, 1, "claimed", "boot"))
        out[consumer] = (allocations, rows)
    return out


def as_placement_has_it(tree: ProviderTree) -> ProviderTree:
    """The tree as Placement holds it: generations, and for the children
    UUIDs of their own (as an adopted host's are), which must be kept."""
    renamed = {p.uuid: (p.uuid if p.parent_uuid is None
                        else str(uuid_lib.uuid5(uuid_lib.NAMESPACE_URL, p.name)))
               for p in tree}
    return ProviderTree(dataclasses.replace(p, uuid=renamed[p.uuid],
                                            parent_uuid=renamed.get(p.parent_uuid),
                                            generation=7)
                        for p in tree.depth_first())


def offered_by_class(tree: ProviderTree) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for p in tree:
        for rc, record in p.inventories.items():
            out[rc] += capacity(record)
    return dict(out)


def switch(old_mode, new_mode):
    """(Placement's tree in ``old_mode``, the consumers and the store's
    rows there, the ``new_mode`` model with Placement's UUIDs, its pools)."""
    from compute_agent.tree.provider_tree import adopt_uuids

    current = as_placement_has_it(mode_tree(old_mode).tree)
    old = placed(old_mode, current, mode_tree(old_mode))
    built = mode_tree(new_mode)
    model = adopt_uuids(built.tree, current)
    pools = built.pools_by_uuid({p.name: p.uuid for p in model})
    consumers = {c: consumer(c, allocations) for c, (allocations, _) in old.items()}
    rows = [r for _, rs in old.values() for r in rs]
    return current, consumers, rows, model, pools


MODE_PAIRS = [(a, b) for a in TreeMode for b in TreeMode if a is not b]


@pytest.mark.parametrize("old_mode,new_mode", MODE_PAIRS,
                         ids=[f"{a.value}-to-{b.value}" for a, b in MODE_PAIRS])
def test_each_mode_switch_holds_then_heals_to_where_the_new_mode_puts_each_allocation(
        old_mode, new_mode):
    current, consumers, rows, model, pools = switch(old_mode, new_mode)

    # Providers whose name stays keep Placement's UUID; only their parent moves.
    for p in model:
        old = current.by_name(p.name)
        if old is not None:
            assert p.uuid == old.uuid, p.name

    usages: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for c in consumers.values():
        for rp, res in c.allocations.items():
            for rc, n in res.items():
                usages[rp][rc] += n
    held = hold_unhealed(current, model, usages)
    physical = offered_by_class(model)
    assert offered_by_class(current) == physical
    assert all(n <= physical[rc] for rc, n in offered_by_class(held.tree).items()), \
        (offered_by_class(held.tree), physical)
    assert held.stranded, "every switch moves something someone holds"

    plan = plan_heal(Model(current, model, pools), consumers, rows, [])
    expected = placed(new_mode, model, mode_tree(new_mode))
    for c, (allocations, _) in expected.items():
        assert plan.consumers.get(c, consumers[c]).allocations == allocations, c
    # Whatever the model drops, heal empties; whatever it keeps, heal sets to
    # the model's inventories.
    for uuid, (generation, inventories) in plan.inventories.items():
        assert generation == (7 if uuid in current else None)
        target = model.get(uuid)
        assert inventories == (target.inventories if target else {})
    # Applied, the plan leaves nothing stranded: a second plan is empty.
    healed = {c: dataclasses.replace(consumers[c], allocations=a)
              for c, (a, _) in expected.items()}
    assert plan_heal(Model(model, model, pools), healed, rows, []).empty
