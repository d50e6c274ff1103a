"""Heal, as ``compute-agent-manage heal`` and ``[heal] on_startup`` run it:
read what the plan needs, build the plan (compute_agent/heal/rules.py), send it as one
``POST /reshaper``, and re-read and re-plan when another writer got there
first.

Reads: the tree (one GET), the allocations of each provider the model takes
a class off (a few), and each affected consumer's complete allocations (one
GET each, several at a time: only ``GET /allocations/{consumer}`` tells a
consumer's project, user, generation and its allocations on other hosts,
and the reshaper replaces all of them). Writes: one reshaper, then the
store's rows moved after their allocations (compute_agent/heal/realign.py) in one
transaction, then the update cycle that deletes the providers the model
dropped. Heal killed between the reshaper and the store's write is made
good by the next heal, whose plan is empty, or the agent's next start
(align_store).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from compute_agent.claims.model import Allocations
from compute_agent.compute.manager import ComputeManager
from compute_agent.drivers.base import HostInventory
from compute_agent.drivers.driver import ComputeDriver
from compute_agent.exception import AgentError, GenerationConflict
from compute_agent.heal import rules
from compute_agent.heal.realign import DeviceIndex, Realignment, misplaced, realign
from compute_agent.placement.allocations import tree_allocations
from compute_agent.placement.client import PlacementClient
from compute_agent.placement.sync import TreeSync
from compute_agent.tree.host_tree import BuiltTree
from compute_agent.tree.provider_tree import adopt_uuids

LOG = logging.getLogger(__name__)


class HealedAgent(Protocol):
    """What heal needs of the agent (compute_agent/daemon/service.py's Agent, which
    runs heal at start and for 'compute-agent-manage heal')."""

    sync: TreeSync
    driver: ComputeDriver

    @property
    def manager(self) -> ComputeManager: ...

    def build_model(self, inventory: HostInventory) -> BuiltTree: ...

    def update_provider_tree(self) -> object: ...


ATTEMPTS = 4
READERS = 8


@dataclass
class HealResult:
    plan: rules.Plan
    applied: bool
    attempts: int
    # The store's rows moved after their allocations: by this heal's
    # reshape, or (an empty plan) left by an earlier one that was killed.
    store: Realignment = field(default_factory=Realignment)


def consumer_from(uuid: str, doc: dict[str, Any]) -> rules.Consumer:
    """A consumer from Placement's answer to ``GET /allocations/{uuid}``."""
    return rules.Consumer(
        uuid, {rp: dict(body["resources"]) for rp, body in doc["allocations"].items()},
        doc.get("project_id"), doc.get("user_id"), doc.get("consumer_generation"),
        doc.get("consumer_type"))


def read_consumers(client: PlacementClient, uuids: list[str]) -> dict[str, rules.Consumer]:
    with ThreadPoolExecutor(READERS, thread_name_prefix="heal-read") as pool:
        docs = pool.map(client.get_consumer_allocations, uuids)
        return {uuid: consumer_from(uuid, doc) for uuid, doc in zip(uuids, docs)}


def read_model(agent: HealedAgent) -> rules.Model:
    """Placement's tree read afresh, and the model built beside it."""
    agent.sync.refresh()
    current = agent.sync.cache
    built = agent.build_model(agent.driver.get_host_inventory())
    model = adopt_uuids(built.tree, current)
    return rules.Model(current, model, built.pools_by_uuid({p.name: p.uuid for p in model}))


def make_plan(agent: HealedAgent, model: rules.Model,
              progress: Callable[[str], None] = lambda line: None) -> rules.Plan:
    """Plan from ``model``, reading the consumers it moves; HealRefused
    names a consumer that cannot be moved."""
    sync = agent.sync
    holders: set[str] = set()
    for uuid, classes in rules.moving(model.current, model.tree, sync.owned).items():
        for consumer, body in sync.client.get_provider_allocations(uuid).items():
            if set(body["resources"]) & classes:
                holders.add(consumer)
    if holders:
        progress(f"reading the allocations of {len(holders)} consumers...")
    consumers = read_consumers(sync.client, sorted(holders))
    _, assignments, migrations = agent.manager.tracker.snapshot()
    return rules.plan_heal(model, consumers, assignments, migrations.values(), sync.owned)


def align_store(agent: HealedAgent, index: DeviceIndex,
                allocations: Allocations | None = None) -> Realignment:
    """Move the store's rows to where Placement holds their allocations
    (compute_agent/heal/realign.py), in one transaction. ``allocations``: consumer ->
    provider -> class -> amount, as a reshape just set them; read from
    Placement's tree when not given, and only when some row is not where
    the model puts it."""
    tracker = agent.manager.tracker
    if not index.pools:  # no cycle has built the model: unknown, not empty
        return Realignment()
    suspects = misplaced(tracker.snapshot()[1], index)
    if not suspects:
        return Realignment()
    if allocations is None:
        allocations = tree_allocations(agent.sync.client, agent.sync.root_uuid)
    result = realign(suspects, allocations, index)
    moved = tracker.realign(result.moved)
    if moved:
        LOG.info("Store follows Placement: %d assignments of %d consumers moved to "
                 "the providers that hold their allocations", len(moved),
                 len({a.consumer_uuid for a in moved}))
    for unaligned in result.unaligned:
        LOG.warning("Store not aligned with Placement: %s; left as it is", unaligned)
    return result


def run_heal(agent: HealedAgent, dry_run: bool = False,
             confirm: Callable[[rules.Plan], bool] = lambda plan: True,
             attempts: int = ATTEMPTS,
             progress: Callable[[str], None] = lambda line: None) -> HealResult:
    """Heal the host, or with ``dry_run`` only say how; ``confirm`` sees the
    plan before it is sent and may decline it. A plan that loses a race
    (409) is read and made again, ``attempts`` times at most. ``progress``
    is told each slow step as it starts."""
    if not dry_run:
        # The held tree stands first, so every provider the plan names exists.
        agent.update_provider_tree()
    for attempt in range(1, attempts + 1):
        model = read_model(agent)
        plan = make_plan(agent, model, progress)
        if plan.empty and not dry_run:
            # A heal killed after its reshape left the store behind.
            return HealResult(plan, False, attempt,
                              align_store(agent, DeviceIndex(model.pools)))
        if plan.empty or dry_run or not confirm(plan):
            return HealResult(plan, False, attempt)
        progress(f"sending one reshape of {len(plan.consumers)} consumers' allocations "
                 f"and {len(plan.inventories)} inventories...")
        try:
            agent.sync.client.reshape(plan.inventories, plan.reshaper_allocations())
        except GenerationConflict as e:
            LOG.info("Heal lost a race with another writer, planning again: %s", e)
            continue
        LOG.info("Healed: %d allocations of %d consumers moved, inventories of %d "
                 "providers set, in one reshape", len(plan.moves), len(plan.consumers),
                 len(plan.inventories))
        store = align_store(agent, DeviceIndex(model.pools),
                            {uuid: c.allocations for uuid, c in plan.consumers.items()})
        agent.update_provider_tree()
        return HealResult(plan, True, attempt, store)
    raise AgentError(f"heal: Placement changed under each of {attempts} attempts; "
                     "nothing was changed, run it again")
