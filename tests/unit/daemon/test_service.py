"""The update loop (compute_agent/daemon/service.py's Agent) on a fake
host, its Placement sync the test's: its start (the first cycle waits its
share of update_jitter, as the loop's later cycles do: a fleet restarted at
once does not reach Placement in one burst), what a cycle does and how it
ends, the loop's turns and waits, and its stop."""
from __future__ import annotations

import dataclasses
import logging
import threading
from pathlib import Path

import pytest
from oslo_config import cfg

from compute_agent import config
from compute_agent.daemon import cycle_record, service
from compute_agent.daemon.errors import AnotherAgentServesHost
from compute_agent.daemon.probes import Phase
from compute_agent.daemon.service import Agent, AgentSettings, CycleOutcome
from compute_agent.dependencies import Dependency, Health
from compute_agent.drivers.errors import DriverUnavailable, InvalidHostData
from compute_agent.exception import (
    ConfigError,
    KeystoneUnavailable,
    PlacementError,
    PlacementUnavailable,
)
from compute_agent.health.run import HealthSettings
from compute_agent.metrics import PREFIX, CycleResult
from compute_agent.placement.sync import SyncResult
from compute_agent.store.errors import StoreError
from compute_agent.store.queries import put_placement_view_sql
from compute_agent.store.store import STORE_FILE, Store
from compute_agent.tree.provider_tree import Provider, ProviderTree
from tests.unit.daemon.agents import ROOT, UnusedClient, agent_on_fake_host


class RecordedWaits(threading.Event):
    def __init__(self, seen: list):
        super().__init__()
        self.seen = seen

    def wait(self, timeout=None):
        self.seen.append(("wait", timeout))
        return self.is_set()


def started_agent(state_dir: Path, jitter: float, share: float) -> list:
    """What start() did, in order, with the jitter drawn at ``share`` of
    its range; the loop's own waits after it are left out."""
    agent = agent_on_fake_host(state_dir, AgentSettings(update_interval=3600,
                                                        update_jitter=jitter))
    seen: list = []
    agent.draw_jitter = lambda low, high: low + share * (high - low)
    agent.stopping = RecordedWaits(seen)
    agent.run_cycle = lambda: seen.append("cycle") or CycleOutcome(True)
    agent._loop = lambda watchdog: None
    agent.start()
    agent.stop()
    return seen[:2]


def test_the_first_cycle_waits_its_share_of_the_jitter(tmp_path):
    assert started_agent(tmp_path / "a", jitter=30, share=0.5) == [("wait", 15.0), "cycle"]
    assert started_agent(tmp_path / "b", jitter=30, share=1.0) == [("wait", 30.0), "cycle"]


def test_without_jitter_the_first_cycle_is_at_once(tmp_path):
    assert started_agent(tmp_path, jitter=0, share=0.7) == [("wait", 0.0), "cycle"]


def test_bug_claims_saw_a_device_taken_out_only_after_placement_reserved_it(tmp_path):
    """The cycle wrote Placement (the device reserved), then the store's
    copy of its view, and only then gave the tracker the pools without the
    device: a claim in that window got it (test_device_health's claim
    after an AER error, once in a clean-clone CI run). The tracker has
    this cycle's pools before the sync writes anything."""
    agent = agent_on_fake_host(tmp_path)
    seen_by_claims = []

    def sync(tree):
        seen_by_claims.append(agent.manager.tracker.pools())
        raise RuntimeError("the test's Placement stops here")

    built = agent.build_model(agent.driver.get_host_inventory())
    agent.build_model = lambda inventory: built
    agent.sync.sync = sync
    try:
        agent.update_provider_tree()
    except RuntimeError:
        pass
    assert built.pools_by_uuid({})  # the host has pools to see
    assert seen_by_claims == [built.pools_by_uuid({})]


@pytest.fixture
def agent(tmp_path):
    agent = agent_on_fake_host(tmp_path)
    yield agent
    agent.manager.tracker.store.close()


def placement_takes(agent: Agent, generation: int = 1) -> list[ProviderTree]:
    """The agent's sync writes the tree it is given, which Placement then
    has at ``generation``; the cache each sync found, in order."""
    found: list[ProviderTree] = []

    def sync(tree: ProviderTree) -> SyncResult:
        found.append(agent.sync.cache)
        agent.sync.cache = ProviderTree(dataclasses.replace(p, generation=generation)
                                        for p in tree)
        return SyncResult(writes=len(tree), tree=agent.sync.cache)

    agent.sync.sync = sync
    return found


