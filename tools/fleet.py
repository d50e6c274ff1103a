"""A fleet of real agents on one Placement (several gunicorn workers on a
MariaDB database of its own) and a RabbitMQ of its own (one node, or a
cluster of three with quorum queues: --broker-nodes): the figures
of registration, idle cycles, a restart of every agent at once, a
Placement outage and a broker restart, counted at Placement's side
(gunicorn's access log); compute-agent-ctl hosts, the scheduler's
allocation candidates in each tree mode and an evacuation
(tools/fleet_sim/scenarios.py). docs/scale.md gives the figures of this machine.

    tools/fleet --hosts N [--broker-nodes 1|3] [--minutes M] [--scenarios A,B] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compute_agent.tree.host_tree import TreeMode
from tools.fleet_sim.broker import (
    BROKER_NODES,
    FleetBroker,
    agents_frames_received,
    frames_in_window,
)
from tools.fleet_sim.hosts import Timing, write_agent_conf
from tools.fleet_sim.placement import GunicornPlacement
from tools.fleet_sim.run import (
    BusClients,
    ProcessFleet,
    agent_cpu_ms_per_host_cycle,
    idle_cost,
    latency,
    processes_figures,
    wait_in_step,
)
from tools.fleet_sim.scenarios import candidates_in_each_mode, ctl_conf, ctl_hosts, evacuate
from tools.fleet_sim.worker import GIL_SWITCH_SECONDS

# Every scenario, in the order a run takes them; registration always runs.
SCENARIOS = ("ctl_hosts", "allocation_candidates", "idle", "idle_with_instances",
             "restart_storm", "placement_outage", "broker_restart", "evacuation")
# The host whose instances the evacuation moves, and the small instances
# built on it beside build_half's.
EVACUATED = "fleet-00000"
EVACUATED_SMALL_INSTANCES = 3
# The figures so far, in the run's directory, rewritten after each scenario.
RESULT_FILE = "result.json"


def progress(quiet: bool):
    def say(line: str) -> None:
        if not quiet:
            print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)
    return say


def scenario_list(text: str) -> tuple[str, ...]:
    """--scenarios: names of SCENARIOS, comma-separated."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{unknown[0] if unknown else text!r} is not a scenario: one of "
            + ", ".join(SCENARIOS))
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, required=True, help="agents in the fleet")
    parser.add_argument("--minutes", type=float, default=3,
                        help="each idle window (default 3)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--broker-nodes", type=int, choices=BROKER_NODES, default=1,
                        help="RabbitMQ nodes: 1 (default), or a cluster of 3 whose agents "
                             "and callers use quorum queues, stream fanout and the queue "
                             "manager (docs/scale.md)")
    parser.add_argument("--processes", type=int, default=4,
                        help="processes the agents are spread over (default 4)")
    parser.add_argument("--placement-workers", type=int, default=4,
                        help="Placement's gunicorn workers (default 4)")
    parser.add_argument("--outage-seconds", type=float, default=120,
                        help="how long Placement is stopped (default 120)")
    parser.add_argument("--update-interval", type=int, default=Timing.update_interval,
                        help=f"the agents' (default {Timing.update_interval} s)")
    parser.add_argument("--update-jitter", type=int, default=Timing.update_jitter,
                        help=f"the agents' (default {Timing.update_jitter} s)")
    parser.add_argument("--reconcile-interval", type=int, default=Timing.reconcile_interval,
                        help=f"the agents' (default {Timing.reconcile_interval} cycles)")
    parser.add_argument("--allocation-refresh-interval", type=int,
                        default=Timing.allocation_refresh_interval,
                        help=f"the agents' (default {Timing.allocation_refresh_interval} s)")
    parser.add_argument("--scenarios", type=scenario_list, default=SCENARIOS,
                        help="comma-separated, of: " + ", ".join(SCENARIOS)
                        + " (default all; registration always runs)")
    parser.add_argument("--candidate-queries", type=int, default=20,
                        help="allocation candidate queries timed per tree mode (default 20)")
    parser.add_argument("--max-allocation-candidates", type=int, default=1000,
                        help="Placement's [placement] max_allocation_candidates "
                             "(default 1000)")
    parser.add_argument("--mysql", default="127.0.0.1:3306",
                        help="MariaDB host:port; the run creates a database of its own "
                             "there and drops it after (user root, no password)")
    parser.add_argument("--dir", type=Path, help="where the run's files go "
                        "(default: a new temporary directory)")
    args = parser.parse_args()
    if args.hosts < 1:
        parser.error(f"--hosts must be at least 1, not {args.hosts}")
    if "evacuation" in args.scenarios and args.hosts < 2:
        parser.error(f"--hosts must be at least 2 for the evacuation, not {args.hosts}")
    if args.candidate_queries < 1:
        parser.error(f"--candidate-queries must be at least 1, not {args.candidate_queries}")
    # SIGTERM cleans up as an exception does: the database, the nodes.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(1))
    say = progress(args.json)
    timing = Timing(args.update_interval, args.update_jitter, args.reconcile_interval,
                    args.allocation_refresh_interval)
    root = args.dir or Path(tempfile.mkdtemp(prefix="fleet-"))
    root.mkdir(parents=True, exist_ok=True)
    result: dict = {}
    try:
        run(args, timing, root, say, result)
    except Exception as e:  # noqa: BLE001 - what was measured before is still shown
        result["error"] = f"{type(e).__name__}: {e}"
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in sorted(result.items()):
            print(f"{key:48} {json.dumps(value)}")
    return 1 if "error" in result else 0


