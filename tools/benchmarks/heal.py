"""Heal of 1,000 instances on a host of 16 GPUs and 2 NUMA cells, moved
from flat to nested: each instance holds 1 VCPU and 256 MB on the root and
one vGPU. The GPUs' providers keep their UUIDs (only their parent
changes), so heal moves the CPU and memory of every instance to the cell of
its vGPU.

Reported: the requests and seconds of the heal (with the update cycles it
runs before and after), by kind, the part of those seconds spent reading
the consumers, in the reshaper and moving the store's rows, and the
requests of a second heal; medians of RUNS runs. Placement serves with
PLACEMENT_WORKERS processes, as production runs it under uwsgi or
mod_wsgi: one process serves its requests one GIL at a time.
"""
from __future__ import annotations

import statistics
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from compute_agent.daemon.service import Agent
from compute_agent.heal import run as healer
from compute_agent.heal.run import run_heal
from compute_agent.testing.local_placement import LocalPlacement
from compute_agent.tree.host_tree import MdevTypePolicy, TreeMode, TreePolicy
from tools.benchmarks.common import device_host
from tools.benchmarks.placement_loop import agent_on

INSTANCES = 1000
GPUS = 16
RUNS = 3
PLACEMENT_WORKERS = 2


def make_agent(url: str, host: dict, root_uuid: str, name: str, state_dir: Path,
               mode: TreeMode) -> Agent:
    return agent_on(url, host, TreePolicy(host=name, root_uuid=root_uuid, mode=mode,
                                          cpu_allocation_ratio=16.0,
                                          mdev_types=(MdevTypePolicy("nvidia-35"),)),
                    state_dir)


def flat_host_with_instances(url: str, workdir: Path) -> tuple[Agent, dict, str, str]:
    host = device_host(0, 0, gpus=GPUS, vgpus_per_gpu=INSTANCES // GPUS + 1)
    root_uuid = str(uuid.uuid4())
    name = f"benchheal-{root_uuid[:6]}"
    agent = make_agent(url, host, root_uuid, name, workdir, TreeMode.FLAT)
    agent.update_provider_tree()
    gpus = sorted(p.uuid for p in agent.sync.cache if "VGPU" in p.inventories)
    body = {}
    for i in range(INSTANCES):
        allocations = {root_uuid: {"resources": {"VCPU": 1, "MEMORY_MB": 256}},
                       gpus[i % GPUS]: {"resources": {"VGPU": 1}}}
        consumer = str(uuid.uuid4())
        body[consumer] = {"allocations": allocations, "project_id": str(uuid.uuid4()),
                          "user_id": str(uuid.uuid4()), "consumer_generation": None,
                          "consumer_type": "INSTANCE"}
        agent.manager.tracker.claim_build(
            consumer, {"name": f"vm{i}", "vcpus": 1, "memory_mb": 256}, allocations)
    agent.sync.client.post_allocations(body)
    agent.manager.tracker.store.close()
    return agent, host, root_uuid, name


def requests_by_kind(sent: list[str]) -> dict[str, int]:
    kinds = Counter()
    for line in sent:
        method, path, _ = line.split(" ")
        path = path.split("?")[0]
        parts = path.strip("/").split("/")
        if parts[0] in ("resource_providers", "allocations") and len(parts) > 1:
            parts[1] = "{uuid}"
        kinds[f"{method} /{'/'.join(parts)}"] += 1
    return dict(sorted(kinds.items()))


@contextmanager
def timing(owner, name: str, spent: dict[str, float]):
    """Add the seconds each call of ``owner.name`` takes to ``spent[name]``."""
    real = getattr(owner, name)

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - started

    setattr(owner, name, timed)
    try:
        yield
    finally:
        setattr(owner, name, real)


def measure(placement: LocalPlacement, workdir: Path) -> dict:
    _, host, root_uuid, name = flat_host_with_instances(placement.url, workdir)
    agent = make_agent(placement.url, host, root_uuid, name, workdir, TreeMode.NESTED)
    agent.update_provider_tree()  # the cells come up reserved until healed

    spent: dict[str, float] = {}
    mark = placement.mark()
    started = time.perf_counter()
    with timing(healer, "read_consumers", spent), \
            timing(agent.sync.client, "reshape", spent), \
            timing(agent.manager.tracker, "realign", spent):
        result = run_heal(agent)
    seconds = time.perf_counter() - started
    sent = placement.requests_since(mark)

    mark = placement.mark()
    run_heal(agent)
    again = placement.requests_since(mark)
    agent.manager.tracker.store.close()
    return {
        "moves": len(result.plan.moves),
        "store_rows_moved": len(result.store.moved),
        "heal_requests": len(sent),
        "heal_writes": sum(not r.startswith("GET") for r in sent),
        "heal_requests_by_kind": requests_by_kind(sent),
        "heal_seconds": seconds,
        "consumer_reads_seconds": spent["read_consumers"],
        "reshaper_seconds": spent["reshape"],
        "store_seconds": spent["realign"],
        "second_heal_requests": len(again),
        "second_heal_writes": sum(not r.startswith("GET") for r in again),
    }


def run(workdir: Path) -> dict:
    runs = []
    for i in range(RUNS):  # each on a Placement of its own, grown alike
        placement = LocalPlacement(workdir / f"placement{i}",
                                   workers=PLACEMENT_WORKERS).start()
        try:
            runs.append(measure(placement, workdir / f"run{i}"))
        finally:
            placement.stop()
    out = {"case": "heal", "instances": INSTANCES, "gpus": GPUS, "runs": RUNS,
           "placement_workers": PLACEMENT_WORKERS, **runs[-1]}
    for key in ("heal_seconds", "consumer_reads_seconds", "reshaper_seconds",
                "store_seconds"):
        out[key] = round(statistics.median(r[key] for r in runs), 2)
    return out