def generations(tree: ProviderTree) -> dict[str, int | None]:
    return {p.name: p.generation for p in tree}


def lines(caplog, level: int = logging.INFO) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name == service.__name__ and r.levelno >= level]


# --- a cycle ----------------------------------------------------------------

def test_a_cycle_keeps_placements_view_which_a_restart_trusts(tmp_path):
    agent = agent_on_fake_host(tmp_path)
    placement_takes(agent, generation=7)
    outcome = agent.run_cycle()
    assert (outcome.ok, outcome.kind, outcome.result.writes) == (True, CycleResult.OK, 2)
    assert generations(agent.last_tree) == {"h": 7, "h_numa_0": 7}
    agent.stop()
    restarted = agent_on_fake_host(tmp_path)
    assert generations(restarted.sync.cache) == {"h": 7, "h_numa_0": 7}
    restarted.manager.tracker.store.close()


def test_a_saved_view_that_is_no_tree_is_read_afresh(tmp_path, caplog):
    store = Store(tmp_path / STORE_FILE, ROOT)
    store.write(put_placement_view_sql([Provider("cell", "h_numa_0", "gone", generation=3)]))
    store.close()
    agent = agent_on_fake_host(tmp_path)
    assert len(agent.sync.cache) == 0
    assert lines(caplog) == [("WARNING", "Saved view of Placement unusable, reading it "
                                         "afresh: provider h_numa_0: parent gone is not in "
                                         "the tree")]
    agent.manager.tracker.store.close()


def test_a_view_the_store_did_not_take_is_saved_by_the_next_cycle(tmp_path, caplog):
    agent = agent_on_fake_host(tmp_path)
    placement_takes(agent, generation=4)
    store = agent.manager.tracker.store
    write = store.write
    refusals = [StoreError("database or disk is full")]

    def write_once_refused(work):
        if refusals and isinstance(work, list) and "placement_view" in work[0][0]:
            raise refusals.pop()
        return write(work)

    store.write = write_once_refused
    assert agent.run_cycle().ok  # a cache: its loss costs the cycle nothing
    assert lines(caplog) == [("WARNING", "Placement's view not saved; the next cycle "
                                         "tries again: database or disk is full")]
    assert agent.run_cycle().ok
    agent.stop()
    restarted = agent_on_fake_host(tmp_path)
    assert generations(restarted.sync.cache) == {"h": 4, "h_numa_0": 4}
    restarted.manager.tracker.store.close()


def test_guests_that_cannot_be_read_are_one_line_and_the_cycle_goes_on(agent, caplog):
    placement_takes(agent)

    def unreadable(reread: bool = False):
        raise InvalidHostData("guest vm-1", "devices", "two disks on one target")

    agent.driver.guest_holdings = unreadable
    assert agent.run_cycle().ok
    [(level, line)] = lines(caplog)
    assert level == "WARNING" and line.startswith("Guests not read: ")


def test_sighup_drops_the_cache_before_the_next_cycle(agent, caplog):
    caplog.set_level(logging.INFO, logger=service.__name__)
    found = placement_takes(agent)
    agent.run_cycle()
    dropped_allocations = []
    agent.reconciliation.drop_allocations = lambda: dropped_allocations.append(True)
    agent.drop_cache()
    assert dropped_allocations == [True]
    assert agent._wake.is_set()  # the next cycle comes at once
    agent.run_cycle()
    assert [len(cache) for cache in found] == [0, 0]
    assert ("INFO", "Placement cache dropped") in lines(caplog)
    agent.run_cycle()
    assert len(found[2]) == 2  # dropped once


LIBVIRT = "qemu:///system"
PLACEMENT = "http://placement.invalid"


class KeystoneUser(UnusedClient):
    """A Placement client whose auth plugin asks Keystone for its token."""
    keystone_url = "http://keystone"


def cycle_fails_with(agent: Agent, error: Exception) -> None:
    def fails():
        raise error

    agent.update_provider_tree = fails


