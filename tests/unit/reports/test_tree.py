"""The tree command's comparison, without Placement: what differs, what
does not (ownership), and what is unhealed with whom."""
from __future__ import annotations

import dataclasses
import json

from compute_agent.heal.rules import hold_unhealed
from compute_agent.reports.tree import FieldDifference, Holder, Presence, TreeVerdict, compare, usages
from compute_agent.tree.provider_tree import Provider, ProviderTree, inventory

ROOT, CELL0, CELL1, PF = "root", "cell0", "cell1", "pf"
VF = "CUSTOM_PCI_8086_154C"


def nested() -> ProviderTree:
    return ProviderTree([
        Provider(ROOT, "h", None, {"DISK_GB": inventory(100)},
                 frozenset({"COMPUTE_NODE", "HW_CPU_X86_AVX2"})),
        Provider(CELL0, "h_numa_0", ROOT,
                 {"VCPU": inventory(4, allocation_ratio=4.0),
                  "MEMORY_MB": inventory(2048, reserved=512)}, frozenset({"HW_NUMA_ROOT"})),
        Provider(CELL1, "h_numa_1", ROOT,
                 {"VCPU": inventory(4, allocation_ratio=4.0),
                  "MEMORY_MB": inventory(2048)}, frozenset({"HW_NUMA_ROOT"})),
        Provider(PF, "h_PF", CELL0, {VF: inventory(4)},
                 frozenset({"COMPUTE_MANAGED_PCI_DEVICE"}))])


def flat() -> ProviderTree:
    return ProviderTree([
        Provider(ROOT, "h", None, {"DISK_GB": inventory(100),
                                   "VCPU": inventory(8, allocation_ratio=4.0),
                                   "MEMORY_MB": inventory(4096, reserved=512)},
                 frozenset({"COMPUTE_NODE", "HW_CPU_X86_AVX2"})),
        Provider(PF, "h_PF", ROOT, {VF: inventory(4)},
                 frozenset({"COMPUTE_MANAGED_PCI_DEVICE"}))])


def edited(tree: ProviderTree, uuid: str, **changes) -> ProviderTree:
    """``tree`` with one provider changed, as someone else would in Placement."""
    out = tree.copy()
    out.replace(dataclasses.replace(out.get(uuid), **changes))
    return ProviderTree.parents_first(out)


def test_a_tree_placement_shows_as_the_model_is_in_step():
    report = compare(nested(), nested(), {})
    assert report.verdict is TreeVerdict.IN_STEP
    assert report.differences == [] and report.unhealed == []
    assert report.describe() == ["in step"]


def test_an_inventory_edited_behind_the_agents_back_differs_field_by_field():
    placement = edited(nested(), CELL1, inventories={
        "VCPU": inventory(6, allocation_ratio=16.0), "MEMORY_MB": inventory(2048)})
    report = compare(placement, nested(), {})
    assert report.verdict is TreeVerdict.OUT_OF_STEP
    (d,) = report.differences
    assert (d.uuid, d.presence) == (CELL1, Presence.BOTH)
    (vcpu,) = d.inventories
    assert vcpu.resource_class == "VCPU"
    assert vcpu.fields == (FieldDifference("total", 6, 4),
                           FieldDifference("max_unit", 6, 4),
                           FieldDifference("allocation_ratio", 16.0, 4.0))
    assert any("inventory VCPU total 6 -> 4" in line for line in report.describe())


