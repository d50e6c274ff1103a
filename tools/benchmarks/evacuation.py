"""Evacuation of 100 instances from a down host: what ``compute-agent-ctl
evacuate`` does (compute_agent/conductor/evacuation.py), run here against two compute-agent
daemons (fake driver, durable stores) over the real RabbitMQ and the real
Placement.

Host A runs 100 instances (1 vCPU, 256 MB and one VF on its cell each);
A's agent is SIGKILLed; every instance is evacuated to B, and the clock
stops when the last one runs there. Reported: the seconds, the requests
Placement served meanwhile (counted at its HTTP server, by kind), and how
much of the time is the heartbeat deadline itself (service_down_time: the
conductor's check of the source, and the destination's), which no faster
code shortens. One figure per parallelism (``--parallel``: one instance at
a time, and the default), each the median of RUNS runs on new daemons.
"""
from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

from compute_agent.cmd.common import load_config
from compute_agent.conductor.evacuation import DEFAULT_PARALLEL, Evacuator
from compute_agent.placement.client import PlacementClient, adapter_from_conf
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.rpc.heartbeat import Heartbeat
from compute_agent.testing.local_placement import LocalPlacement
from tests.functional.helpers import get, put_allocations, write_conf
from tools.benchmarks.common import device_host
from tools.benchmarks.rpc import PFS, RABBIT, SERVICES, VFS_PER_PF, Allocations, stop, wait_until_serving

INSTANCES = 100
RUNS = 3
PARALLELISMS = (1, DEFAULT_PARALLEL)
DOWN_AFTER = 2
SPEC = {"name": "bench", "vcpus": 1, "memory_mb": 256}
VF_SPEC = '{"vendor_id": "8086", "product_id": "154c", "resource_class": "SRIOV_NET_VF"}'


def kind(line: str) -> str:
    """'GET /allocation_candidates?... 200' -> 'GET /allocation_candidates'."""
    method, path = line.split()[:2]
    parts = path.split("?")[0].strip("/").split("/")
    shape = "/".join("{uuid}" if len(p) == 36 else p for p in parts)
    return f"{method} /{shape}"


def run(workdir: Path) -> list[dict]:
    subprocess.run([str(SERVICES)], check=True, stdout=subprocess.DEVNULL, timeout=300)
    return [medians([evacuate_once(workdir / f"p{parallel}-{n}", parallel)
                     for n in range(RUNS)]) for parallel in PARALLELISMS]


def medians(runs: list[dict]) -> dict:
    """The median of each figure over the runs, and every run's seconds."""
    def median_of(key: str) -> float:
        return round(statistics.median(r[key] for r in runs), 2)

    out = {key: median_of(key) for key in (
        "seconds", "seconds_until_all_accepted", "placement_requests",
        "placement_requests_per_instance", "seconds_without_heartbeat_deadline")}
    kinds = sorted({k for r in runs for k in r["placement_requests_by_kind"]})
    return {**runs[0], **out, "runs": len(runs),
            "seconds_each_run": [r["seconds"] for r in runs],
            "placement_requests_by_kind": {k: statistics.median(
                r["placement_requests_by_kind"].get(k, 0) for r in runs) for k in kinds}}


def evacuate_once(workdir: Path, parallel: int) -> dict:
    placement = LocalPlacement(workdir / "placement").start()
    procs: dict[str, subprocess.Popen] = {}
    confs = {}
    for which in "ab":
        host = f"bench-evac-{which}-{uuid.uuid4().hex[:6]}"
        confs[which] = (host, write_conf(
            workdir / which, placement.url, host, device_host(PFS, VFS_PER_PF),
            pci={"device_spec": VF_SPEC},
            # The loops stay out of the way of the figures.
            DEFAULT={"transport_url": RABBIT, "update_interval": 3600,
                     "reconcile_interval": 1000, "service_down_time": DOWN_AFTER}))
    logs = []
    api = None
    try:
        conf = load_config(["--config-file", str(confs["a"][1])])
        # One after the other: two first registrations at once may race on a
        # new trait, and with the loop at 3600 s a lost first cycle stays lost.
        for which, (host, path) in confs.items():
            logs.append(open(workdir / f"{which}.log", "w"))
            procs[which] = subprocess.Popen(
                [sys.executable, "-m", "compute_agent.cmd.agent", "--config-file", str(path)],
                stdout=logs[-1], stderr=subprocess.STDOUT)
            wait_until_serving(conf, host, procs[which])
        api = ComputeAgentAPI(conf, timeout=60)
        a = confs["a"][0]
        root = get(placement.url, f"/resource_providers?name={a}")[
            "resource_providers"][0]["uuid"]
        allocations = Allocations(get(placement.url, f"/resource_providers?in_tree={root}")
                                  ["resource_providers"], a)
        for n in range(INSTANCES):  # untimed
            instance = str(uuid.uuid4())
            put_allocations(placement.url, instance, allocations(n))
            api.build_instance(a, instance, SPEC, allocations(n))
        procs.pop("a").send_signal(signal.SIGKILL)

        evacuator = Evacuator(PlacementClient(adapter_from_conf(conf)), api,
                              Heartbeat(conf), parallel=parallel)
        mark = placement.mark()
        seen: dict[str, float] = {}

        def progress(o) -> None:
            seen[o.state] = time.perf_counter()  # the last of each state

        started = time.perf_counter()
        result = evacuator.evacuate(a, progress=progress)
        seconds = time.perf_counter() - started
        requests = placement.requests_since(mark)
        evacuator.heartbeat.close()
        assert result.ok and len(result.outcomes) == INSTANCES, result.as_dict()
        return {"case": "evacuation", "instances": INSTANCES, "parallel": parallel,
                "seconds": round(seconds, 2),
                "seconds_until_all_accepted": round(seen["accepted"] - started, 2),
                "placement_requests": len(requests),
                "placement_requests_per_instance": round(len(requests) / INSTANCES, 2),
                "placement_requests_by_kind": dict(sorted(Counter(
                    kind(r) for r in requests).items())),
                "heartbeat_deadline_seconds": 2 * DOWN_AFTER,
                "seconds_without_heartbeat_deadline": round(seconds - 2 * DOWN_AFTER, 2)}
    finally:
        if api is not None:
            api.close()
        for proc in procs.values():
            stop(proc)
        for log in logs:
            log.close()
        placement.stop()
