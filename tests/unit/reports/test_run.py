"""The facts the operator reports judge, read beside a running agent
(compute_agent/reports/run.py): each dependency's probe as its failures
say it, the store opened read-only with its integrity, the last cycle's
record, the tree compared with the model, and an agent opened read-only
and closed after. Placement and libvirt are stand-ins; the store, the
record and the agent are real, in a temporary directory."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import ClassVar

import pytest

from compute_agent.daemon import composition, cycle_record
from compute_agent.daemon.service import Agent
from compute_agent.dependencies import Dependency, Probe, Unknown
from compute_agent.drivers.errors import DriverUnavailable
from compute_agent.exception import (
    AgentError,
    KeystoneUnavailable,
    PlacementError,
    PlacementUnavailable,
)
from compute_agent.reports import run
from compute_agent.reports.status import StoreHealth
from compute_agent.reports.tree import Holder, TreeVerdict
from compute_agent.store.errors import StoreError
from compute_agent.store.schema import SCHEMA_VERSION
from compute_agent.store.store import STORE_FILE, Store
from tests.unit.daemon.agents import (
    ROOT,
    FakePlacement,
    agent_on_fake_host,
    fake_agent_conf,
    placement_as_flat_mode_left_it,
)

URI = "qemu:///system"
KEYSTONE = "http://keystone:5000/v3"
PLACEMENT = "http://placement:8778"


# --- libvirt --------------------------------------------------------------------

class Libvirt:
    """The driver load_driver makes: its init_host does what the test says;
    what was asked of it, in order."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.asked: list[str] = []

    def init_host(self) -> None:
        self.asked.append("init_host")
        if self.error is not None:
            raise self.error

    def cleanup(self) -> None:
        self.asked.append("cleanup")


@pytest.fixture
def conf(tmp_path):
    return fake_agent_conf(tmp_path)


def libvirt_probe(conf, monkeypatch, driver: Libvirt) -> Probe | None:
    conf.set_override("compute_driver", "libvirt")
    conf.set_override("connection_uri", URI, group="libvirt")
    monkeypatch.setattr(run, "load_driver", lambda c: driver)
    return run.hypervisor(conf)


def test_the_fake_driver_has_no_hypervisor_to_ask(conf, monkeypatch):
    monkeypatch.setattr(run, "load_driver", lambda c: pytest.fail("a driver was made"))
    assert run.hypervisor(conf) is None


@pytest.mark.parametrize("error, probe", [
    (None, Probe(Dependency.LIBVIRT, URI)),
    (DriverUnavailable("libvirt at qemu+ssh://h/system did not answer", "qemu+ssh://h/system",
                       "did not answer (Connection refused)"),
     Probe(Dependency.LIBVIRT, "qemu+ssh://h/system", "did not answer (Connection refused)")),
    # Where it was asked is the URI, when the error does not say.
    (DriverUnavailable("no socket"), Probe(Dependency.LIBVIRT, URI, "failed (no socket)")),
    (KeyError("vcpus"), Probe(Dependency.LIBVIRT, URI, "failed (KeyError: 'vcpus')")),
])
def test_libvirt_is_asked_once_and_its_connection_closed_whatever_it_says(
        conf, monkeypatch, error, probe):
    driver = Libvirt(error)
    assert libvirt_probe(conf, monkeypatch, driver) == probe
    assert driver.asked == ["init_host", "cleanup"]


# --- Keystone and Placement -----------------------------------------------------

class Client:
    """PlacementClient as the probe uses it; each step raises what the test
    puts in ``errors`` under its name."""

    keystone_url: str | None = KEYSTONE
    url = PLACEMENT
    # Each test's own (the client fixture's subclass): the probe makes its
    # client itself.
    errors: ClassVar[dict[str, Exception]] = {}
    asked: ClassVar[list[str]] = []

    def __init__(self, adapter: object) -> None:
        pass

    def _step(self, name: str) -> None:
        self.asked.append(name)
        if name in self.errors:
            raise self.errors[name]

    def endpoint(self) -> str:
        self._step("endpoint")
        return self.url

    def negotiate(self) -> str:
        self._step("negotiate")
        return "1.39"

    def get_tree(self, root_uuid: str) -> list[dict]:
        self._step(f"get_tree {root_uuid}")
        return []


@pytest.fixture
def client(monkeypatch) -> type[Client]:
    client = type("ProbedClient", (Client,), {"errors": {}, "asked": []})
    monkeypatch.setattr(run, "PlacementClient", client)
    monkeypatch.setattr(run, "adapter_from_conf", lambda conf: "adapter")
    return client


def test_keystone_and_placement_answering_are_two_probes(conf, client):
    assert run.placement(conf, ROOT) == (
        Probe(Dependency.KEYSTONE, KEYSTONE),
        Probe(Dependency.PLACEMENT, PLACEMENT, detail="microversion 1.39"))
    assert client.asked == ["endpoint", "negotiate", f"get_tree {ROOT}"]
    # A status run by monitoring does not hang on a dead service.
    assert conf.placement.timeout == run.PROBE_TIMEOUT_SECONDS