def test_what_the_agent_keeps_is_no_difference_and_what_it_owns_is():
    """An operator's reserved on a device, and others' traits, stay; a
    reserved on VCPU and the agent's own traits are the agent's."""
    placement = edited(nested(), PF, inventories={VF: inventory(4, reserved=1)},
                       traits=frozenset({"COMPUTE_MANAGED_PCI_DEVICE", "CUSTOM_MINE"}))
    placement = edited(placement, ROOT, traits=frozenset(
        {"COMPUTE_STATUS_DISABLED", "HW_CPU_X86_AVX512F", "HW_CPU_X86_AVX2"}))
    assert compare(edited(placement, ROOT, traits=nested().get(ROOT).traits
                          | {"COMPUTE_STATUS_DISABLED"}),
                   nested(), {}).verdict is TreeVerdict.IN_STEP
    report = compare(placement, nested(), {})
    (root,) = report.differences
    assert root.uuid == ROOT and root.inventories == ()
    assert root.traits_added == {"COMPUTE_NODE"}
    assert root.traits_removed == {"HW_CPU_X86_AVX512F"}


def test_providers_only_on_one_side_and_a_parent_change():
    model = nested()
    model.add(Provider("gpu", "h_GPU", CELL1, {"VGPU": inventory(2)}))
    placement = edited(nested(), PF, parent_uuid=ROOT)
    placement.add(Provider("old", "h_OLD", ROOT, {"VGPU": inventory(1)}))
    placement.add(Provider("bw", "neutron_bandwidth", ROOT))
    report = compare(placement, model, {}, owned=lambda p: p.name.startswith("h"))
    by_uuid = {d.uuid: d for d in report.differences}
    assert by_uuid["gpu"].presence is Presence.ONLY_DISCOVERED
    assert by_uuid["old"].presence is Presence.ONLY_PLACEMENT
    assert by_uuid[PF].attributes == (FieldDifference("parent_provider_uuid", ROOT, CELL0),)
    assert [p.name for p in report.others] == ["neutron_bandwidth"]
    assert "bw" not in by_uuid


def test_an_unhealed_class_names_the_consumers_that_hold_it():
    """Flat to nested under guests: the agent already reports the cells
    fully reserved and the root keeping its VCPU, so nothing differs; the
    host is unhealed for VCPU, held by the two guests on the root."""
    allocations = {ROOT: {"c1": {"resources": {"VCPU": 2, "MEMORY_MB": 0}},
                          "c2": {"resources": {"VCPU": 3, "DISK_GB": 10}},
                          "c3": {"resources": {"DISK_GB": 5}}}}
    as_synced = hold_unhealed(flat(), nested(), usages(allocations)).tree
    report = compare(as_synced, nested(), allocations, instance_names={"c1": "web"})
    assert report.differences == []
    assert report.verdict is TreeVerdict.OUT_OF_STEP
    (vcpu,) = report.unhealed
    assert (vcpu.provider_uuid, vcpu.resource_class, vcpu.used) == (ROOT, "VCPU", 5)
    assert vcpu.holders == (Holder("c1", 2, "web"), Holder("c2", 3))
    cell = report.discovered.get(CELL0).inventories["VCPU"]
    assert cell["reserved"] == cell["total"]
    text = report.describe()
    assert "    VCPU on h [root]: 5 used by 2 consumers" in text
    assert "        c1 2 (web)" in text
    assert text[-1] == "0 providers differ; unhealed for VCPU"


def test_the_json_uses_placements_names_and_shows_every_inventory_field():
    report = compare(flat(), nested(), {ROOT: {"c1": {"resources": {"VCPU": 1}}}})
    doc = json.loads(json.dumps(report.as_dict()))
    assert doc["in_step"] is False
    pf = next(p for p in doc["discovered"] if p["uuid"] == PF)
    assert pf["parent_provider_uuid"] == CELL0 and "parent_uuid" not in pf
    root = next(p for p in doc["placement"] if p["uuid"] == ROOT)
    assert root["inventories"]["VCPU"]["allocation_ratio"] == 4.0
    assert root["inventories"]["MEMORY_MB"]["reserved"] == 512
    (unhealed,) = doc["unhealed"]
    assert unhealed["consumers"] == [{"consumer_uuid": "c1", "amount": 1,
                                      "instance_name": None}]
    cells = [d for d in doc["differences"] if d["presence"] == "only_discovered"]
    assert {d["uuid"] for d in cells} == {CELL0, CELL1}
