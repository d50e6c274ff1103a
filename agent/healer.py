"""Heal, as ``compute-agent-manage heal`` and ``[heal] on_startup`` run it:
read what the plan needs, build the plan (agent/heal.py), send it as one
``POST /reshaper``, and re-read and re-plan when another writer got there
first.

Reads: the tree (one GET), the allocations of each provider the model takes
a class off (a few), and each affected consumer's complete allocations (one
GET each, several at a time: only ``GET /allocations/{consumer}`` tells a
consumer's project, user, generation and its allocations on other hosts,
and the reshaper replaces all of them). Writes: one reshaper, then the
update cycle that deletes the providers the model dropped.
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from agent import heal
from agent.exception import AgentError, GenerationConflict
from agent.host_tree import build_tree
from agent.placement import PlacementClient
from agent.provider_tree import adopt_uuids

if TYPE_CHECKING:
    from agent.service import Agent

LOG = logging.getLogger(__name__)

ATTEMPTS = 4
READERS = 8


@dataclass
class HealResult:
    plan: heal.Plan
    applied: bool
    attempts: int


def consumer_from(uuid: str, doc: dict) -> heal.Consumer:
    """A consumer from Placement's answer to ``GET /allocations/{uuid}``."""
    return heal.Consumer(
        uuid, {rp: dict(body["resources"]) for rp, body in doc["allocations"].items()},
        doc.get("project_id"), doc.get("user_id"), doc.get("consumer_generation"),
        doc.get("consumer_type"))


def read_consumers(client: PlacementClient, uuids: list[str]) -> dict[str, heal.Consumer]:
    with ThreadPoolExecutor(READERS, thread_name_prefix="heal-read") as pool:
        docs = pool.map(client.get_consumer_allocations, uuids)
        return {uuid: consumer_from(uuid, doc) for uuid, doc in zip(uuids, docs)}


def make_plan(agent: "Agent") -> heal.Plan:
    """Read Placement afresh and plan; HealRefused names a consumer that
    cannot be moved."""
    from agent.service import pools_by_uuid  # the service starts heal too

    sync = agent.sync
    sync.refresh()
    current = sync.cache
    built = build_tree(agent.driver.get_host_inventory(), agent.policy)
    model = adopt_uuids(built.tree, current)
    holders: set[str] = set()
    for uuid, classes in heal.moving(current, model, sync.owned).items():
        for consumer, body in sync.client.get_provider_allocations(uuid).items():
            if set(body["resources"]) & classes:
                holders.add(consumer)
    consumers = read_consumers(sync.client, sorted(holders))
    _, assignments, migrations = agent.manager.tracker.snapshot()
    return heal.plan_heal(current, model,
                          pools_by_uuid(built, {p.name: p.uuid for p in model}),
                          consumers, assignments, migrations.values(), sync.owned)


def run_heal(agent: "Agent", dry_run: bool = False,
             confirm: Callable[[heal.Plan], bool] = lambda plan: True,
             attempts: int = ATTEMPTS) -> HealResult:
    """Heal the host, or with ``dry_run`` only say how; ``confirm`` sees the
    plan before it is sent and may decline it. A plan that loses a race
    (409) is read and made again, ``attempts`` times at most."""
    if not dry_run:
        # The held tree stands first, so every provider the plan names exists.
        agent.update_provider_tree()
    for attempt in range(1, attempts + 1):
        plan = make_plan(agent)
        if plan.empty or dry_run or not confirm(plan):
            return HealResult(plan, False, attempt)
        try:
            agent.sync.client.reshape(plan.inventories, plan.reshaper_allocations())
        except GenerationConflict as e:
            LOG.info("Heal lost a race with another writer, planning again: %s", e)
            continue
        LOG.info("Healed: %d allocations of %d consumers moved, inventories of %d "
                 "providers set, in one reshape", len(plan.moves), len(plan.consumers),
                 len(plan.inventories))
        agent.update_provider_tree()
        return HealResult(plan, True, attempt)
    raise AgentError(f"heal: Placement changed under each of {attempts} attempts; "
                     "nothing was changed, run it again")
