"""An Agent on a fake host, for the unit tests: a store in a temporary
directory, a Placement client that is never asked (the tests run no
cycle that reaches it) unless the test gives its own."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from compute_agent.compute.manager import ComputeManager
from compute_agent.compute.tracker import Tracker
from compute_agent.daemon.composition import assemble, placement_sync
from compute_agent.daemon.service import Agent, AgentSettings
from compute_agent.drivers.fake import FakeDriver
from compute_agent.metrics import Metrics
from compute_agent.store.store import STORE_FILE, Store
from compute_agent.tree.host_tree import TreePolicy

ROOT = "5e1c0c5a-8a4e-4d4b-9c0e-2f1d6b7a9c31"
HOST = {"numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 4096}], "disk_gb": 10}


class UnusedClient:
    """No request is made: the cycles are the test's own."""
    keystone_url = None
    url = "http://placement.invalid"


def agent_on_fake_host(state_dir: Path, settings: AgentSettings = AgentSettings(),
                       client: Any = None) -> Agent:
    """``client``: the Placement client (a fake one); by default one never asked."""
    driver = FakeDriver(HOST)
    manager = ComputeManager(Tracker(Store(state_dir / STORE_FILE, ROOT), driver.boot_id()),
                             driver)
    sync, allocations = placement_sync(client or UnusedClient(), ROOT, lambda p: True, 300)
    return assemble(driver, TreePolicy(host="h", root_uuid=ROOT), sync, allocations, manager,
                    Metrics(), settings)
