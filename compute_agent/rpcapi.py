"""The import path conductors use, kept stable across releases: the RPC
client, the allocation swap and the conductor's live-migration run.

    from compute_agent.rpcapi import ComputeAgentAPI, live_migrate_instance, move_allocations

Each lives in its own package (compute_agent/rpc/client.py,
compute_agent/placement/allocations.py, compute_agent/conductor/live_migration.py); this
module only names them, and is what docs/architecture.md promises."""
from compute_agent.conductor.live_migration import (
                                            MoveOutcome,
                                            NextStep,
                                            live_migrate_instance,
                                            live_migrate_outcome,
                                            next_step,
)
from compute_agent.placement.allocations import move_allocations
from compute_agent.rpc.client import ComputeAgentAPI
from compute_agent.rpc.errors import BrokerUnreachable, NoAnswer
from compute_agent.rpc.outstanding import OutstandingCalls

__all__ = ["BrokerUnreachable", "ComputeAgentAPI", "MoveOutcome", "NextStep", "NoAnswer",
           "OutstandingCalls", "live_migrate_instance", "live_migrate_outcome",
           "move_allocations", "next_step"]
