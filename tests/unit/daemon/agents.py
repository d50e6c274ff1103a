"""An Agent on a fake host, for the unit tests: a store in a temporary
directory, a Placement client that is never asked (the tests run no
cycle that reaches it) unless the test gives its own, such as
FakePlacement, which keeps the allocations on a tree in memory."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from oslo_config import cfg

from compute_agent.cmd.common import load_config
from compute_agent.compute.manager import ComputeManager
from compute_agent.compute.tracker import Tracker
from compute_agent.daemon.composition import assemble, placement_sync
from compute_agent.daemon.service import Agent, AgentSettings
from compute_agent.drivers.fake import FakeDriver
from compute_agent.exception import PlacementError, PlacementUnavailable
from compute_agent.metrics import Metrics
from compute_agent.store.store import STORE_FILE, Store
from compute_agent.tree.host_tree import TreePolicy
from compute_agent.tree.provider_tree import Provider, ProviderTree, inventory
from tests.unit.placement.test_consumers import FakeClient

ROOT = "5e1c0c5a-8a4e-4d4b-9c0e-2f1d6b7a9c31"
HOST = {"numa_cells": [{"id": 0, "cpus": "0-3", "memory_mb": 4096}], "disk_gb": 10}


def fake_agent_conf_file(tmp_path: Path) -> Path:
    """The config file of an agent of host node1 on the fake driver, its
    state under ``tmp_path``, Placement at an address nothing serves."""
    host_file = tmp_path / "host.yaml"
    host_file.write_text("numa_cells: [{id: 0, cpus: '0-3', memory_mb: 4096}]\n")
    path = tmp_path / "agent.conf"
    path.write_text(f"[DEFAULT]\nhost = node1\nstate_path = {tmp_path / 'state'}\n"
                    f"compute_driver = fake\nreconcile_interval = 4\n"
                    f"[fake]\nhost_file = {host_file}\n"
                    "[placement]\nauth_type = placement_noauth2\n"
                    "endpoint = http://127.0.0.1:1\n")
    return path


def fake_agent_conf(tmp_path: Path) -> cfg.ConfigOpts:
    """fake_agent_conf_file's config, read and checked."""
    return load_config(["--config-file", str(fake_agent_conf_file(tmp_path))],
                       placement_required=True)


class UnusedClient:
    """No request is made: the cycles are the test's own."""
    keystone_url = None
    url = "http://placement.invalid"


def agent_on_fake_host(state_dir: Path, settings: AgentSettings = AgentSettings(),
                       client: Any = None, read_only: bool = False) -> Agent:
    """``client``: the Placement client (a fake one); by default one never
    asked. ``read_only``: a reader's, beside the agent of ``state_dir``."""
    driver = FakeDriver(HOST)
    store = (Store(state_dir / STORE_FILE, read_only=True) if read_only
             else Store(state_dir / STORE_FILE, ROOT))
    manager = ComputeManager(Tracker(store, driver.boot_id()), driver)
    sync, allocations = placement_sync(client or UnusedClient(), ROOT, lambda p: True, 300)
    return assemble(driver, TreePolicy(host="h", root_uuid=ROOT), sync, allocations, manager,
                    Metrics(), settings)


class FakePlacement(FakeClient):
    """Consumers' allocations (consumer -> provider -> class -> amount) on
    a tree of providers with generations, inventories and traits; counts
    the reads."""

    keystone_url = None
    url = "http://placement"

    def __init__(self) -> None:
        super().__init__({})
        self.tree: list[dict] = []
        self.providers: dict[str, Provider] = {}
        self.tree_reads = 0
        self.provider_reads: list[str] = []
        self.consumer_reads: list[str] = []
        self.refusal: PlacementError | None = None

    def has_tree(self, tree: ProviderTree) -> None:
        """Placement has ``tree``'s providers, at generation 1."""
        self.tree = [{"uuid": p.uuid, "name": p.name, "parent_provider_uuid": p.parent_uuid,
                      "generation": 1} for p in tree]
        self.providers = {p.uuid: p for p in tree}

    def _generation(self, uuid: str) -> int:
        return next(row["generation"] for row in self.tree if row["uuid"] == uuid)

    def get_inventories(self, uuid: str) -> tuple[int, dict]:
        self._answers()
        return self._generation(uuid), dict(self.providers[uuid].inventories)

    def get_traits(self, uuid: str) -> tuple[int, frozenset[str]]:
        self._answers()
        return self._generation(uuid), self.providers[uuid].traits

    def _answers(self) -> None:
        if self.down:
            raise PlacementUnavailable(self.url, "did not answer (down)")
        if self.refusal is not None:
            raise self.refusal

    def get_tree(self, root_uuid: str) -> list[dict]:
        self._answers()
        self.tree_reads += 1
        return [dict(row) for row in self.tree]

    def get_provider_allocations(self, uuid: str) -> dict[str, dict]:
        self._answers()
        self.provider_reads.append(uuid)
        return {consumer: {"resources": dict(on[uuid])} for consumer, on in self.held.items()
                if uuid in on}

    def get_consumer_allocations(self, consumer: str) -> dict:
        self.consumer_reads.append(consumer)
        return super().get_consumer_allocations(consumer)

    def generation_moves(self, uuid: str) -> None:
        row = next(row for row in self.tree if row["uuid"] == uuid)
        row["generation"] += 1


def placement_as_flat_mode_left_it(agent: Agent, placement: FakePlacement) -> str:
    """Placement has the agent's model, but for VCPU and MEMORY_MB, which
    the root still carries too, as the flat mode left them (the model puts
    them on the NUMA cell); returns the cell's uuid."""
    built = agent.build_model(agent.driver.get_host_inventory())
    (cell,) = (p.uuid for p in built.tree if p.uuid != ROOT)
    root = built.tree.get(ROOT)
    placement.has_tree(ProviderTree([
        dataclasses.replace(root, inventories={**root.inventories, "VCPU": inventory(4),
                                               "MEMORY_MB": inventory(4096)}),
        built.tree.get(cell)]))
    return cell