def test_without_keystone_or_a_root_yet_only_placement_s_versions_are_asked(conf, client):
    client.keystone_url = None  # noauth: no Keystone in the way
    assert run.placement(conf, None) == (
        None, Probe(Dependency.PLACEMENT, PLACEMENT, detail="microversion 1.39"))
    assert client.asked == ["endpoint", "negotiate"]


def test_keystone_failing_leaves_placement_unknown(conf, client):
    client.errors["endpoint"] = KeystoneUnavailable(KEYSTONE, "refused the credentials (401)")
    assert run.placement(conf, ROOT) == (
        Probe(Dependency.KEYSTONE, KEYSTONE, "refused the credentials (401)"),
        Unknown("not asked: Keystone gave no token or endpoint"))
    assert client.asked == ["endpoint"]


@pytest.mark.parametrize("step", ["negotiate", f"get_tree {ROOT}"])
def test_placement_not_answering_is_its_own_problem(conf, client, step):
    client.errors[step] = PlacementUnavailable(PLACEMENT, "did not answer (timed out)")
    assert run.placement(conf, ROOT) == (
        Probe(Dependency.KEYSTONE, KEYSTONE),
        Probe(Dependency.PLACEMENT, PLACEMENT, "did not answer (timed out)"))


def test_placement_refusing_is_said_with_its_answer(conf, client):
    client.errors[f"get_tree {ROOT}"] = PlacementError(
        "Placement answered 403 to GET /resource_providers: forbidden", 403)
    assert run.placement(conf, ROOT)[1] == Probe(
        Dependency.PLACEMENT, PLACEMENT,
        "refused: Placement answered 403 to GET /resource_providers: forbidden")


def test_the_broker_is_probed_as_the_agent_does_within_the_probe_s_time(conf, monkeypatch):
    asked: list[float] = []
    found = Probe(Dependency.BROKER, "rabbit://broker:5672/")
    monkeypatch.setattr(run.broker_probe, "probe",
                        lambda c, timeout: asked.append(timeout) or found)
    assert run.broker(conf) is found
    assert asked == [run.PROBE_TIMEOUT_SECONDS]


# --- the store and the last cycle ------------------------------------------------

def test_a_store_is_read_with_its_schema_and_integrity(tmp_path):
    path = tmp_path / STORE_FILE
    Store(path, ROOT).close()
    assert run.store(path) == StoreHealth(str(path), None, SCHEMA_VERSION, ("ok",))


@pytest.mark.parametrize("content, problem", [
    (None, "missing: the agent has not run here"),
    (b"", "empty: the agent has not run here"),
])
def test_no_store_yet_says_the_agent_has_not_run(tmp_path, content, problem):
    path = tmp_path / STORE_FILE
    if content is not None:
        path.write_bytes(content)
    assert run.store(path) == StoreHealth(str(path), problem)


def test_a_file_that_is_no_store_is_corrupt_saying_why(tmp_path):
    path = tmp_path / STORE_FILE
    path.write_bytes(b"not a database, written by something else" * 100)
    health = run.store(path)
    assert health.problem is not None and health.problem.startswith("corrupt: ")
    assert "DatabaseError" in health.problem
    assert (health.schema_version, health.integrity) == (None, None)


def test_a_store_that_cannot_be_opened_is_said_without_repeating_its_path(tmp_path):
    path = tmp_path / STORE_FILE
    path.mkdir()
    assert run.store(path) == StoreHealth(str(path), "cannot be opened: not a regular file")


def test_a_store_damaged_under_its_check_is_corrupt(tmp_path, monkeypatch):
    """The inspection found a store, and SQLite failed while reading it
    (damaged since, or under a running agent's write)."""
    path = tmp_path / STORE_FILE
    Store(path, ROOT).close()

    def damaged(conn: sqlite3.Connection) -> int:
        raise sqlite3.DatabaseError("database disk image is malformed")

    monkeypatch.setattr(run, "schema_version", damaged)
    assert run.store(path) == StoreHealth(
        str(path), "corrupt: DatabaseError: database disk image is malformed")


def test_the_last_cycle_is_its_record_none_before_any_or_unknown_when_unreadable(tmp_path):
    assert run.last_cycle(str(tmp_path)) is None
    record = cycle_record.CycleRecord(41, 1700000000.0, 1699999990.0, "")
    cycle_record.write(cycle_record.path_in(tmp_path), record)
    assert run.last_cycle(str(tmp_path)) == record
    cycle_record.path_in(tmp_path).write_text(json.dumps({"pid": 41}))
    found = run.last_cycle(str(tmp_path))
    assert isinstance(found, Unknown)
    assert found.why.startswith(f"{cycle_record.path_in(tmp_path)}: not a cycle record (")


# --- the tree, and an agent opened beside the running one -----------------------

INSTANCE = "3c1f5a9e-7b2d-4e8f-a6c0-1d9b8e7f6a5c"


