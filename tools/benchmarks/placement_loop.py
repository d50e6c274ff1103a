"""The update loop against a real Placement, for fake hosts of growing size.

For each size: requests to register the host the first time, requests per
cycle when nothing changed, the wall time of such a cycle (median), the
requests for one inventory change, and the requests of the first cycle
after a restart: with the view of Placement the agent saved in its store,
and with none (a new state directory).
"""
from __future__ import annotations

import statistics
import time
import uuid
from pathlib import Path

from keystoneauth1 import adapter, session

from compute_agent.compute.manager import ComputeManager
from compute_agent.compute.tracker import Tracker
from compute_agent.daemon.composition import assemble, placement_sync
from compute_agent.daemon.service import Agent, AgentSettings
from compute_agent.drivers.fake import FakeDriver
from compute_agent.metrics import Metrics
from compute_agent.placement.auth import NoAuth2
from compute_agent.placement.client import PlacementClient
from compute_agent.store.store import STORE_FILE, Store
from compute_agent.testing.local_placement import LocalPlacement
from compute_agent.tree.device_spec import parse_specs
from compute_agent.tree.host_tree import TreePolicy

SIZES = (10, 100, 1000)
CYCLES = 7


def fake_host(providers: int) -> dict:
    """Root + two NUMA cells + one allowlisted PCI device per other provider."""
    devices = providers - 3
    return {
        "disk_gb": 1000,
        "numa_cells": [{"id": 0, "cpus": "0-31", "memory_mb": 262144},
                       {"id": 1, "cpus": "32-63", "memory_mb": 262144}],
        "pci_devices": [{"address": f"0000:{0x10 + i // 32:02x}:{i % 32:02x}.0",
                         "vendor_id": "8086", "product_id": "0d5c",
                         "numa_node": i % 2} for i in range(devices)],
    }


def make_agent(url: str, host: dict, root_uuid: str, name: str, state_dir: Path,
               allocation_refresh_interval: float = 300) -> Agent:
    policy = TreePolicy(host=name, root_uuid=root_uuid,
                        device_specs=parse_specs(['{"vendor_id": "8086"}']))
    return agent_on(url, host, policy, state_dir, allocation_refresh_interval)


def agent_on(url: str, host: dict, policy: TreePolicy, state_dir: Path,
             allocation_refresh_interval: float = 300) -> Agent:
    """An agent on a fake host, with a store in ``state_dir``, synced into
    the Placement at ``url``."""
    ks = adapter.Adapter(session.Session(auth=NoAuth2(url), timeout=60),
                         service_type="placement")
    name = policy.host
    owned = lambda p: p.name == name or p.name.startswith(name + "_")  # noqa: E731
    driver = FakeDriver(host)
    manager = ComputeManager(Tracker(Store(state_dir / STORE_FILE), driver.boot_id()),
                             driver)
    sync, allocations = placement_sync(PlacementClient(ks), policy.root_uuid, owned,
                                       allocation_refresh_interval)
    return assemble(driver, policy, sync, allocations, manager, Metrics(), AgentSettings())


def first_cycle_requests(placement: LocalPlacement, agent: Agent) -> int:
    mark = placement.mark()
    agent.update_provider_tree()
    agent.manager.tracker.store.close()
    return len(placement.requests_since(mark))


def measure(placement: LocalPlacement, providers: int, workdir: Path) -> dict:
    host, root_uuid = fake_host(providers), str(uuid.uuid4())
    name = f"bench{providers}-{root_uuid[:6]}"
    state_dir = workdir / name
    agent = make_agent(placement.url, host, root_uuid, name, state_dir)

    mark = placement.mark()
    started = time.perf_counter()
    agent.update_provider_tree()
    register_s = time.perf_counter() - started
    register = len(placement.requests_since(mark))

    steady, wall = [], []
    for _ in range(CYCLES):
        mark = placement.mark()
        started = time.perf_counter()
        agent.update_provider_tree()
        wall.append(time.perf_counter() - started)
        steady.append(len(placement.requests_since(mark)))

    host["numa_cells"][0]["memory_mb"] -= 1024
    agent.driver.set_host(host)
    mark = placement.mark()
    agent.update_provider_tree()
    one_change = len(placement.requests_since(mark))

    agent.manager.tracker.store.close()
    restart = first_cycle_requests(
        placement, make_agent(placement.url, host, root_uuid, name, state_dir))
    restart_unsaved = first_cycle_requests(
        placement, make_agent(placement.url, host, root_uuid, name, workdir / f"{name}-new"))

    return {
        "case": "placement_loop",
        "providers": providers,
        "custom_names": 1,  # CUSTOM_PCI_8086_0D5C
        "register_requests": register,
        "register_requests_per_provider": round(register / providers, 2),
        "register_seconds": round(register_s, 3),
        "steady_requests_per_cycle_max": max(steady),
        "steady_cycle_ms_median": round(statistics.median(wall) * 1000, 1),
        "one_change_requests": one_change,
        "restart_requests": restart,
        "restart_requests_without_saved_view": restart_unsaved,
    }


def run(workdir: Path) -> list[dict]:
    placement = LocalPlacement(workdir / "placement").start()
    try:
        return [measure(placement, n, workdir) for n in SIZES]
    finally:
        placement.stop()
