"""ctl tree's rendering of the agent's answer, by Placement's field names."""
from compute_agent.cmd.ctl import in_placement_terms
from compute_agent.tree.provider_tree import tree_lines

ROOT = {"uuid": "r", "name": "h", "generation": 3, "traits": ["COMPUTE_NODE"],
        "inventories": {"VCPU": {"total": 8, "reserved": 1, "allocation_ratio": 4.0}}}
CELL = {"uuid": "c", "name": "h_numa_0", "generation": 1, "traits": [],
        "inventories": {"MEMORY_MB": {"total": 2048, "reserved": 0,
                                      "allocation_ratio": 1.0}}}


def test_an_agent_of_this_release_and_an_older_one_read_the_same():
    new = [{**ROOT, "parent_provider_uuid": None, "parent_uuid": None},
           {**CELL, "parent_provider_uuid": "r", "parent_uuid": "r"}]
    old = [{**ROOT, "parent_uuid": None}, {**CELL, "parent_uuid": "r"}]
    assert in_placement_terms(new) == in_placement_terms(old) == [
        {**ROOT, "parent_provider_uuid": None}, {**CELL, "parent_provider_uuid": "r"}]


def test_the_tree_shows_reserved_and_allocation_ratio_under_its_parent():
    assert tree_lines(in_placement_terms([{**ROOT, "parent_uuid": None},
                                          {**CELL, "parent_uuid": "r"}])) == [
        "h  [r] generation 3",
        "    inventory: VCPU=8 (reserved 1, allocation_ratio 4.0)",
        "    traits: COMPUTE_NODE",
        "    h_numa_0  [c] generation 1",
        "        inventory: MEMORY_MB=2048"]
