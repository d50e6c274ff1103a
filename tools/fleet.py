"""A fleet of real agents on one Placement (several gunicorn workers on a
MariaDB database of its own) and one RabbitMQ node of its own: the figures
of registration, idle cycles, a restart of every agent at once, a
Placement outage and a broker restart, counted at Placement's side
(gunicorn's access log); compute-agent-ctl hosts, the scheduler's
allocation candidates in each tree mode and an evacuation
(tools/fleet_sim/scenarios.py). docs/scale.md gives the figures of this machine.

    tools/fleet --hosts N [--minutes M] [--scenarios A,B] [--json]
"""
from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.tree.host_tree import TreeMode  # noqa: E402
from tools.fleet_sim.hosts import Timing, write_agent_conf  # noqa: E402
from tools.fleet_sim.placement import GunicornPlacement  # noqa: E402
from tools.fleet_sim.run import (ProcessFleet, idle_cost, latency,  # noqa: E402
                                 processes_figures, wait_in_step)
from tools.fleet_sim.scenarios import (candidates_in_each_mode, ctl_conf,  # noqa: E402
                                       ctl_hosts, evacuate)

# Every scenario, in the order a run takes them; registration always runs.
SCENARIOS = ("ctl_hosts", "allocation_candidates", "idle", "idle_with_instances",
             "restart_storm", "placement_outage", "broker_restart", "evacuation")
# The host whose instances the evacuation moves, and the small instances
# built on it beside build_half's.
EVACUATED = "fleet-00000"
EVACUATED_SMALL_INSTANCES = 3


def progress(quiet: bool):
    def say(line: str) -> None:
        if not quiet:
            print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)
    return say


def broker_counts(node: str) -> dict:
    def count(what: str) -> int:
        out = subprocess.run(["rabbitmqctl", "-q", "-n", node, what, "--no-table-headers"],
                             capture_output=True, text=True, timeout=120)
        return len([line for line in out.stdout.splitlines() if line.strip()])
    return {"broker_queues": count("list_queues"),
            "broker_connections": count("list_connections")}


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
    except Exception as e:  # what was measured before is still shown
        result["error"] = f"{type(e).__name__}: {e}"
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in sorted(result.items()):
            print(f"{key:48} {json.dumps(value)}")
    return 1 if "error" in result else 0


