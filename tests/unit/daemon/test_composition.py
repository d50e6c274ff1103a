"""The agent built from the config (compute_agent/daemon/composition.py):
what the start reads of the host before it judges the store, the store
then opened, created, adopted or refused with nothing written, and the
agent composed around it."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from compute_agent.daemon import composition
from compute_agent.daemon.one_agent_run import PlacementCheck, StartCheck
from compute_agent.daemon.service import Agent
from compute_agent.drivers.base import ForeignGuest
from compute_agent.drivers.errors import DriverUnavailable, InvalidHostData
from compute_agent.drivers.fake import FakeDriver
from compute_agent.metrics import Metrics
from compute_agent.placement.client import DEFAULT_TIMEOUT_SECONDS
from compute_agent.store import node_identity
from compute_agent.store.errors import StoreRefused
from compute_agent.store.inspection import stored_host
from compute_agent.store.queries import all_instances
from compute_agent.store.store import STORE_FILE, Store
from compute_agent.tree.host_tree import TreePolicy, build_tree
from compute_agent.tree.provider_tree import Provider
from tests.unit.daemon.agents import HOST, ROOT, FakePlacement, fake_agent_conf

NOVA_GUEST = "0b6f8f3e-54a4-4b8e-a6a9-2f1e0b3d7d01"
RESOURCES = {"VCPU": 2, "MEMORY_MB": 2048}
POLICY = TreePolicy(host="h", root_uuid=ROOT)


@pytest.fixture
def driver() -> FakeDriver:
    return FakeDriver(HOST)


@pytest.fixture
def placement(driver) -> FakePlacement:
    """Placement with the fake host's tree under ROOT."""
    placement = FakePlacement()
    placement.has_tree(build_tree(driver.get_host_inventory(), POLICY).tree)
    return placement


def cell(placement: FakePlacement) -> str:
    return next(row["uuid"] for row in placement.tree if row["uuid"] != ROOT)


def novas_host(driver: FakeDriver, placement: FakePlacement) -> None:
    """What nova-compute left: its guest, and its allocations in Placement."""
    driver.add_foreign_guest(ForeignGuest(NOVA_GUEST, "nova-vm", True, 2, 2048))
    placement.held[NOVA_GUEST] = {cell(placement): dict(RESOURCES)}


def at_start(tmp_path: Path, driver, placement, compute_id_existed: bool
             ) -> composition.HostAtStart:
    """The host as a start in ``tmp_path`` finds it, its root ROOT."""
    return composition.HostAtStart(tmp_path / STORE_FILE, ROOT, compute_id_existed, driver,
                                   placement)


def raising(error: Exception):
    def call(*args, **kwargs):
        raise error
    return call


# --- what the host says -------------------------------------------------------

def test_a_host_with_a_root_from_before_is_read_with_its_allocations(tmp_path, driver, placement):
    novas_host(driver, placement)
    reading = composition.host_facts(at_start(tmp_path, driver, placement, True))
    facts = reading.facts
    assert (facts.guests, facts.foreign_guests, facts.allocations, facts.why_unknown) == (
        frozenset(), frozenset({NOVA_GUEST}), {NOVA_GUEST: {cell(placement)}}, "")
    assert reading.foreign == driver.list_foreign_guests()
    assert reading.allocations == {NOVA_GUEST: {cell(placement): RESOURCES}}


def test_a_root_new_at_this_start_asks_placement_nothing(tmp_path, driver, placement):
    reading = composition.host_facts(at_start(tmp_path, driver, placement, False))
    assert reading.facts.allocations is None and reading.allocations is None
    assert placement.tree_reads == 0 and reading.facts.why_unknown == ""


def test_what_does_not_answer_stays_unknown_and_says_why(tmp_path, driver, placement):
    driver.list_guests = raising(DriverUnavailable("libvirt gone"))
    placement.down = True
    facts = composition.host_facts(at_start(tmp_path, driver, placement, True)).facts
    assert (facts.guests, facts.foreign_guests, facts.allocations) == (None, None, None)
    assert facts.why_unknown == (
        "the hypervisor did not answer (libvirt gone); Placement's allocations are unknown "
        "(Placement at http://placement did not answer (down))")


