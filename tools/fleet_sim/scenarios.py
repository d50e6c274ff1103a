"""The fleet's operator and scheduler scenarios: ``compute-agent-ctl
hosts`` as an operator runs it, the scheduler's allocation candidates for
one flavor in each tree mode, and an evacuation by the project's own
conductor (compute_agent/conductor/evacuation.py). Each returns its figures as a
dict of the keys docs/scale.md lists."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import requests

from compute_agent.cmd.common import load_config
from compute_agent.conductor.evacuation import Evacuator
from compute_agent.messaging import name_reply_queues_at_random
from compute_agent.placement.allocations import tree_allocations
from compute_agent.placement.client import PlacementClient, adapter_from_conf
from compute_agent.rpc.heartbeat import Heartbeat
from compute_agent.tree.host_tree import TreeMode
from tools.fleet_sim.agents import DEVICE_CLASSES_PREFIX, HEADERS
from tools.fleet_sim.hosts import VF_CLASS, rabbit_section
from tools.fleet_sim.run import percentile, worktree_env

# The flavor the scheduler places: its CPUs and memory, one VF, one vGPU.
FLAVOR_COMPUTE = "VCPU:2,MEMORY_MB:2048"


def ctl_conf(directory: Path, placement_url: str, transport_url: str,
             service_down_time: int, rabbit: Mapping[str, str] | None = None):
    """An operator's config for compute-agent-ctl and the conductor, on
    the fleet's Placement and broker, with the agents' [oslo_messaging_rabbit]
    options ``rabbit``: its path, and it loaded for the run's own callers.
    Those name their reply queues at random, as compute-agent-ctl does,
    whatever use_queue_manager says: the queue manager reads the start
    time of its process's group leader (/proc/PGID/stat), and a run
    started from a shell that has since exited (nohup, a script's
    background job) failed every call with FileNotFoundError."""
    path = directory / "ctl.conf"
    path.write_text(f"[DEFAULT]\ntransport_url = {transport_url}\n"
                    f"service_down_time = {service_down_time}\n"
                    f"[placement]\nauth_type = placement_noauth2\nendpoint = {placement_url}\n"
                    + rabbit_section(rabbit or {}))
    conf = load_config(["--config-file", str(path)])
    name_reply_queues_at_random(conf)
    return path, conf


def ctl_hosts(conf_path: Path, hosts: list[str], timeout: float = 600) -> dict:
    """``compute-agent-ctl hosts --json`` run as a command with the
    fleet's config: its wall time, and the fleet's hosts it did not list
    or listed down."""
    started = time.monotonic()
    done = subprocess.run([str(Path(sys.executable).with_name("compute-agent-ctl")),
                           "--config-file", str(conf_path), "hosts", "--json"],
                          capture_output=True, text=True, timeout=timeout,
                          env=worktree_env())
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"compute-agent-ctl hosts failed ({done.returncode}): "
                           f"{(done.stdout + done.stderr).strip()[:300]}")
    listed = {h["host"]: h["state"] for h in json.loads(done.stdout)}
    missing = sorted(set(hosts) - set(listed))
    down = sorted(h for h in hosts if listed.get(h, "up") != "up")
    return {"ctl_hosts_seconds": round(seconds, 2),
            "ctl_hosts_listed": len(hosts) - len(missing),
            "ctl_hosts_missing": missing[:10], "ctl_hosts_down": down[:10]}


def flavor_query(mode: TreeMode) -> list[tuple[str, str]]:
    """GET /allocation_candidates for the flavor in ``mode``: in nested the
    cell's group carries the CPUs and memory; in numa_devices they stay on
    the root and a resourceless group names the cell (HW_NUMA_ROOT); either
    way ``same_subtree`` keeps the VF and the vGPU on that cell. Flat has no
    cells to keep them on."""
    devices = [("resources_NET", f"{VF_CLASS}:1"), ("resources_GPU", "VGPU:1")]
    if mode is TreeMode.NESTED:
        return [("resources_CELL", FLAVOR_COMPUTE), *devices,
                ("same_subtree", "_CELL,_NET,_GPU"), ("group_policy", "none")]
    if mode is TreeMode.NUMA_DEVICES:
        return [("resources", FLAVOR_COMPUTE), *devices, ("required_CELL", "HW_NUMA_ROOT"),
                ("same_subtree", "_CELL,_NET,_GPU"), ("group_policy", "none")]
    return [("resources", FLAVOR_COMPUTE), *devices, ("group_policy", "none")]


def allocation_candidates(placement_url: str, mode: TreeMode, queries: int = 20) -> dict:
    """The flavor's query ``queries`` times, one after another, timed at
    the client: p50/p99, the candidates of the last answer and the hosts
    they are on."""
    times: list[float] = []
    found: dict = {}
    with requests.Session() as session:
        for _ in range(queries):
            started = time.monotonic()
            resp = session.get(f"{placement_url}/allocation_candidates", headers=HEADERS,
                               params=flavor_query(mode), timeout=300)
            times.append(time.monotonic() - started)
            resp.raise_for_status()
            found = resp.json()
    roots = {s["root_provider_uuid"] for s in found["provider_summaries"].values()}
    return {"p50_ms": round(percentile(times, 50) * 1000, 1),
            "p99_ms": round(percentile(times, 99) * 1000, 1),
            "queries": queries, "candidates": len(found["allocation_requests"]),
            "hosts": len(roots)}


def candidates_in_each_mode(restart_in: Callable[[TreeMode], None], placement_url: str,
                            queries: int, progress: Callable[[str], None] = lambda line: None
                            ) -> dict[str, dict]:
    """allocation_candidates in nested mode (the fleet's), then in
    numa_devices and flat (``restart_in(mode)``: every agent restarted in
    it, until in step), then the fleet back in nested; by mode."""
    found = {}
    for mode in (TreeMode.NESTED, TreeMode.NUMA_DEVICES, TreeMode.FLAT):
        if mode is not TreeMode.NESTED:
            restart_in(mode)
        progress(f"allocation candidates in {mode.value} mode: {queries} queries")
        found[mode.value] = allocation_candidates(placement_url, mode, queries)
    restart_in(TreeMode.NESTED)
    return found


def evacuate(conf, api, source: str) -> dict:
    """Every instance of the down host ``source`` evacuated by the
    conductor's Evacuator onto the fleet (as ``compute-agent-ctl
    evacuate``): its seconds, and how many instances landed: each runs on
    its destination with every device class it held claimed there."""
    placement = PlacementClient(adapter_from_conf(conf))
    evacuator = Evacuator(placement, api, Heartbeat(conf))
    root = {name: root for root, name in evacuator.compute_roots().items()}[source]
    held = {instance: {rc for resources in on.values() for rc in resources
                       if rc.startswith(DEVICE_CLASSES_PREFIX)}
            for instance, on in tree_allocations(placement, root).items()}
    started = time.monotonic()
    result = evacuator.evacuate(source)
    seconds = time.monotonic() - started
    landed, failures = [], []
    for o in result.outcomes:
        view = api.get_instance(o.destination, o.instance) if o.state == "running" else {}
        claimed = {a["resource_class"] for a in view.get("assignments", [])
                   if a["owner"] == "instance" and a["state"] == "claimed"}
        if view.get("running") and held[o.instance] <= claimed:
            landed.append(o.instance)
        else:
            failures.append(f"{o.instance}: {o.state} on {o.destination}, claimed "
                            f"{sorted(claimed)} {o.error or ''}".strip())
    return {"evacuation_seconds": round(seconds, 1),
            "evacuation_instances": len(held), "evacuation_landed": len(landed),
            "evacuation_destinations": len({o.destination for o in result.outcomes}),
            "evacuation_failures": failures[:10]}