def run(args, timing: Timing, root: Path, say, result: dict) -> None:
    """The scenarios in turn, their figures put in ``result`` as they come."""
    from agent.rpc.client import ComputeAgentAPI
    from tests.functional.private_services import PrivateRabbitMQ

    host_, port = args.mysql.rsplit(":", 1)
    say(f"starting a RabbitMQ node and Placement ({args.placement_workers} workers, "
        f"MariaDB at {args.mysql}) in {root}")
    rabbit = PrivateRabbitMQ().start()
    placement = GunicornPlacement(root / "placement", args.placement_workers, host_,
                                  int(port),
                                  max_allocation_candidates=args.max_allocation_candidates)
    fleet = None
    result.update({"hosts": args.hosts, "processes": args.processes,
                   "placement_workers": args.placement_workers,
                   "update_interval": timing.update_interval,
                   "update_jitter": timing.update_jitter,
                   "reconcile_interval": timing.reconcile_interval,
                   "allocation_refresh_interval": timing.allocation_refresh_interval,
                   "minutes": args.minutes, "scenarios": list(args.scenarios),
                   "max_allocation_candidates": args.max_allocation_candidates})
    scenarios: dict[str, dict] = {}
    result["placement"] = scenarios
    try:
        placement.start()
        log = placement.log

        def write_confs(mode: TreeMode) -> list[Path]:
            return [write_agent_conf(root / "hosts" / f"fleet-{i:05d}", f"fleet-{i:05d}", i,
                                     placement.url, rabbit.url, timing, mode)
                    for i in range(args.hosts)]

        confs = write_confs(TreeMode.NESTED)
        conf_path, conf = ctl_conf(root, placement.url, rabbit.url, timing.service_down_time)
        api = ComputeAgentAPI(conf, timeout=30)
        fleet = ProcessFleet(confs, args.processes, root)
        fleet.status()  # the workers have imported everything: their base

        def statuses() -> list[dict]:
            return fleet.status()[0]

        def scenario(name: str, mark: int) -> list:
            requests = [r for r in log.since(mark) if r.from_agent]
            scenarios[name] = latency(requests)
            return requests

        # Registration from empty.
        say(f"registering {args.hosts} hosts")
        mark, started = log.mark(), time.monotonic()
        fleet.start()
        seconds, late = wait_in_step(statuses, placement, None, 3600, api,
                                     progress=say)
        result["register_seconds"] = round(time.monotonic() - started, 1)
        if late:
            result["register_late"] = late[:10]
        fleet.wait()
        registered = scenario("register", mark)
        result["register_requests_per_host"] = round(len(registered) / args.hosts, 2)

        def idle(name: str) -> dict:
            say(f"{name}: {args.minutes} minutes")
            before, mark = statuses(), log.mark()
            time.sleep(args.minutes * 60)
            after = statuses()
            cost = idle_cost(before, after, scenario(name, mark))
            return cost.as_dict()

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
            mark, since = log.mark(), time.time()
            started = time.monotonic()
            fleet.restart()
            seconds, late = wait_in_step(statuses, placement, since, 3600, api, progress=say)
            result["tree_mode_switch_seconds"][f"to_{mode.value}"] = round(
                time.monotonic() - started, 1)
            if late:
                result[f"tree_mode_{mode.value}_late"] = late[:10]
            fleet.wait()
            scenario(f"tree_mode_{mode.value}", mark)

        selected = set(args.scenarios)
        if "ctl_hosts" in selected:
            say("compute-agent-ctl hosts")
            result.update(ctl_hosts(conf_path, [f"fleet-{i:05d}" for i in range(args.hosts)]))

        if "allocation_candidates" in selected:
            # On the empty fleet: a switch of tree mode under guests leaves
            # the moving classes held until `compute-agent-manage heal`
            # (docs/operations.md), so the agents switch before any build.
            result["tree_mode_switch_seconds"] = {}
            result["allocation_candidates"] = candidates_in_each_mode(
                restart_in, placement.url, args.candidate_queries, say)

        if "idle" in selected:
            settle()
            result["idle"] = idle("idle")
            result["idle_requests_per_host_cycle"] = result["idle"]["per_host_cycle"]
        result.update(processes_figures(fleet.status()[1], args.hosts))
        result.update(broker_counts(rabbit.node))

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

        if "restart_storm" in selected:
            say("restart storm: every agent restarted at once")
            mark, since = log.mark(), time.time()
            started = time.monotonic()
            fleet.restart()
            seconds, late = wait_in_step(statuses, placement, since, 3600, api,
                                         progress=say)
            result["restart_storm_seconds"] = round(time.monotonic() - started, 1)
            if late:
                result["restart_storm_late"] = late[:10]
            fleet.wait()
            result["restart_requests_per_host"] = round(
                len(scenario("restart_storm", mark)) / args.hosts, 2)

        if "placement_outage" in selected:
            say(f"Placement outage: stopped for {args.outage_seconds:.0f} s")
            placement.stop()
            time.sleep(args.outage_seconds)
            mark, since = log.mark(), time.time()
            started = time.monotonic()
            placement.start()
            result["placement_start_seconds"] = round(time.monotonic() - started, 1)
            # From the moment Placement answers again.
            started = time.monotonic()
            seconds, late = wait_in_step(statuses, placement, since, 3600, None,
                                         progress=say)
            result["placement_outage_recovery_seconds"] = round(
                time.monotonic() - started, 1)
            if late:
                result["placement_outage_late"] = late[:10]
            scenario("placement_outage_recovery", mark)

        if "broker_restart" in selected:
            say("broker restart")
            rabbit.stop_app()
            rabbit.start_app()
            started = time.monotonic()
            seconds, late = wait_in_step(statuses, placement, None, 3600, api, progress=say)
            result["broker_restart_recovery_seconds"] = round(time.monotonic() - started, 1)
            if late:
                result["broker_restart_late"] = late[:10]
            result.update({f"after_{k}": v for k, v in
                           processes_figures(fleet.status()[1], args.hosts).items()})
            result.update({f"after_{k}": v for k, v in broker_counts(rabbit.node).items()})

        if "evacuation" in selected:
            say(f"evacuation of {EVACUATED}: {EVACUATED_SMALL_INSTANCES} more instances "
                "built on it, its agent stopped")
            fleet.build_small(EVACUATED, placement.url, EVACUATED_SMALL_INSTANCES)
            fleet.stop_host(EVACUATED)
            mark = log.mark()
            result.update(evacuate(conf, api, EVACUATED))
            scenario("evacuation", mark)
            say(f"{EVACUATED} started again: it gives its evacuated instances up")
            started = time.monotonic()
            fleet.start_host(EVACUATED)
            seconds, late = wait_in_step(statuses, placement, None, 3600, api, progress=say)
            result["evacuated_host_return_seconds"] = round(time.monotonic() - started, 1)
            if late:
                result["evacuated_host_return_late"] = late[:10]

        api.close()
    finally:
        result["placement_peak_rps"] = max([s["peak_rps"] or 0 for s in scenarios.values()],
                                           default=None)
        say("cleaning up")
        if fleet is not None:
            fleet.close()
        placement.close()
        rabbit.close()


if __name__ == "__main__":
    sys.exit(main())
