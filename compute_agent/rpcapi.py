"""The import path conductors use, kept stable across releases: the RPC
client, the allocation swap and the conductor's live-migration run.

    from agent.rpcapi import ComputeAgentAPI, live_migrate_instance, move_allocations

Each lives in its own package (agent/rpc/client.py,
agent/placement/allocations.py, agent/conductor/live_migration.py); this
module only names them, and is what docs/architecture.md promises."""
from agent.conductor.live_migration import (MoveOutcome, NextStep, live_migrate_instance,
                                            live_migrate_outcome, next_step)
from agent.placement.allocations import move_allocations
from agent.rpc.client import ComputeAgentAPI
from agent.rpc.outstanding import OutstandingCalls
from agent.rpc.errors import BrokerUnreachable, NoAnswer

__all__ = ["BrokerUnreachable", "ComputeAgentAPI", "MoveOutcome", "NextStep", "NoAnswer",
           "OutstandingCalls", "live_migrate_instance", "live_migrate_outcome",
           "move_allocations", "next_step"]
