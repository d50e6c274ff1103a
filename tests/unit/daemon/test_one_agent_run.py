"""One agent per host, at start (compute_agent/daemon/one_agent_run.py): the
facts the rules judge gathered from the state directory, Placement and the
bus, with fakes for Placement and the bus; Placement's half left to the
first cycle when it does not answer."""
from __future__ import annotations

import logging

import pytest

from compute_agent.daemon import one_agent_run
from compute_agent.daemon.errors import AnotherAgentServesHost, StateOfAnotherHost
from compute_agent.daemon.one_agent_run import (
    PlacementCheck,
    StartCheck,
    check_one_agent_per_host,
)
from compute_agent.dependencies import Unknown
from compute_agent.exception import PlacementUnavailable
from compute_agent.placement.client import DEFAULT_TIMEOUT_SECONDS
from compute_agent.store import node_identity
from compute_agent.store.store import STORE_FILE, Store
from tests.unit.daemon.agents import ROOT, fake_agent_conf

THEIRS = "0b6f3a52-7d0c-4f4e-8a55-3c2b1e9d7f10"


class RootsNamed:
    """Placement's roots by name, as get_roots_named answers, and the
    providers of each tree, as get_tree does; or down."""

    def __init__(self, roots: dict[str, list[str]], down: bool = False,
                 trees: dict[str, list[dict]] | None = None) -> None:
        self.roots = roots
        self.down = down
        self.trees = trees or {}
        self.asked: list[str] = []

    def _answer(self) -> None:
        if self.down:
            raise PlacementUnavailable("http://127.0.0.1:1", "did not answer (refused)")

    def get_roots_named(self, name: str) -> list[str]:
        self.asked.append(name)
        self._answer()
        return self.roots.get(name, [])

    def get_tree(self, root_uuid: str) -> list[dict]:
        self.asked.append(f"in_tree={root_uuid}")
        self._answer()
        return self.trees.get(root_uuid, [])


class Bus:
    """What agent_serving answers: None (no agent), a report, or Unknown."""

    def __init__(self, answer: dict | Unknown | None = None) -> None:
        self.answer = answer
        self.asked: list[tuple[str, float]] = []

    def __call__(self, conf, host: str, deadline: float):
        self.asked.append((host, deadline))
        return self.answer


@pytest.fixture
def conf(tmp_path):
    return fake_agent_conf(tmp_path)


def answering(monkeypatch, placement: RootsNamed, bus: Bus) -> None:
    monkeypatch.setattr(one_agent_run, "PlacementClient", lambda adapter, metrics: placement)
    monkeypatch.setattr(one_agent_run, "agent_serving", bus)


def test_placement_s_check_refuses_another_root_named_as_the_host():
    check = PlacementCheck("node1", "/var/lib/compute-agent")
    assert check.run(RootsNamed({"node1": [ROOT]}), ROOT) == []  # ours: no conflict
    assert check.run(RootsNamed({}), None) is None  # none yet: no tree read
    with pytest.raises(AnotherAgentServesHost) as refused:
        check.run(RootsNamed({"node1": [THEIRS]}), ROOT)
    line = str(refused.value)
    assert "host node1" in line and THEIRS in line and ROOT in line


def test_a_host_no_other_agent_serves_starts_with_nothing_left_to_check(conf, monkeypatch):
    placement, bus = RootsNamed({}), Bus(None)
    answering(monkeypatch, placement, bus)
    assert check_one_agent_per_host(conf, ask_the_bus=True) == StartCheck(placement)
    assert placement.asked == ["node1"]  # a new host: asked by name, no tree to read
    assert bus.asked == [("node1", one_agent_run.PROBE_DEADLINE_SECONDS)]
    assert conf.placement.timeout == DEFAULT_TIMEOUT_SECONDS


def test_another_root_in_placement_refuses_the_start(conf, monkeypatch):
    answering(monkeypatch, RootsNamed({"node1": [THEIRS]}), Bus(None))
    with pytest.raises(AnotherAgentServesHost, match=THEIRS):
        check_one_agent_per_host(conf, ask_the_bus=True)