@pytest.fixture
def agent(tmp_path):
    placement = FakePlacement()
    agent = agent_on_fake_host(tmp_path, client=placement)
    agent.placement = placement  # the stand-in, for the test to set
    yield agent
    agent.manager.tracker.store.close()


def model_in_placement(agent: Agent) -> None:
    agent.placement.has_tree(agent.build_model(agent.driver.get_host_inventory()).tree)


def test_a_tree_as_the_model_is_in_step_and_reads_no_allocation(agent):
    model_in_placement(agent)
    report = run.tree_report(agent)
    assert report.verdict is TreeVerdict.IN_STEP and report.differences == []
    assert agent.placement.tree_reads == 1 and agent.placement.provider_reads == []


def test_an_unhealed_class_names_its_holders_by_their_instance(agent):
    cell = placement_as_flat_mode_left_it(agent, agent.placement)
    agent.manager.tracker.set_pools(
        agent.build_model(agent.driver.get_host_inventory()).pools_by_uuid({}))
    agent.manager.tracker.claim_build(INSTANCE, {"name": "web-1", "vcpus": 1,
                                                 "memory_mb": 512},
                                      {cell: {"resources": {"VCPU": 1, "MEMORY_MB": 512}}})
    agent.placement.held[INSTANCE] = {ROOT: {"VCPU": 1, "MEMORY_MB": 512}}
    agent.placement.held["unknown-consumer"] = {ROOT: {"VCPU": 2}}
    report = run.tree_report(agent)
    assert report.verdict is TreeVerdict.OUT_OF_STEP
    assert {(u.resource_class, u.used, u.holders) for u in report.unhealed} == {
        ("VCPU", 3, (Holder(INSTANCE, 1, "web-1"), Holder("unknown-consumer", 2))),
        ("MEMORY_MB", 512, (Holder(INSTANCE, 512, "web-1"),))}
    # Only the provider the model takes classes off is read.
    assert agent.placement.provider_reads == [ROOT]


def test_a_hypervisor_not_answering_is_the_report_s_one_line(agent, monkeypatch):
    model_in_placement(agent)

    def unavailable():
        raise DriverUnavailable("libvirt did not answer", URI, "did not answer (timed out)")

    monkeypatch.setattr(agent.driver, "get_host_inventory", unavailable)
    with pytest.raises(AgentError, match="^the hypervisor did not answer: libvirt did not "
                                         "answer$"):
        run.tree_report(agent)


@pytest.fixture
def agent_ran_here(conf) -> Path:
    """An agent of the fake driver ran in ``conf``'s state path and stopped."""
    composition.compose(conf).stop()
    return Path(conf.state_path)


def opened_beside(conf, monkeypatch) -> list[tuple[bool, Agent]]:
    """The agents read_beside_agent composes, with whether it held the lock;
    their drivers' init_host and cleanup journaled on the agent."""
    made: list[tuple[bool, Agent]] = []

    def compose(conf, holder: bool) -> Agent:
        agent = composition.compose(conf, holder=holder)
        agent.journal = []
        agent.driver.init_host = lambda: agent.journal.append("init_host")
        agent.driver.cleanup = lambda: agent.journal.append("cleanup")
        made.append((holder, agent))
        return agent

    monkeypatch.setattr(run, "compose", compose)
    return made


def ours(state_path: Path) -> dict[str, bytes]:
    """The state directory's files and what they hold, but SQLite's own
    write-ahead log and shared memory, which a reader of a store in WAL
    mode makes when the agent that wrote it has stopped."""
    return {p.name: p.read_bytes() for p in sorted(state_path.iterdir())
            if not p.name.endswith(("-wal", "-shm"))}


def closed(agent: Agent) -> bool:
    try:
        agent.manager.tracker.store.read(lambda c: c.execute("SELECT 1").fetchone())
    except StoreError:
        return True
    return False


def test_an_agent_opened_beside_a_running_one_reads_and_is_closed(conf, agent_ran_here,
                                                                   monkeypatch):
    made = opened_beside(conf, monkeypatch)
    before = ours(agent_ran_here)
    found = run.read_beside_agent(conf, lambda agent: (
        agent.manager.tracker.store.read_only, agent.journal[:]))
    [(holder, agent)] = made
    assert not holder  # no lock taken: the running agent holds it
    assert found == (True, ["init_host"])
    assert agent.journal == ["init_host", "cleanup"] and closed(agent)
    assert ours(agent_ran_here) == before


def test_an_agent_opened_beside_is_closed_when_its_read_fails(conf, agent_ran_here,
                                                              monkeypatch):
    made = opened_beside(conf, monkeypatch)

    def read(agent: Agent) -> None:
        raise PlacementUnavailable(PLACEMENT, "did not answer (timed out)")

    with pytest.raises(PlacementUnavailable):
        run.read_beside_agent(conf, read)
    [(_, agent)] = made
    assert agent.journal == ["init_host", "cleanup"] and closed(agent)