@pytest.mark.parametrize("error,kind,reason,states", [
    (DriverUnavailable("gone", LIBVIRT, "did not answer (gone)"),
     CycleResult.HYPERVISOR_UNAVAILABLE, f"libvirt at {LIBVIRT} did not answer (gone)",
     {Dependency.LIBVIRT: Health.DOWN, Dependency.PLACEMENT: Health.UNKNOWN}),
    (PlacementUnavailable(PLACEMENT, "did not answer (refused)"),
     CycleResult.PLACEMENT_UNAVAILABLE, f"Placement at {PLACEMENT} did not answer (refused)",
     {Dependency.LIBVIRT: Health.UP, Dependency.PLACEMENT: Health.DOWN}),
    (ConfigError("[pci] device_spec: no such device"), CycleResult.CONFIG_ERROR,
     "configuration error, cycle skipped: [pci] device_spec: no such device",
     {Dependency.LIBVIRT: Health.UNKNOWN, Dependency.PLACEMENT: Health.UNKNOWN}),
    (PlacementError("409 Conflict: inventory in use"), CycleResult.FAILED,
     "cycle failed: 409 Conflict: inventory in use",
     {Dependency.LIBVIRT: Health.UNKNOWN, Dependency.PLACEMENT: Health.UNKNOWN}),
    (KeyError("a bug"), CycleResult.UNEXPECTED_ERROR, "unexpected error: KeyError: 'a bug'",
     {Dependency.LIBVIRT: Health.UNKNOWN, Dependency.PLACEMENT: Health.UNKNOWN}),
])
def test_a_cycle_that_fails_says_why_and_counts_by_cause(tmp_path, error, kind, reason,
                                                          states):
    record = tmp_path / cycle_record.FILENAME
    agent = agent_on_fake_host(tmp_path, AgentSettings(record_path=record))
    cycle_fails_with(agent, error)

    outcome = agent.run_cycle()
    assert (outcome.ok, outcome.kind, outcome.reason) == (False, kind, reason)
    snapshot = agent.dependencies.snapshot()
    assert {d: snapshot[d].health for d in states} == states
    assert agent.metrics.registry.get_sample_value(
        f"{PREFIX}_cycles_total", {"result": kind.value}) == 1
    assert cycle_record.read(record).last_problem == reason
    facts = agent.probe_facts()
    assert (facts.cycle_succeeded, facts.last_problem) == (False, reason)
    agent.manager.tracker.store.close()


def test_a_cycle_that_succeeds_says_each_dependency_answered(tmp_path):
    record = tmp_path / cycle_record.FILENAME
    agent = agent_on_fake_host(tmp_path, AgentSettings(record_path=record))
    placement_takes(agent)
    assert agent.run_cycle().kind is CycleResult.OK
    snapshot = agent.dependencies.snapshot()
    assert [(snapshot[d].health, snapshot[d].url) for d in agent.cycle_path] == [
        (Health.UP, ""), (Health.UP, PLACEMENT)]
    assert agent.probe_facts().cycle_succeeded
    written = cycle_record.read(record)
    assert written.last_problem == "" and written.last_success_at is not None
    agent.manager.tracker.store.close()


def test_the_cycle_of_a_keystone_user_asks_keystone_between_libvirt_and_placement(tmp_path):
    agent = agent_on_fake_host(tmp_path, client=KeystoneUser())
    assert agent.cycle_path == (Dependency.LIBVIRT, Dependency.KEYSTONE, Dependency.PLACEMENT)
    cycle_fails_with(agent, KeystoneUnavailable("http://keystone",
                                                "refused the agent's credentials"))
    outcome = agent.run_cycle()
    assert (outcome.kind, outcome.reason) == (
        CycleResult.KEYSTONE_UNAVAILABLE,
        "Keystone at http://keystone refused the agent's credentials")
    snapshot = agent.dependencies.snapshot()
    assert [snapshot[d].health for d in agent.cycle_path] == [
        Health.UP, Health.DOWN, Health.UNKNOWN]
    placement_takes(agent)
    del agent.update_provider_tree  # the cycle its own again
    assert agent.run_cycle().ok
    snapshot = agent.dependencies.snapshot()
    assert [(snapshot[d].health, snapshot[d].url) for d in agent.cycle_path] == [
        (Health.UP, ""), (Health.UP, "http://keystone"), (Health.UP, PLACEMENT)]
    agent.manager.tracker.store.close()


