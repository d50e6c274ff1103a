"""One agent per host: the rules that refuse a second agent's start
(compute_agent/daemon/one_agent.py)."""
from __future__ import annotations

from compute_agent.daemon.one_agent import (
    AnsweringAgent,
    ThisAgent,
    agent_answering_for_host,
    root_of_another_agent,
    roots_named_from_tree,
)

OURS = "5e1c0c5a-8a4e-4d4b-9c0e-2f1d6b7a9c31"
THEIRS = "0b6f3a52-7d0c-4f4e-8a55-3c2b1e9d7f10"
ME = ThisAgent("node1", "/var/lib/compute-agnet", OURS)


def test_a_root_of_another_uuid_named_as_the_host_refuses_naming_both_and_the_path():
    line = root_of_another_agent(ME, frozenset({THEIRS}))
    assert line is not None and "\n" not in line
    assert "host node1" in line and THEIRS in line and OURS in line
    assert "/var/lib/compute-agnet" in line
    assert "mistyped state_path or a cloned VM image" in line


def test_our_own_root_or_none_is_no_conflict():
    assert root_of_another_agent(ME, frozenset({OURS})) is None
    assert root_of_another_agent(ME, frozenset()) is None


def test_a_host_adopted_from_nova_is_its_own_root():
    """nova's compute_id is its root's UUID: the agent given it finds the
    root named as the host by that UUID, which is no other agent's."""
    nova = ThisAgent("nova-host", "/var/lib/nova", THEIRS)
    assert root_of_another_agent(nova, frozenset({THEIRS})) is None


def test_a_state_path_without_compute_id_is_refused_before_it_makes_one():
    fresh = ThisAgent("node1", "/var/lib/compute-agnet", None)
    line = root_of_another_agent(fresh, frozenset({THEIRS}))
    assert line is not None and THEIRS in line
    assert "state path /var/lib/compute-agnet has no compute_id" in line


def test_bug_a_deleted_compute_id_beside_the_roots_store_was_called_another_agent():
    """The store names the root: its own start check tells the operator
    to write that UUID back into compute_id; no other agent is involved."""
    lost_id = ThisAgent("node1", "/var/lib/compute-agent", None, store_root=THEIRS)
    assert root_of_another_agent(lost_id, frozenset({THEIRS})) is None
    elsewhere = ThisAgent("node1", "/var/lib/compute-agent", None, store_root=OURS)
    assert root_of_another_agent(elsewhere, frozenset({THEIRS})) is not None


def row(uuid: str, name: str) -> dict:
    return {"uuid": uuid, "name": name, "root_provider_uuid": OURS}


def test_our_root_named_as_the_host_in_our_tree_answers_the_check():
    """Placement's names are unique: our root holding the name leaves no
    other root with it, so a restart's tree read is the check."""
    tree = [row(OURS, "node1"), row(THEIRS, "node1_numa_0")]
    assert roots_named_from_tree(ME, tree) == frozenset({OURS})


def test_a_tree_that_cannot_tell_leaves_the_check_to_a_read_by_name():
    assert roots_named_from_tree(ME, []) is None  # our root not in Placement
    assert roots_named_from_tree(ME, [row(OURS, "node1.example.org")]) is None
    assert roots_named_from_tree(ME, [row(THEIRS, "node1")]) is None
    fresh = ThisAgent("node1", "/var/lib/compute-agent", None)
    assert roots_named_from_tree(fresh, [row(OURS, "node1")]) is None


def test_any_answer_on_the_bus_is_another_agent():
    assert agent_answering_for_host(ME, None) is None
    said = AnsweringAgent.from_report({"root_uuid": THEIRS, "state_path": "/srv/state",
                                       "machine": "clone-7"})
    line = agent_answering_for_host(ME, said)
    assert line is not None and "\n" not in line
    assert "host node1" in line and "on clone-7" in line
    assert THEIRS in line and "/srv/state" in line and OURS in line


def test_a_clone_with_the_same_compute_id_is_refused_on_the_bus():
    """The cloned image's compute_id is the running agent's: Placement's
    root is its own, only the bus tells."""
    clone = AnsweringAgent.from_report({"root_uuid": OURS, "state_path": ME.state_path})
    assert root_of_another_agent(ME, frozenset({OURS})) is None
    assert agent_answering_for_host(ME, clone) is not None


def test_an_older_agents_answer_without_its_identity_still_refuses():
    line = agent_answering_for_host(ME, AnsweringAgent.from_report({"host": "node1"}))
    assert line is not None and "root provider not said" in line


def test_what_another_agent_says_is_shown_cut_and_only_as_text():
    said = AnsweringAgent.from_report({"root_uuid": 7, "state_path": "x" * 5000,
                                       "machine": ["m"]})
    assert said.root_uuid is None and said.machine is None
    assert len(said.state_path) == 80 and said.state_path.endswith("...")
    assert AnsweringAgent.from_report("not a map") == AnsweringAgent()