def run(args, timing: Timing, root: Path, say, result: dict) -> None:
    """The scenarios in turn, their figures put in ``result`` as they come,
    and written to ``root``/result.json after each (a run stopped part way,
    even by SIGKILL, leaves what it measured)."""
    from compute_agent.rpc.client import ComputeAgentAPI
    from compute_agent.rpc.heartbeat import Heartbeat

    host_, port = args.mysql.rsplit(":", 1)
    say(f"starting RabbitMQ (nodes: {args.broker_nodes}) and Placement "
        f"({args.placement_workers} workers, MariaDB at {args.mysql}) in {root}; "
        f"the figures so far in {root / RESULT_FILE}")
    broker = FleetBroker(args.broker_nodes)
    placement = fleet = None
    run_started = time.monotonic()
    result.update({"hosts": args.hosts, "processes": args.processes,
                   "broker_nodes": args.broker_nodes,
                   "broker_rabbit_options": dict(broker.rabbit_options),
                   "placement_workers": args.placement_workers,
                   "update_interval": timing.update_interval,
                   "update_jitter": timing.update_jitter,
                   "reconcile_interval": timing.reconcile_interval,
                   "allocation_refresh_interval": timing.allocation_refresh_interval,
                   "worker_gil_switch_seconds": GIL_SWITCH_SECONDS,
                   "minutes": args.minutes, "scenarios": list(args.scenarios),
                   "max_allocation_candidates": args.max_allocation_candidates})
    scenarios: dict[str, dict] = {}
    result["placement"] = scenarios

    def done(what: str) -> None:
        """``what`` measured: the figures so far on disk."""
        write_result(root, result)
        say(f"{what} done")

    try:
        broker.start()
        placement = GunicornPlacement(
            root / "placement", args.placement_workers, host_, int(port),
            max_allocation_candidates=args.max_allocation_candidates)
        placement.start()
        log = placement.log

        def write_confs(mode: TreeMode) -> list[Path]:
            return [write_agent_conf(root / "hosts" / f"fleet-{i:05d}", f"fleet-{i:05d}", i,
                                     placement.url, broker.url, timing, mode,
                                     broker.rabbit_options)
                    for i in range(args.hosts)]

        confs = write_confs(TreeMode.NESTED)
        conf_path, conf = ctl_conf(root, placement.url, broker.url, timing.service_down_time,
                                   broker.rabbit_options)
        bus = BusClients(ComputeAgentAPI(conf, timeout=30), Heartbeat(conf))
        fleet = ProcessFleet(confs, args.processes, root)
        fleet.status()  # the workers have imported everything: their base
        result["agents_cpu_group"] = fleet.cpu_group and str(fleet.cpu_group.path)

        def statuses() -> list[dict]:
            return fleet.status()[0]

        def scenario(name: str, mark: int) -> list:
            requests = [r for r in log.since(mark) if r.from_agent]
            scenarios[name] = latency(requests)
            return requests

        def until_in_step(name: str, act, late_key: str, *, since_act: bool = True,
                          rpc: bool = True) -> tuple[float, float, int]:
            """``act``, then the wait until every host is in step, its
            Placement figures the scenario ``name``: the seconds ``act``
            took, the seconds from its end until all were in step, and
            the agents' requests since it began. The hosts still late at
            the wait's end go in ``late_key``. ``since_act``: a host is in
            step only after a cycle that began after ``act`` began (else
            any in-step cycle counts); ``rpc``: and it answers RPC."""
            mark, since = log.mark(), time.time()
            started = time.monotonic()
            act()
            acted = time.monotonic()
            _, late = wait_in_step(statuses, placement, since if since_act else None, 3600,
                                   bus if rpc else None, progress=say)
            waited = time.monotonic() - acted
            if late:
                result[late_key] = late[:10]
            fleet.wait()
            return round(acted - started, 1), round(waited, 1), len(scenario(name, mark))

        # Registration from empty.
        say(f"registering {args.hosts} hosts")
        acted, waited, requests = until_in_step("register", fleet.start, "register_late",
                                                since_act=False)
        result["register_seconds"] = round(acted + waited, 1)
        result["register_requests_per_host"] = round(requests / args.hosts, 2)
        done("registration")

        def agents_frames() -> dict[str, int]:
            return agents_frames_received(broker.connections(), os.getpid())

        def broker_figures() -> dict:
            """The broker's queues and connections, and the agents' per host:
            without the run's own callers (this process's)."""
            return broker.counts(os.getpid()).as_dict(args.hosts)

        def idle(name: str) -> dict:
            say(f"{name}: {args.minutes} minutes")
            (before, processes_before), mark = fleet.status(), log.mark()
            frames, started = agents_frames(), time.monotonic()
            time.sleep(args.minutes * 60)
            after, processes_after = fleet.status()
            window = frames_in_window(frames, agents_frames())
            seconds = time.monotonic() - started
            cost = idle_cost(before, after, scenario(name, mark))
            return {**cost.as_dict(), "agent_cpu_ms_per_host_cycle": agent_cpu_ms_per_host_cycle(
                processes_before, processes_after, cost.host_cycles),
                "broker_frames_per_host_second": round(window.frames / args.hosts / seconds, 2),
                "broker_connections_lost": window.connections_lost}

        def settle() -> None:
            """One reconciliation period: the start's or the builds' reads done."""
            seconds = timing.reconcile_interval * (timing.update_interval
                                                   + timing.update_jitter)
            say(f"settling {seconds:.0f} s")
            time.sleep(seconds)

        def restart_in(mode: TreeMode) -> None:
            """Every agent restarted in ``mode``, until all are in step."""
            say(f"every agent restarted in {mode.value} mode")
            write_confs(mode)
            acted, waited, _ = until_in_step(f"tree_mode_{mode.value}", fleet.restart,
                                             f"tree_mode_{mode.value}_late")
            result["tree_mode_switch_seconds"][f"to_{mode.value}"] = round(acted + waited, 1)

        selected = set(args.scenarios)
        if "ctl_hosts" in selected:
            say("compute-agent-ctl hosts")
            try:
                result.update(ctl_hosts(conf_path, [f"fleet-{i:05d}" for i in range(args.hosts)]))
            except (RuntimeError, subprocess.TimeoutExpired) as e:  # the next scenarios go on
                result["ctl_hosts_error"] = str(e)[:300]
            done("ctl_hosts")

        if "allocation_candidates" in selected:
            # On the empty fleet: a switch of tree mode under guests leaves
            # the moving classes held until `compute-agent-manage heal`
            # (docs/operations.md), so the agents switch before any build.
            result["tree_mode_switch_seconds"] = {}
            result["allocation_candidates"] = candidates_in_each_mode(
                restart_in, placement.url, args.candidate_queries, say)
            done("allocation_candidates")

        if "idle" in selected:
            settle()
            result["idle"] = idle("idle")
            result["idle_requests_per_host_cycle"] = result["idle"]["per_host_cycle"]
        result.update(processes_figures(fleet.status()[1], args.hosts))
        result.update(broker_figures())
        done("idle")

        if selected & {"idle_with_instances", "evacuation"}:
            say("building an instance on every host, half of its devices")
            mark = log.mark()
            result["instance_providers_per_host"] = round(
                fleet.build_half(placement.url) / args.hosts, 2)
            scenario("builds", mark)
        if "idle_with_instances" in selected:
            settle()
            result["idle_with_instances"] = idle("idle_with_instances")
            result["idle_requests_per_host_cycle_with_instances"] = (
                result["idle_with_instances"]["per_host_cycle"])
            done("idle_with_instances")

        if "restart_storm" in selected:
            say("restart storm: every agent restarted at once")
            acted, waited, _ = until_in_step("restart_storm", fleet.restart,
                                             "restart_storm_late")
            result["restart_storm_seconds"] = round(acted + waited, 1)
            # Each agent's own count of what its start sent; the window's
            # requests (placement.restart_storm) also hold the cycles of
            # the hosts already back.
            sent = [h["start_requests"] for h in fleet.status()[0]
                    if h.get("start_requests") is not None]
            result["restart_requests_per_host"] = (round(sum(sent) / len(sent), 2)
                                                   if sent else None)
            done("restart_storm")

        if "placement_outage" in selected:
            say(f"Placement outage: stopped for {args.outage_seconds:.0f} s")
            placement.stop()
            time.sleep(args.outage_seconds)
            # Recovery counts from the moment Placement answers again.
            acted, waited, _ = until_in_step("placement_outage_recovery", placement.start,
                                             "placement_outage_late", rpc=False)
            result["placement_start_seconds"] = acted
            result["placement_outage_recovery_seconds"] = waited
            done("placement_outage")

        if "broker_restart" in selected:
            say("broker restart")

            _, waited, _ = until_in_step("broker_restart", broker.restart,
                                         "broker_restart_late", since_act=False)
            result["broker_restart_recovery_seconds"] = waited
            result.update({f"after_{k}": v for k, v in
                           processes_figures(fleet.status()[1], args.hosts).items()})
            result.update({f"after_{k}": v for k, v in broker_figures().items()})
            done("broker_restart")

        if "evacuation" in selected:
            say(f"evacuation of {EVACUATED}: {EVACUATED_SMALL_INSTANCES} more instances "
                "built on it, its agent stopped")
            fleet.build_small(EVACUATED, placement.url, EVACUATED_SMALL_INSTANCES)
            fleet.stop_host(EVACUATED)
            mark = log.mark()
            result.update(evacuate(conf, bus.api, EVACUATED))
            scenario("evacuation", mark)
            say(f"{EVACUATED} started again: it gives its evacuated instances up")
            acted, waited, _ = until_in_step(
                "evacuated_host_return", lambda: fleet.start_host(EVACUATED),
                "evacuated_host_return_late", since_act=False)
            result["evacuated_host_return_seconds"] = round(acted + waited, 1)
            done("evacuation")

        bus.close()
    finally:
        result["placement_peak_rps"] = max([s["peak_rps"] or 0 for s in scenarios.values()],
                                           default=None)
        result["run_seconds"] = round(time.monotonic() - run_started)
        write_result(root, result)
        say("cleaning up")
        if fleet is not None:
            fleet.close()
        if placement is not None:
            placement.close()
        broker.close()


def write_result(root: Path, result: dict) -> None:
    """``result`` as ``root``/result.json, replaced whole (never half written)."""
    partial = root / (RESULT_FILE + ".part")
    partial.write_text(json.dumps(result, sort_keys=True, indent=1) + "\n")
    os.replace(partial, root / RESULT_FILE)


if __name__ == "__main__":
    sys.exit(main())