def test_a_guest_whose_definition_cannot_be_read_is_unknown(tmp_path, driver, placement):
    driver.list_foreign_guests = raising(InvalidHostData("guest x", "vcpus", "not a number"))
    facts = composition.host_facts(at_start(tmp_path, driver, placement, False)).facts
    assert (facts.guests, facts.foreign_guests) == (frozenset(), None)
    assert facts.why_unknown.startswith("a guest's definition cannot be read (")


def test_a_store_with_rows_is_judged_without_asking_the_host(tmp_path, driver, placement):
    Store(tmp_path / STORE_FILE, ROOT).close()
    driver.list_guests = raising(AssertionError("the hypervisor asked"))
    _, _, judgement = composition.judge_store(at_start(tmp_path, driver, placement, True))
    assert judgement.verdict.value == "open" and placement.tree_reads == 0


# --- the store opened, created, adopted or refused ----------------------------

def open_store(tmp_path: Path, driver, placement, compute_id_existed: bool,
               holder: bool = True, policy: TreePolicy | None = POLICY) -> Store:
    return composition.open_store(at_start(tmp_path, driver, placement, compute_id_existed),
                                  holder, policy)


def test_a_new_host_gets_its_compute_id_and_an_empty_store(tmp_path, driver, placement):
    store = open_store(tmp_path, driver, placement, compute_id_existed=False)
    assert node_identity.load(str(tmp_path)) == ROOT
    assert store.read(all_instances) == {} and not store.read_only
    store.close()


def test_an_agent_beside_none_that_ran_is_refused_and_writes_nothing(tmp_path, driver,
                                                                     placement):
    with pytest.raises(StoreRefused, match=f"^store {tmp_path / STORE_FILE} is missing: "
                                           "the agent has not run on this host yet$"):
        open_store(tmp_path, driver, placement, compute_id_existed=False, holder=False)
    assert list(tmp_path.iterdir()) == []


def test_an_agent_beside_a_running_one_reads_its_store(tmp_path, driver, placement):
    open_store(tmp_path, driver, placement, compute_id_existed=False).close()
    store = open_store(tmp_path, driver, placement, compute_id_existed=True, holder=False)
    assert store.read_only
    store.close()


def test_a_reader_never_writes_the_compute_id(tmp_path, driver, placement):
    """A store from before stores named their root opens beside no
    compute_id: the holder records it, a reader does not."""
    Store(tmp_path / STORE_FILE).close()
    open_store(tmp_path, driver, placement, compute_id_existed=False, holder=False).close()
    assert node_identity.load(str(tmp_path)) is None
    open_store(tmp_path, driver, placement, compute_id_existed=False).close()
    assert node_identity.load(str(tmp_path)) == ROOT


def test_a_lost_store_is_refused_and_nothing_is_written(tmp_path, driver, placement):
    placement.held["lost-instance"] = {cell(placement): dict(RESOURCES)}
    with pytest.raises(StoreRefused, match="1 consumer.s. hold allocations on root provider"):
        open_store(tmp_path, driver, placement, compute_id_existed=True)
    assert list(tmp_path.iterdir()) == []


def test_novas_host_is_adopted_its_guest_an_instance_of_the_store(tmp_path, driver,
                                                                  placement, caplog):
    caplog.set_level(logging.INFO, logger=composition.__name__)
    novas_host(driver, placement)
    store = open_store(tmp_path, driver, placement, compute_id_existed=True)
    assert list(store.read(all_instances)) == [NOVA_GUEST]
    store.close()
    said = [r.getMessage() for r in caplog.records if r.name == composition.__name__]
    assert said[0] == ("Adopting this host: 1 guests defined by another manager, no store "
                       "yet")
    assert said[-1] == (f"Adopted this host: 1 instances, 2 assignments, in store "
                        f"{tmp_path / STORE_FILE}")


def test_a_host_to_adopt_without_the_tree_policy_is_refused(tmp_path, driver, placement):
    novas_host(driver, placement)
    with pytest.raises(StoreRefused, match="tree policy are unknown: not adopted"):
        open_store(tmp_path, driver, placement, compute_id_existed=True, policy=None)
    assert not (tmp_path / STORE_FILE).exists()


