"""Heal as ``compute-agent-manage heal`` and the start run it
(compute_agent/heal/run.py), on an agent of a fake host whose model puts
VCPU and MEMORY_MB on its NUMA cell, against a fake Placement that still
has them on the root, as the flat mode left them, with an instance's
allocations and the store's rows there: what is read, what is sent in the
one reshape, how a lost race is planned again, and the store following
Placement's allocations."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

import pytest

from compute_agent.claims.choice import Pool
from compute_agent.daemon.service import Agent
from compute_agent.drivers.base import DeviceKind, HostInventory
from compute_agent.exception import AgentError, GenerationConflict
from compute_agent.heal import rules
from compute_agent.heal.realign import DeviceIndex, Realignment
from compute_agent.heal.run import align_store, consumer_from, run_heal
from compute_agent.tree.host_tree import BuiltTree
from compute_agent.tree.provider_tree import Inventory, inventory
from tests.unit.daemon.agents import (
    ROOT,
    FakePlacement,
    agent_on_fake_host,
    placement_as_flat_mode_left_it,
)

INSTANCE = "3c1f5a9e-7b2d-4e8f-a6c0-1d9b8e7f6a5c"
SPEC = {"name": "vm", "vcpus": 1, "memory_mb": 512}
RESOURCES = {"VCPU": 1, "MEMORY_MB": 512}


class ReshapingPlacement(FakePlacement):
    """FakePlacement that takes ``POST /reshaper``: its inventories and
    allocations at once, each provider's generation moved; or a conflict
    for each of the first ``conflicts`` asked."""

    def __init__(self) -> None:
        super().__init__()
        self.reshapes: list[tuple[dict, dict]] = []
        self.conflicts = 0

    def reshape(self, inventories: Mapping[str, tuple[int | None, Mapping[str, Inventory]]],
                allocations: dict | None = None) -> None:
        self.reshapes.append((dict(inventories), dict(allocations or {})))
        if self.conflicts:
            self.conflicts -= 1
            raise GenerationConflict("Placement answered 409 to POST /reshaper: resource "
                                     "provider generation conflict", 409,
                                     "placement.concurrent_update")
        for uuid, (_, records) in inventories.items():
            self.providers[uuid] = dataclasses.replace(self.providers[uuid],
                                                       inventories=dict(records))
            self.generation_moves(uuid)
        for consumer, body in (allocations or {}).items():
            self.held[consumer] = {rp: dict(a["resources"])
                                   for rp, a in body["allocations"].items()}


class HealedAgent:
    """The agent as heal sees it: its own sync, driver, manager and model;
    its update cycle, which writes Placement, counted instead."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.sync = agent.sync
        self.driver = agent.driver
        self.cycles = 0

    @property
    def manager(self):
        return self.agent.manager

    def build_model(self, inventory: HostInventory) -> BuiltTree:
        return self.agent.build_model(inventory)

    def update_provider_tree(self) -> None:
        self.cycles += 1


@dataclasses.dataclass
class Host:
    agent: HealedAgent
    placement: ReshapingPlacement
    cell: str
    pools: dict[str, dict[str, Pool]]

    def rows(self) -> set[tuple[str, str, DeviceKind]]:
        """Where the store has the instance's rows: (provider, class, kind)."""
        return {(a.provider_uuid, a.resource_class, a.kind)
                for a in self.agent.manager.tracker.snapshot()[1]}

    def on_root(self) -> set[tuple[str, str, DeviceKind]]:
        return {(ROOT, rc, DeviceKind.HOST_RESOURCES) for rc in RESOURCES}

    def on_cell(self) -> set[tuple[str, str, DeviceKind]]:
        return {(self.cell, rc, DeviceKind.NUMA) for rc in RESOURCES}

    def healed_in_placement(self) -> None:
        """Placement as a heal's reshape left it: the allocations on the
        cell, the root without the flat mode's classes."""
        root = self.placement.providers[ROOT]
        self.placement.reshape({ROOT: (1, {"DISK_GB": root.inventories["DISK_GB"]})},
                               {INSTANCE: {"allocations": {self.cell: {
                                   "resources": dict(RESOURCES)}}}})
        self.placement.reshapes.clear()


@pytest.fixture
def host(tmp_path):
    placement = ReshapingPlacement()
    agent = agent_on_fake_host(tmp_path, client=placement)
    cell = placement_as_flat_mode_left_it(agent, placement)
    pools = agent.build_model(agent.driver.get_host_inventory()).pools_by_uuid({})
    # The instance as the flat mode claimed it: its rows and its
    # allocations on the root.
    tracker = agent.manager.tracker
    tracker.set_pools({ROOT: {rc: Pool("h", rc, DeviceKind.HOST_RESOURCES, total)
                              for rc, total in (("VCPU", 4), ("MEMORY_MB", 4096))}
                       | pools[ROOT]})
    tracker.claim_build(INSTANCE, SPEC, {ROOT: {"resources": dict(RESOURCES)}})
    tracker.set_pools(pools)
    placement.held[INSTANCE] = {ROOT: dict(RESOURCES)}
    placement.generations[INSTANCE] = 3
    yield Host(HealedAgent(agent), placement, cell, pools)
    tracker.store.close()