def test_placement_away_leaves_its_check_to_the_first_cycle(conf, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger=one_agent_run.__name__)
    answering(monkeypatch, RootsNamed({}, down=True), Bus(None))
    start = check_one_agent_per_host(conf, ask_the_bus=True)
    assert start.pending == PlacementCheck("node1", conf.state_path)
    assert start.tree is None
    assert [r.levelname for r in caplog.records if r.name == one_agent_run.__name__] == [
        "DEBUG"]  # the first cycle says that Placement is away


def test_an_agent_answering_on_the_bus_refuses_the_start(conf, monkeypatch):
    answering(monkeypatch, RootsNamed({}),
              Bus({"root_uuid": THEIRS, "state_path": "/srv/state", "machine": "clone-7"}))
    with pytest.raises(AnotherAgentServesHost, match="on clone-7"):
        check_one_agent_per_host(conf, ask_the_bus=True)


def test_once_asks_no_bus(conf, monkeypatch):
    bus = Bus({"root_uuid": THEIRS})
    answering(monkeypatch, RootsNamed({}), bus)
    assert check_one_agent_per_host(conf, ask_the_bus=False).pending is None
    assert bus.asked == []


def test_a_bus_that_cannot_be_asked_is_one_warning(conf, monkeypatch, caplog):
    answering(monkeypatch, RootsNamed({}), Bus(Unknown("the broker did not answer")))
    assert check_one_agent_per_host(conf, ask_the_bus=True).pending is None
    assert [r.getMessage() for r in caplog.records if r.name == one_agent_run.__name__] == [
        "Whether another agent serves host node1 was not asked on the bus: the broker "
        "did not answer"]


def test_the_state_directory_s_compute_id_is_ours(conf, monkeypatch):
    node_identity.record(conf.state_path, THEIRS)
    answering(monkeypatch, RootsNamed({"node1": [THEIRS]}), Bus(None))
    assert check_one_agent_per_host(conf, ask_the_bus=False).pending is None


def test_a_restart_s_check_is_its_tree_read_handed_to_the_first_cycle(conf, monkeypatch):
    node_identity.record(conf.state_path, ROOT)
    tree = [{"uuid": ROOT, "name": "node1", "generation": 3,
             "parent_provider_uuid": None, "root_provider_uuid": ROOT}]
    placement = RootsNamed({"node1": [ROOT]}, trees={ROOT: tree})
    answering(monkeypatch, placement, Bus(None))
    assert check_one_agent_per_host(conf, ask_the_bus=False) == StartCheck(placement, tree)
    assert placement.asked == [f"in_tree={ROOT}"]  # one request, no name lookup


def test_a_root_named_otherwise_is_looked_for_by_name_and_another_refuses(conf, monkeypatch):
    """Our root renamed (or gone): the tree cannot say whether another root
    holds the host's name, so Placement is asked by it."""
    node_identity.record(conf.state_path, ROOT)
    tree = [{"uuid": ROOT, "name": "node1.example.org", "generation": 3,
             "parent_provider_uuid": None, "root_provider_uuid": ROOT}]
    placement = RootsNamed({"node1": [THEIRS]}, trees={ROOT: tree})
    answering(monkeypatch, placement, Bus(None))
    with pytest.raises(AnotherAgentServesHost, match=THEIRS):
        check_one_agent_per_host(conf, ask_the_bus=False)
    assert placement.asked == [f"in_tree={ROOT}", "node1"]


def test_a_store_beside_a_lost_compute_id_names_our_root(conf, monkeypatch):
    """The store's root is this host's, not another agent's: its own start
    check asks for the compute_id back."""
    Store(f"{conf.state_path}/{STORE_FILE}", THEIRS).close()
    answering(monkeypatch, RootsNamed({"node1": [THEIRS]}), Bus(None))
    assert check_one_agent_per_host(conf, ask_the_bus=False).pending is None
    assert node_identity.load(conf.state_path) is None  # nothing written


# --- the host name the state directory belongs to (renamed_host) ---------------