# The tree a check that passed read, which its cycle then uses.
CHECKED_TREE = [{"uuid": ROOT, "name": "node1", "generation": 1, "parent_provider_uuid": None}]


class PlacementCheckSeen:
    """The one-agent check the start could not run: asked with what the
    agent has, its answers given in order (an error, or None: no other
    agent)."""

    def __init__(self, *answers: Exception | None) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[object, str | None]] = []

    def run(self, client, compute_id):
        self.asked.append((client, compute_id))
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer
        return CHECKED_TREE


def test_the_start_s_one_agent_check_is_asked_until_placement_answers_it(agent):
    placement_takes(agent)
    check = PlacementCheckSeen(PlacementUnavailable(PLACEMENT, "did not answer (x)"), None)
    agent.placement_check = check
    assert agent.run_cycle().kind is CycleResult.PLACEMENT_UNAVAILABLE
    primed: list[list[dict]] = []
    agent.sync.prime = primed.append
    assert agent.run_cycle().ok
    assert primed == [CHECKED_TREE]  # the check's tree read is the cycle's
    assert agent.run_cycle().ok
    assert check.asked == [(agent.sync.client, ROOT)] * 2


def test_another_agent_found_by_a_cycle_ends_the_loop(agent):
    placement_takes(agent)
    agent.placement_check = PlacementCheckSeen(AnotherAgentServesHost("host h: another"))
    with pytest.raises(AnotherAgentServesHost):
        agent.run_cycle()


# --- the loop ---------------------------------------------------------------

def test_the_loop_reconciles_every_reconcile_interval_cycles(tmp_path):
    agent = agent_on_fake_host(tmp_path, AgentSettings(update_interval=0,
                                                       reconcile_interval=3))
    turns: list[str] = []

    def cycle() -> CycleOutcome:
        assert not agent._wake.is_set()  # cleared: a change now wakes the next turn
        agent.wake()
        turns.append("cycle")
        if turns.count("cycle") == 7:
            agent.stopping.set()
        return CycleOutcome(True)

    agent.run_cycle = cycle
    agent.reconcile = lambda at_start: turns.append(f"reconcile at_start={at_start}")
    agent.manager.resume_rebuilds = lambda: turns.append("resume")
    agent._loop(None)
    assert turns == (["cycle", "resume"] * 2 + ["cycle", "resume", "reconcile at_start=False"]
                     ) * 2 + ["cycle", "resume"]
    agent.manager.tracker.store.close()


def test_a_reconciliation_without_the_hypervisor_says_it_is_down_once(agent, caplog):
    def unavailable(at_start):
        raise DriverUnavailable("gone", LIBVIRT, "did not answer (gone)")

    agent.reconcile = unavailable
    agent._reconcile_safely(at_start=False)
    agent._reconcile_safely(at_start=False)
    state = agent.dependencies.snapshot()[Dependency.LIBVIRT]
    assert (state.health, state.failures) == (Health.DOWN, 2)
    assert lines(caplog) == []  # the dependency's own line, once: not the loop's


@pytest.mark.parametrize("step", ["_reconcile_safely", "_resume_rebuilds_safely"])
def test_a_bug_in_a_turns_step_is_logged_and_the_loop_goes_on(agent, caplog, step):
    def bug(*args, **kwargs):
        raise KeyError("a bug")

    agent.reconcile = bug
    agent.manager.resume_rebuilds = bug
    getattr(agent, step)(*(["at_start"] if step == "_reconcile_safely" else []))
    [record] = [r for r in caplog.records if r.name == service.__name__]
    assert record.levelname == "ERROR" and record.exc_info is not None


class CountedWatchdog:
    interval = 1800.0

    def __init__(self) -> None:
        self.pings = 0

    def ping(self) -> None:
        self.pings += 1


def test_a_loop_that_waits_pings_the_watchdog_as_it_goes(agent):
    watchdog = CountedWatchdog()
    agent._wait_for_next_cycle(0, watchdog)  # due now: one ping, no wait
    assert watchdog.pings == 1
    agent.wake()
    agent._wait_for_next_cycle(3600, watchdog)  # woken: at once, after a ping
    assert watchdog.pings == 2


def test_a_woken_loop_turns_at_once_without_a_watchdog(agent):
    agent.wake()
    waited = threading.Event()
    threading.Thread(target=lambda: (agent._wait_for_next_cycle(3600, None), waited.set()),
                     daemon=True).start()
    assert waited.wait(10)