def test_heal_moves_the_allocations_in_one_reshape_then_the_store_follows(host):
    said: list[str] = []
    result = run_heal(host.agent, progress=said.append)
    assert (result.applied, result.attempts) == (True, 1)
    assert [(m.from_provider, m.to_provider, m.from_class, m.amount)
            for m in result.plan.moves] == [(ROOT, host.cell, "MEMORY_MB", 512),
                                            (ROOT, host.cell, "VCPU", 1)]
    [(inventories, allocations)] = host.placement.reshapes
    assert inventories[ROOT] == (1, {"DISK_GB": inventory(10)})
    assert set(inventories[host.cell][1]) == {"VCPU", "MEMORY_MB"}
    assert allocations == {INSTANCE: {
        "allocations": {host.cell: {"resources": RESOURCES}}, "project_id": "p",
        "user_id": "u", "consumer_generation": 3}}
    assert host.rows() == host.on_cell()
    assert len(result.store.moved) == 2 and result.store.unaligned == []
    # The store follows the allocations the reshape set: no second read.
    assert host.placement.tree_reads == 1
    # The held tree stands before the plan, the model after the reshape.
    assert host.agent.cycles == 2
    assert said == ["reading the allocations of 1 consumers...",
                    "sending one reshape of 1 consumers' allocations and 2 inventories..."]


def test_a_dry_run_plans_and_changes_nothing(host):
    result = run_heal(host.agent, dry_run=True)
    assert not result.applied and len(result.plan.moves) == 2
    assert host.placement.reshapes == [] and host.agent.cycles == 0
    assert host.rows() == host.on_root()


def test_a_plan_declined_is_not_sent(host):
    seen: list[rules.Plan] = []
    result = run_heal(host.agent, confirm=lambda plan: seen.append(plan) is not None)
    assert seen == [result.plan] and len(result.plan.moves) == 2
    assert not result.applied and host.placement.reshapes == []
    assert host.placement.held[INSTANCE] == {ROOT: RESOURCES}
    assert host.rows() == host.on_root()


def test_a_race_lost_to_another_writer_is_read_and_planned_again(host):
    host.placement.conflicts = 1
    result = run_heal(host.agent)
    assert (result.applied, result.attempts) == (True, 2)
    assert len(host.placement.reshapes) == 2
    assert host.placement.tree_reads == 2  # Placement read again for the second plan
    assert host.rows() == host.on_cell()


def test_a_race_lost_at_every_attempt_changes_nothing_and_says_so(host):
    host.placement.conflicts = 5
    with pytest.raises(AgentError, match="^heal: Placement changed under each of 3 "
                                         "attempts; nothing was changed, run it again$"):
        run_heal(host.agent, attempts=3)
    assert len(host.placement.reshapes) == 3
    assert host.placement.held[INSTANCE] == {ROOT: RESOURCES}
    assert host.rows() == host.on_root()


def test_only_the_consumers_holding_a_moving_class_are_read(host):
    """Each consumer read is one GET: one holding only what stays where it
    is (the root's disk) is not read."""
    host.placement.held["disk-only"] = {ROOT: {"DISK_GB": 5}}
    run_heal(host.agent, dry_run=True)
    assert host.placement.consumer_reads == [INSTANCE]


def test_after_a_heal_killed_past_its_reshape_the_rerun_moves_only_the_store(host):
    host.healed_in_placement()
    result = run_heal(host.agent)
    assert result.plan.empty and not result.applied
    assert len(result.store.moved) == 2
    assert host.placement.reshapes == []
    assert host.rows() == host.on_cell()


def test_the_store_is_not_aligned_before_a_cycle_built_the_model(host):
    assert align_store(host.agent, DeviceIndex({})) == Realignment()
    assert host.placement.tree_reads == 0 and host.rows() == host.on_root()


def test_a_store_where_the_model_puts_it_asks_placement_nothing(host):
    host.healed_in_placement()
    assert len(align_store(host.agent, DeviceIndex(host.pools)).moved) == 2
    reads = host.placement.tree_reads, list(host.placement.provider_reads)
    assert align_store(host.agent, DeviceIndex(host.pools)) == Realignment()
    assert (host.placement.tree_reads, host.placement.provider_reads) == reads


def test_a_row_placement_holds_nothing_of_on_its_new_home_is_reported_and_left(host, caplog):
    host.healed_in_placement()
    host.placement.held[INSTANCE] = {host.cell: {"MEMORY_MB": 512}}
    result = align_store(host.agent, DeviceIndex(host.pools))
    assert [(old.resource_class, new.provider_uuid) for old, new in result.moved] == [
        ("MEMORY_MB", host.cell)]
    assert host.rows() == {(host.cell, "MEMORY_MB", DeviceKind.NUMA),
                           (ROOT, "VCPU", DeviceKind.HOST_RESOURCES)}
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("Store not aligned with Placement: assignment ")
    assert "(VCPU host_resources host on 5e1c0c5a" in warning
    assert warning.endswith("; left as it is")


def test_a_consumer_is_what_placement_says_of_it():
    doc = {"allocations": {"rp1": {"resources": {"VCPU": 2}, "generation": 7},
                           "rp2": {"resources": {"VGPU": 1}}},
           "project_id": "p1", "user_id": "u1", "consumer_generation": 4,
           "consumer_type": "MIGRATION"}
    assert consumer_from("c1", doc) == rules.Consumer(
        "c1", {"rp1": {"VCPU": 2}, "rp2": {"VGPU": 1}}, "p1", "u1", 4, "MIGRATION")
    # A consumer without allocations: Placement names no owner.
    assert consumer_from("c2", {"allocations": {}}) == rules.Consumer(
        "c2", {}, None, None, None, None)