def root_named(name: str) -> dict[str, list[dict]]:
    """Placement's tree of ROOT, its root named ``name``."""
    return {ROOT: [{"uuid": ROOT, "name": name, "generation": 1,
                    "parent_provider_uuid": None, "root_provider_uuid": ROOT}]}


def older_store(conf) -> None:
    """A store from before the host name's record, beside its compute_id."""
    node_identity.record(conf.state_path, ROOT)
    Store(f"{conf.state_path}/{STORE_FILE}", ROOT).close()


def test_a_store_of_another_host_name_refuses_the_start_before_placement(conf, monkeypatch):
    node_identity.record(conf.state_path, ROOT)
    Store(f"{conf.state_path}/{STORE_FILE}", ROOT, host="node0").close()
    placement = RootsNamed({"node0": [ROOT]})
    answering(monkeypatch, placement, Bus(None))
    with pytest.raises(StateOfAnotherHost) as refused:
        check_one_agent_per_host(conf, ask_the_bus=True)
    assert str(refused.value).startswith(
        f"[DEFAULT] host is node1, but state path {conf.state_path} (root provider "
        f"{ROOT}) belongs to host node0 (its store's record): nothing was renamed")
    assert placement.asked == []


def test_a_store_of_this_host_name_asks_placement_nothing_more(conf, monkeypatch):
    node_identity.record(conf.state_path, ROOT)
    Store(f"{conf.state_path}/{STORE_FILE}", ROOT, host="node1").close()
    # Renamed on purpose: the cycle renames it.
    placement = RootsNamed({"node0": [ROOT]}, trees=root_named("node0"))
    answering(monkeypatch, placement, Bus(None))
    assert check_one_agent_per_host(conf, ask_the_bus=False).pending is None
    assert placement.asked == [f"in_tree={ROOT}", "node1"]


def test_an_older_store_learns_its_name_from_its_root_named_as_the_host(conf, monkeypatch,
                                                                         caplog):
    caplog.set_level(logging.INFO, logger=one_agent_run.__name__)
    older_store(conf)
    placement = RootsNamed({"node1": [ROOT]}, trees=root_named("node1"))
    answering(monkeypatch, placement, Bus(None))
    assert check_one_agent_per_host(conf, ask_the_bus=False).pending is None
    assert placement.asked == [f"in_tree={ROOT}"]  # the tree read told the root's name
    assert [r.getMessage() for r in caplog.records if r.name == one_agent_run.__name__] == [
        f"State path {conf.state_path} records no host name: it belongs to host node1 "
        "(its root provider's name in Placement)"]


def test_an_older_store_whose_root_placement_names_otherwise_refuses_the_start(
        conf, monkeypatch):
    older_store(conf)
    placement = RootsNamed({"node0": [ROOT]}, trees=root_named("node0"))
    answering(monkeypatch, placement, Bus(None))
    with pytest.raises(StateOfAnotherHost, match="belongs to host node0 .its root "
                                                 "provider's name in Placement.: nothing"):
        check_one_agent_per_host(conf, ask_the_bus=False)
    assert placement.asked == [f"in_tree={ROOT}", "node1"]


def test_an_older_store_whose_root_placement_lacks_takes_the_configured_name(
        conf, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=one_agent_run.__name__)
    older_store(conf)
    answering(monkeypatch, RootsNamed({}), Bus(None))
    assert check_one_agent_per_host(conf, ask_the_bus=False).pending is None
    assert "belongs to host node1 ([DEFAULT] host, nothing having recorded a name before)" \
        in caplog.text


def test_an_older_store_s_name_is_learnt_at_the_first_cycle_placement_answers(
        conf, monkeypatch):
    older_store(conf)
    answering(monkeypatch, RootsNamed({}, down=True), Bus(None))
    pending = check_one_agent_per_host(conf, ask_the_bus=False).pending
    assert pending == PlacementCheck("node1", conf.state_path, learns_name=True)
    with pytest.raises(StateOfAnotherHost, match="belongs to host node0"):
        pending.run(RootsNamed({"node0": [ROOT]}, trees=root_named("node0")), ROOT)
