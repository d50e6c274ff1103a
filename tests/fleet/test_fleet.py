"""A small fleet (tools/fleet_sim): 12 real agents in this process, each
with its own state directory, store, update loop, RPC and heartbeat
servers, on the machine's RabbitMQ and a Placement of the test's own
(SQLite, one process: a MariaDB Placement takes too long to start for the
suite; tools/fleet runs on one). Requests are counted in Placement's log;
"in step" is read from Placement's database and asked over RPC. A smaller
fleet runs the operator's and the scheduler's scenarios
(tools/fleet_sim/scenarios.py)."""
from __future__ import annotations

import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.rpc.heartbeat import Heartbeat
from compute_agent.tree.host_tree import TreeMode
from tests.waiting import wait_for
from tools.fleet_sim.agents import Fleet, FleetHost
from tools.fleet_sim.hosts import Timing, write_agent_conf
from tools.fleet_sim.placement import SqlitePlacement
from tools.fleet_sim.run import BusClients, idle_cost, wait_in_step
from tools.fleet_sim.scenarios import candidates_in_each_mode, ctl_conf, ctl_hosts, evacuate

BROKER = "rabbit://guest:guest@127.0.0.1:5672/"
HOSTS = 12
# Short enough that several reconciliations, each due to read the
# allocations by age, fall inside the idle window.
TIMING = Timing(update_interval=1, update_jitter=1, reconcile_interval=2,
                allocation_refresh_interval=1)


def cycles_done(fleet: Fleet, cycles: int, timeout: float = 60) -> None:
    """Every host through ``cycles`` more cycles."""
    before = fleet.status()
    wait_for(lambda: min(h["cycles"] - b["cycles"] for h, b in zip(fleet.status(), before))
             >= cycles, timeout, interval=0.5, message="the fleet's loops do not turn")


@contextmanager
def registered_fleet(directory: Path, hosts: int, timing: Timing):
    """``hosts`` agents registered and in step: (fleet, placement, the
    run's clients on the bus, the agents' config writer by tree mode, the
    operator's config path and config)."""
    placement = SqlitePlacement(directory / "placement")
    placement.start()
    run = uuid.uuid4().hex[:6]

    def write_confs(mode: TreeMode) -> list[Path]:
        return [write_agent_conf(directory / f"h{i}", f"fleet-{run}-{i:02d}", i,
                                 placement.url, BROKER, timing, mode)
                for i in range(hosts)]

    fleet = Fleet([FleetHost(path) for path in write_confs(TreeMode.NESTED)])
    conf_path, conf = ctl_conf(directory, placement.url, BROKER, timing.service_down_time)
    bus = BusClients(ComputeAgentAPI(conf, timeout=10), Heartbeat(conf))
    try:
        # Registered a few at a time: SQLite takes one writer at a time.
        fleet.starting_at_once = 4
        fleet.start()
        seconds, late = wait_in_step(fleet.status, placement, None, 120, bus)
        assert not late, f"not in step after registration: {late}"
        yield fleet, placement, bus, write_confs, conf_path, conf
    finally:
        fleet.stop()
        bus.close()
        placement.stop()


@pytest.fixture
def fleet(tmp_path, services):
    with registered_fleet(tmp_path, HOSTS, TIMING) as (fleet, placement, bus, *_):
        fleet.starting_at_once = None
        # A reconciliation after the last write of registration: the
        # providers whose generation that write moved are read there.
        cycles_done(fleet, 2 * TIMING.reconcile_interval)
        yield fleet, placement, bus


def test_an_idle_empty_fleet_and_its_restart_storm(fleet):
    """One registration for both checks: it takes most of the test's time.
    An idle empty host sends one request a cycle, its allocation reads due
    by age included; every agent restarted at once leaves no host out of
    step."""
    fleet, placement, bus = fleet
    before, mark = fleet.status(), placement.log.mark()
    # Two reconciliations per host at least, each with every provider's
    # allocations older than allocation_refresh_interval.
    cycles_done(fleet, 5)
    requests = placement.log.since(mark)
    cost = idle_cost(before, fleet.status(), requests)
    assert cost.requests["allocations"] == 0, cost.as_dict()
    assert cost.requests["other"] == 0, cost.as_dict()
    # At most one cycle a host still in flight at the window's end.
    assert cost.requests["tree"] <= cost.host_cycles + HOSTS, cost.as_dict()

    since = time.time()
    fleet.restart()
    seconds, late = wait_in_step(fleet.status, placement, since, 120, bus)
    assert not late, f"out of step after every agent restarted at once: {late}"


SCENARIO_HOSTS = 4
# The heartbeat's deadline short: the evacuation waits it out twice (the
# conductor's check and the destination's fence).
SCENARIO_TIMING = Timing(update_interval=1, update_jitter=1, reconcile_interval=2,
                         allocation_refresh_interval=1, service_down_time=3)
SMALL_INSTANCES = 3


def test_operator_and_scheduler_scenarios(tmp_path, services):
    """compute-agent-ctl hosts lists every host up; the flavor's allocation
    candidates (a VF and a vGPU on one NUMA cell where there are cells)
    find every host in each tree mode the agents are restarted in; a
    host's instances evacuated by the conductor each run on another host
    with their VF and vGPU claimed."""
    with registered_fleet(tmp_path, SCENARIO_HOSTS, SCENARIO_TIMING) as (
            fleet, placement, bus, write_confs, conf_path, conf):
        names = [h.name for h in fleet.hosts]
        listed = ctl_hosts(conf_path, names)
        assert listed["ctl_hosts_listed"] == SCENARIO_HOSTS, listed
        assert listed["ctl_hosts_down"] == [], listed

        def restart_in(mode: TreeMode) -> None:
            write_confs(mode)
            since = time.time()
            fleet.restart()
            seconds, late = wait_in_step(fleet.status, placement, since, 60, bus)
            assert not late, f"not in step in {mode.value} mode: {late}"

        fleet.starting_at_once = 2  # SQLite's one writer, as at registration
        found = candidates_in_each_mode(restart_in, placement.url, queries=3)
        # One candidate a host: its NIC and GPU are both on cell 0.
        assert {mode: (f["hosts"], f["candidates"]) for mode, f in found.items()} == {
            mode.value: (SCENARIO_HOSTS, SCENARIO_HOSTS) for mode in TreeMode}, found

        source = fleet.hosts[0]
        instances = source.build_small(placement.url, SMALL_INSTANCES)
        source.stop()
        moved = evacuate(conf, bus.api, source.name)
        assert moved["evacuation_instances"] == SMALL_INSTANCES, moved
        assert moved["evacuation_landed"] == SMALL_INSTANCES, moved
        source.start()
        assert bus.api.get_host_info(source.name)["instances"] == 0
        assert not set(instances) & {i["uuid"] for i in bus.api.list_instances(source.name)}
