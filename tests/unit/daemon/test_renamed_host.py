"""A renamed host (compute_agent/daemon/renamed_host.py): whose the state
directory is, and the one line that refuses a start under another name."""
from __future__ import annotations

from compute_agent.daemon.renamed_host import (
    NameSource,
    StateOwner,
    learns_from_placement,
    owner_of_state,
    served_elsewhere,
    state_of_another_host,
)

ROOT = "5e1c0c5a-8a4e-4d4b-9c0e-2f1d6b7a9c31"
STATE = "/var/lib/compute-agent"


def test_bug_a_renamed_start_was_taken_silently():
    """Found on main: [DEFAULT] host changed from bar-ren-a to bar-ren-b
    under the same state directory, the agent renamed its root provider
    and went on."""
    owner = owner_of_state("bar-ren-a", True, None)
    line = state_of_another_host("bar-ren-b", STATE, ROOT, owner)
    assert line is not None
    assert line == (
        f"[DEFAULT] host is bar-ren-b, but state path {STATE} (root provider {ROOT}) "
        "belongs to host bar-ren-a (its store's record): nothing was renamed; a cloned VM image or "
        "a changed [DEFAULT] host is the usual cause; if the host was renamed on "
        "purpose, stop the agent and run 'compute-agent-manage rename-host bar-ren-b'")
    assert "\n" not in line


def test_a_short_name_changed_to_its_fqdn_is_another_name():
    owner = owner_of_state("node1", True, None)
    assert state_of_another_host("node1.example.com", STATE, ROOT, owner) is not None


def test_a_state_directory_without_compute_id_is_named_without_a_root():
    line = state_of_another_host("node2", STATE, None, owner_of_state("node1", True, None))
    assert line is not None and line.startswith(
        f"[DEFAULT] host is node2, but state path {STATE} belongs to host node1 ")


def test_the_store_s_record_is_the_name_whatever_placement_says():
    """Placement's name for the root differing from both is the name the
    next cycle renames to the recorded one (a rename-host on purpose)."""
    assert owner_of_state("node1", True, "node0") == StateOwner("node1", NameSource.STORE)
    assert state_of_another_host("node1", STATE, ROOT, owner_of_state("node1", True, "node0")) is None


def test_an_older_store_belongs_to_its_root_s_name_in_placement():
    owner = owner_of_state(None, True, "node0")
    assert owner == StateOwner("node0", NameSource.PLACEMENT)
    line = state_of_another_host("node1", STATE, ROOT, owner)
    assert line is not None and "belongs to host node0 (its root provider's name in " \
        "Placement)" in line
    assert state_of_another_host("node0", STATE, ROOT, owner) is None


def test_an_older_store_whose_root_placement_lacks_takes_the_configured_name():
    owner = owner_of_state(None, True, None)
    assert owner == StateOwner(None, NameSource.CONFIGURED)
    assert state_of_another_host("node1", STATE, ROOT, owner) is None


def test_no_store_of_ours_takes_the_configured_name_whatever_the_root_is_named():
    """A host nova-compute ran: its root is named after its hypervisor
    hostname, which may be the FQDN of [DEFAULT] host; it is adopted."""
    owner = owner_of_state(None, False, "node1.example.com")
    assert owner == StateOwner(None, NameSource.CONFIGURED)
    assert state_of_another_host("node1", STATE, ROOT, owner) is None


def test_only_an_older_store_beside_its_root_asks_placement_its_name():
    assert learns_from_placement(None, True, ROOT)
    assert not learns_from_placement("node1", True, ROOT)  # recorded
    assert not learns_from_placement(None, False, ROOT)  # no store: configured
    assert not learns_from_placement(None, True, None)  # compute_id lost: refused


THEIRS = "0b6f3a52-7d0c-4f4e-8a55-3c2b1e9d7f10"


def test_a_rename_no_other_agent_serves_is_allowed():
    assert served_elsewhere("node2", "node1", ROOT, frozenset(), frozenset()) is None
    # The root already carries the new name: ours.
    assert served_elsewhere("node2", "node1", ROOT, frozenset({ROOT}), frozenset()) is None


def test_a_rename_to_a_name_another_root_has_is_refused():
    line = served_elsewhere("node2", "node1", ROOT, frozenset({THEIRS}), frozenset())
    assert line == (f"rename-host node2: another agent serves host node2: Placement's root "
                    f"provider {THEIRS} has that name; nothing was written")


def test_a_rename_while_an_agent_answers_for_either_name_is_refused():
    """A clone of this machine still serving the old name would take the
    renamed root back at its next cycle."""
    for name in ("node1", "node2"):
        line = served_elsewhere("node2", "node1", ROOT, frozenset(), frozenset({name}))
        assert line == (f"rename-host node2: another agent serves host {name}: it answers "
                        "on the bus (a clone of this machine?); nothing was written")
    assert served_elsewhere("node2", None, ROOT, frozenset(), frozenset({"node3"})) is None
