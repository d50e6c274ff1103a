"""A move's destination request (compute_agent/moves/request.py), pure:
what an instance holds on its source, as the groups of one
GET /allocation_candidates."""
from __future__ import annotations

import uuid

import pytest

from compute_agent.moves.request import SourceProvider, candidate_root, cell_of, move_request

ROOT, CELL0, CELL1, PF1, GPU0, LOOSE = (str(uuid.uuid4()) for _ in range(6))
TREE = {
    ROOT: SourceProvider(ROOT, None, frozenset({"COMPUTE_NODE"})),
    CELL0: SourceProvider(CELL0, ROOT, frozenset({"HW_NUMA_ROOT"})),
    CELL1: SourceProvider(CELL1, ROOT, frozenset({"HW_NUMA_ROOT"})),
    PF1: SourceProvider(PF1, CELL1, frozenset({"COMPUTE_MANAGED_PCI_DEVICE",
                                               "CUSTOM_PHYSNET_NET1"})),
    GPU0: SourceProvider(GPU0, CELL0, frozenset({"CUSTOM_MDEV_TYPE_NVIDIA_35"})),
    LOOSE: SourceProvider(LOOSE, ROOT, frozenset({"COMPUTE_MANAGED_PCI_DEVICE"})),
}


def test_the_request_keeps_each_device_with_its_cell():
    req = move_request({
        ROOT: {"DISK_GB": 10},
        CELL1: {"VCPU": 2, "MEMORY_MB": 1024},
        PF1: {"SRIOV_NET_VF": 1},
        CELL0: {"PCPU": 1, "MEMORY_MB": 512},
        GPU0: {"VGPU": 1},
        LOOSE: {"CUSTOM_PCI_1AF4_1041": 1},
    }, TREE)
    query = req.query(in_tree=ROOT, limit=5)
    d = {}
    for k, v in query:
        d.setdefault(k, []).append(v)
    assert d["resources"] == ["DISK_GB:10"]
    cells = {v for k, v in query if k.startswith("resources_CELL")}
    assert cells == {"MEMORY_MB:1024,VCPU:2", "MEMORY_MB:512,PCPU:1"}
    by_suffix = {k[len("resources"):]: v for k, v in query if k.startswith("resources_")}
    cell_of_vf = next(s for s, v in by_suffix.items() if v == "MEMORY_MB:1024,VCPU:2")
    cell_of_gpu = next(s for s, v in by_suffix.items() if v == "MEMORY_MB:512,PCPU:1")
    vf = next(s for s, v in by_suffix.items() if v == "SRIOV_NET_VF:1")
    gpu = next(s for s, v in by_suffix.items() if v == "VGPU:1")
    loose = next(s for s, v in by_suffix.items() if v == "CUSTOM_PCI_1AF4_1041:1")
    assert sorted(d["same_subtree"]) == sorted([f"{cell_of_vf},{vf}",
                                                f"{cell_of_gpu},{gpu}"])
    assert not any(loose in v for v in d["same_subtree"])  # no cell: free to land
    required = {k[len("required"):]: v for k, v in query if k.startswith("required_")}
    assert required[cell_of_vf] == required[cell_of_gpu] == "HW_NUMA_ROOT"
    assert required[vf] == "CUSTOM_PHYSNET_NET1"
    assert required[gpu] == "CUSTOM_MDEV_TYPE_NVIDIA_35"
    assert loose not in required
    assert d["group_policy"] == ["none"] and d["limit"] == ["5"]
    # Every group in the tree, none without resources.
    assert d["in_tree"] == [ROOT]
    assert {k for k, v in query if k.startswith("in_tree_") and v == ROOT} == {
        f"in_tree{s}" for s in (cell_of_vf, cell_of_gpu, vf, gpu, loose)}



def test_a_request_without_root_resources_has_no_unsuffixed_group():
    query = move_request({CELL0: {"VCPU": 1, "MEMORY_MB": 64}}, TREE).query(ROOT)
    assert [k for k, _ in query if k in ("resources", "in_tree")] == []



def test_a_provider_outside_the_tree_is_refused_by_name():
    stranger = str(uuid.uuid4())
    with pytest.raises(ValueError, match=stranger):
        move_request({stranger: {"VCPU": 1}}, TREE)



def test_a_candidate_lands_on_one_host_or_none():
    tree_of = {CELL0: ROOT, PF1: ROOT, "x": "other"}
    assert candidate_root({"allocations": {CELL0: {}, PF1: {}}}, tree_of) == ROOT
    assert candidate_root({"allocations": {CELL0: {}, "x": {}}}, tree_of) is None


def test_a_request_of_the_roots_classes_alone_is_one_group():
    req = move_request({ROOT: {"VCPU": 2, "DISK_GB": 10}}, TREE)
    assert req.query() == [("resources", "DISK_GB:10,VCPU:2")]
    assert req.query(in_tree=ROOT, limit=3) == [
        ("resources", "DISK_GB:10,VCPU:2"), ("in_tree", ROOT), ("limit", "3")]


def test_a_device_below_another_device_stays_with_the_cell_above_them():
    """A VF's own provider under its PF's, under a cell."""
    vf = str(uuid.uuid4())
    tree = {**TREE, vf: SourceProvider(vf, PF1, frozenset({"CUSTOM_PHYSNET_NET1"}))}
    query = move_request({CELL1: {"VCPU": 1}, vf: {"SRIOV_NET_VF": 1}}, tree).query()
    assert ("same_subtree", "_CELL0,_DEV0") in query
    assert ("required_DEV0", "CUSTOM_PHYSNET_NET1") in query


def test_a_device_whose_cell_the_instance_holds_nothing_of_is_tied_to_none():
    query = move_request({ROOT: {"VCPU": 1}, GPU0: {"VGPU": 1}}, TREE).query()
    assert [k for k, _ in query if k == "same_subtree"] == []
    assert ("resources_DEV0", "VGPU:1") in query


def test_a_tree_read_with_a_loop_in_it_finds_no_cell():
    """Placement never answers one, but a loop must not hang the request."""
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    looped = {a: SourceProvider(a, b), b: SourceProvider(b, a)}
    assert cell_of(a, looped) is None
    assert cell_of(PF1, TREE) == CELL1
    assert cell_of(ROOT, TREE) is None