def test_a_guest_that_cannot_be_adopted_is_refused_one_problem_a_line(tmp_path, driver,
                                                                       placement):
    novas_host(driver, placement)
    placement.held[NOVA_GUEST][ROOT] = {"CUSTOM_NOWHERE": 1}
    with pytest.raises(StoreRefused) as refused:
        open_store(tmp_path, driver, placement, compute_id_existed=True)
    first, *problems = str(refused.value).splitlines()
    assert first == (f"store {tmp_path / STORE_FILE} is missing and the host's guests "
                     "cannot be adopted; nothing was written:")
    assert problems and all(NOVA_GUEST in line for line in problems)
    assert not (tmp_path / STORE_FILE).exists()


def test_a_host_whose_hypervisor_goes_away_is_not_adopted(tmp_path, driver, placement):
    novas_host(driver, placement)
    driver.get_host_inventory = raising(DriverUnavailable("libvirt gone"))
    with pytest.raises(StoreRefused, match="cannot be adopted: the hypervisor did not "
                                           r"answer \(libvirt gone\)$"):
        open_store(tmp_path, driver, placement, compute_id_existed=True)
    assert not (tmp_path / STORE_FILE).exists()


# --- the agent composed from the config ---------------------------------------

def test_the_config_composes_an_agent_for_a_new_host(tmp_path):
    conf = fake_agent_conf(tmp_path)
    agent = composition.compose(conf)
    assert isinstance(agent, Agent) and isinstance(agent.driver, FakeDriver)
    compute_id = node_identity.load(conf.state_path)
    assert agent.sync.root_uuid == compute_id == agent.policy.root_uuid
    assert agent.settings.reconcile_interval == 4
    assert agent.settings.record_path == Path(conf.state_path) / "last_cycle.json"
    assert conf.placement.timeout == DEFAULT_TIMEOUT_SECONDS
    # Only the providers of [DEFAULT] host are the agent's.
    assert [agent.sync.owned(Provider("u", name)) for name in
            ("node1", "node1_numa_0", "node10", "other")] == [True, True, False, False]
    agent.stop()
    again = composition.compose(conf, holder=False)
    assert again.manager.tracker.store.read_only and again.settings.record_path is None
    again.manager.tracker.store.close()


def test_the_store_records_the_host_name_only_the_start_checked(tmp_path):
    """The daemon's start passes the name its check found the state
    directory's (compute_agent/daemon/one_agent_run.py); nothing else
    records one."""
    conf = fake_agent_conf(tmp_path)
    composition.compose(conf).stop()
    path = Path(conf.state_path) / STORE_FILE
    assert stored_host(path).name is None
    composition.compose(conf, host_name="node1").stop()
    assert stored_host(path).name == "node1"


def test_the_agent_speaks_with_the_start_check_s_client_and_its_tree(tmp_path):
    """One client a process, so one microversion negotiation; the tree the
    check read is the first cycle's, the check it could not run the
    first cycle's to run."""
    conf = fake_agent_conf(tmp_path)
    placement = FakePlacement()
    placement.metrics = Metrics()  # type: ignore[attr-defined]
    check = PlacementCheck("node1", conf.state_path)
    start = StartCheck(placement, tree=[], pending=check)  # type: ignore[arg-type]
    agent = composition.compose(conf, start=start)
    assert agent.sync.client is placement and agent.metrics is placement.metrics
    assert agent.placement_check is check
    assert agent.sync._primed == []
    agent.stop()


def test_a_reader_beside_no_agent_is_refused_before_anything_is_made(tmp_path):
    conf = fake_agent_conf(tmp_path)
    with pytest.raises(StoreRefused, match="compute_id does not exist: the agent has not "
                                           "run on this host yet"):
        composition.compose(conf, holder=False)
    assert not Path(conf.state_path).exists()


def test_a_change_of_the_host_wakes_the_loop(tmp_path):
    agent = composition.compose(fake_agent_conf(tmp_path))
    assert not agent._wake.is_set()
    agent.driver.set_host(HOST)
    assert agent._wake.is_set()
    agent.stop()
