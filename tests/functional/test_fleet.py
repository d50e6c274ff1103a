"""A small fleet (tools/fleet_sim): 12 real agents in this process, each
with its own state directory, store, update loop, RPC and heartbeat
servers, on the machine's RabbitMQ and a Placement of the test's own
(SQLite, one process: a MariaDB Placement takes too long to start for the
suite; tools/fleet runs on one). Requests are counted in Placement's log;
"in step" is read from Placement's database and asked over RPC."""
from __future__ import annotations

import time
import uuid

import pytest

from agent.cmd.common import load_config
from agent.rpc.client import ComputeAgentAPI
from tools.fleet_sim.agents import Fleet, FleetHost
from tools.fleet_sim.hosts import Timing, write_agent_conf
from tools.fleet_sim.placement import SqlitePlacement
from tools.fleet_sim.run import idle_cost, wait_in_step

BROKER = "rabbit://guest:guest@127.0.0.1:5672/"
HOSTS = 12
# Short enough that several reconciliations, each due to read the
# allocations by age, fall inside the idle window.
TIMING = Timing(update_interval=1, update_jitter=1, reconcile_interval=2,
                allocation_refresh_interval=1)


def cycles_done(fleet: Fleet, cycles: int, timeout: float = 60) -> None:
    """Every host through ``cycles`` more cycles."""
    before = fleet.status()
    started = time.monotonic()
    while min(h["cycles"] - b["cycles"] for h, b in zip(fleet.status(), before)) < cycles:
        assert time.monotonic() - started < timeout, "the fleet's loops do not turn"
        time.sleep(0.5)


@pytest.fixture
def fleet(tmp_path, services):
    placement = SqlitePlacement(tmp_path / "placement")
    placement.start()
    run = uuid.uuid4().hex[:6]
    fleet = Fleet([FleetHost(write_agent_conf(tmp_path / f"h{i}", f"fleet-{run}-{i:02d}", i,
                                              placement.url, BROKER, TIMING))
                   for i in range(HOSTS)])
    conf_path = tmp_path / "ctl.conf"
    conf_path.write_text(f"[DEFAULT]\ntransport_url = {BROKER}\n")
    api = ComputeAgentAPI(load_config(["--config-file", str(conf_path)]), timeout=10)
    try:
        # Registered a few at a time: SQLite takes one writer at a time.
        fleet.starting_at_once = 4
        fleet.start()
        seconds, late = wait_in_step(fleet.status, placement, None, 120, api)
        assert not late, f"not in step after registration: {late}"
        fleet.starting_at_once = None
        # A reconciliation after the last write of registration: the
        # providers whose generation that write moved are read there.
        cycles_done(fleet, 2 * TIMING.reconcile_interval)
        yield fleet, placement, api
    finally:
        fleet.stop()
        api.close()
        placement.stop()


def test_an_idle_empty_fleet_and_its_restart_storm(fleet):
    """One registration for both checks: it takes most of the test's time.
    An idle empty host sends one request a cycle, its allocation reads due
    by age included; every agent restarted at once leaves no host out of
    step."""
    fleet, placement, api = fleet
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
    seconds, late = wait_in_step(fleet.status, placement, since, 120, api)
    assert not late, f"out of step after every agent restarted at once: {late}"