def test_a_store_moved_under_the_loop_is_found_by_its_next_turn(agent):
    told: list[str] = []
    agent.manager.tracker.store.on_moved(told.append)
    Path(agent.manager.tracker.store.path).unlink()
    agent._check_store_file()
    assert told and agent.probe_facts().store_problem == told[0]


# --- start and stop ---------------------------------------------------------

def start_steps(tmp_path, monkeypatch, settings: AgentSettings) -> tuple[Agent, list[str]]:
    """The steps start() took, in order, each of start_up's on its own."""
    agent = agent_on_fake_host(tmp_path, settings)
    steps: list[str] = []
    monkeypatch.setattr(service.start_up, "restore_after_reboot",
                        lambda vf_restore, driver: steps.append("restore VFs"))
    monkeypatch.setattr(service.start_up, "restore_vgpu_types",
                        lambda manager, driver: steps.append("restore vGPU types")
                        or {"0000:81:00.5": "not back"})
    monkeypatch.setattr(service.start_up, "heal_safely", lambda a: steps.append("heal"))
    monkeypatch.setattr(service.start_up, "align_store_safely",
                        lambda a: steps.append("align the store"))
    agent.run_cycle = lambda: steps.append("cycle") or CycleOutcome(True)
    agent._reconcile_safely = lambda at_start: steps.append(f"reconcile at_start={at_start}")
    agent._loop = lambda watchdog: steps.append("loop")
    agent.start()
    agent.stop()
    return agent, steps


def test_the_start_heals_before_its_first_cycle_and_reconciles_after(tmp_path, monkeypatch):
    agent, steps = start_steps(tmp_path, monkeypatch, AgentSettings(heal_on_startup=True))
    assert steps == ["restore VFs", "restore vGPU types", "heal", "cycle", "align the store",
                     "reconcile at_start=True", "loop"]
    assert agent.vgpu_types_not_restored == {"0000:81:00.5": "not back"}


def test_the_start_heals_only_when_asked(tmp_path, monkeypatch):
    _, steps = start_steps(tmp_path, monkeypatch, AgentSettings())
    assert "heal" not in steps and "cycle" in steps


def test_stop_closes_the_store_and_the_probes_say_so(agent):
    assert agent.probe_facts().phase is Phase.STARTING
    agent.stop()
    facts = agent.probe_facts()
    assert (facts.phase, facts.store_problem, facts.loop_running) == (
        Phase.STOPPING, "closed", False)
    with pytest.raises(StoreError):
        agent.manager.tracker.store.write(put_placement_view_sql([]))


def test_a_store_that_cannot_be_closed_is_one_line(agent, caplog):
    store = agent.manager.tracker.store
    close = store.close

    def refused():
        close()
        raise StoreError("disk I/O error")

    store.close = refused
    agent.stop()
    store.close = close
    assert lines(caplog) == [("WARNING", "Store not marked closed; the next start treats it "
                                         "as after a crash: disk I/O error")]


def test_the_settings_are_the_configs(tmp_path):
    path = tmp_path / "agent.conf"
    path.write_text(f"[DEFAULT]\nstate_path = {tmp_path}\nupdate_interval = 30\n"
                    "update_jitter = 5\nreconcile_interval = 4\norphan_grace_period = 90\n"
                    "live_migration_announced_timeout = 120\n[heal]\non_startup = true\n"
                    "[metrics]\nlisten = 127.0.0.1:9180\nhealthz_turn_limit = 300\n"
                    "[devices]\nhealth_poll_interval = 2.5\n"
                    "health_correctable_errors_per_minute = 7\n")
    conf = cfg.ConfigOpts()
    config.register_opts(conf)
    conf(["--config-file", str(path)])
    assert AgentSettings.from_conf(conf, holder=True) == AgentSettings(
        update_interval=30, update_jitter=5, reconcile_interval=4, orphan_grace_period=90,
        live_migration_announced_timeout=120, heal_on_startup=True,
        metrics_listen="127.0.0.1:9180", healthz_turn_limit=300,
        health=HealthSettings(poll_interval=2.5, correctable_per_minute=7),
        record_path=tmp_path / "last_cycle.json")
    assert AgentSettings.from_conf(conf, holder=False).record_path is None
