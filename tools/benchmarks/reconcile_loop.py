"""The update loop reconciling at every cycle (reconcile_interval = 1) on an
idle host of 1,000 providers, against a real Placement.

Reconciliation reads a provider's allocations only where they may have
changed, so an idle cycle costs the one ``GET ?in_tree=`` of the update
loop, plus a re-read of every provider holding allocations (none here)
once per ``allocation_refresh_interval``. For comparison, the cost of a cycle that
reads every provider's allocations (``allocation_refresh_interval = 0``,
what every reconciliation did before).
"""
from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path

from compute_agent.daemon.service import Agent
from compute_agent.testing.local_placement import LocalPlacement
from tools.benchmarks.placement_loop import fake_host, make_agent

PROVIDERS = 1000
IDLE_CYCLES = 100
RUNS = 3
FULL_READ_CYCLES = 2
REFRESH_INTERVAL = 300


def idle_cycles(placement: LocalPlacement, agent: Agent, cycles: int
                ) -> tuple[list[str], float]:
    """What the loop does with reconcile_interval = 1: a cycle, then a
    reconciliation. Requests sent and seconds taken."""
    mark = placement.mark()
    started = time.perf_counter()
    for _ in range(cycles):
        assert agent.run_cycle().ok
        agent.reconcile(at_start=False)
    return placement.requests_since(mark), time.perf_counter() - started


def allocation_reads(requests: list[str]) -> int:
    return sum(1 for r in requests if r.split()[1].endswith("/allocations"))


def registered(placement: LocalPlacement, workdir: Path, refresh_interval: float
               ) -> Agent:
    root_uuid = str(uuid.uuid4())
    name = f"reconcile{PROVIDERS}-{root_uuid[:6]}"
    agent = make_agent(placement.url, fake_host(PROVIDERS), root_uuid, name,
                       workdir / name, allocation_refresh_interval=refresh_interval)
    assert agent.run_cycle().ok
    agent.reconcile(at_start=True)  # the first read of every provider
    return agent


def run(workdir: Path) -> dict:
    placement = LocalPlacement(workdir / "placement").start()
    try:
        agent = registered(placement, workdir, REFRESH_INTERVAL)
        requests, reads, seconds = [], [], []
        for _ in range(RUNS):
            sent, took = idle_cycles(placement, agent, IDLE_CYCLES)
            requests.append(len(sent))
            reads.append(allocation_reads(sent))
            seconds.append(took)
        agent.manager.tracker.store.close()

        full = registered(placement, workdir, 0)
        sent, took = idle_cycles(placement, full, FULL_READ_CYCLES)
        full.manager.tracker.store.close()
    finally:
        placement.stop()
    return {
        "case": "reconcile_loop",
        "providers": PROVIDERS,
        "idle_cycles": IDLE_CYCLES,
        "runs": RUNS,
        "allocation_refresh_interval_s": REFRESH_INTERVAL,
        "idle_requests_max": max(requests),
        "idle_allocation_reads_max": max(reads),
        "idle_seconds_median": round(statistics.median(seconds), 2),
        "reading_everything_requests_per_cycle": len(sent) / FULL_READ_CYCLES,
        "reading_everything_seconds_per_cycle": round(took / FULL_READ_CYCLES, 2),
    }
