"""Evacuation, pure: the rules both ends share.

- The move's uuid is a function of the instance and the source's root
  provider, so the conductor (compute-agent-ctl evacuate) and the source,
  when it returns, name the same migration without having talked: run
  twice, evacuate asks for the same move (which the destination's claim
  takes as a retry), and the returning source finds the migration consumer
  that holds its providers (nova's allocation swap) and drops it.
- What an instance needs to be rebuilt elsewhere survives its host in
  Placement: its allocations, provider by provider, say how much of each
  class it has and which of them sit together under one NUMA cell, which
  is what the destination request must keep together (compute_agent/moves/request.py).
- The source that returns gives up exactly the instances whose allocations
  sit on another host's providers, and none that a move in flight here
  still owns.
- A second evacuation of an instance from the same source (it came back to
  that host since the first) carries the first one's name; a destination
  that settled the first, and that the instance left since, takes it for a
  new move, not a retry (``evacuation_name_free_again``).
"""
from __future__ import annotations

import uuid as uuid_lib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import os_resource_classes as orc

from compute_agent.claims.choice import carried
from compute_agent.claims.model import Migration, MigrationRole, MigrationState, MoveKind

# uuid5 namespace of evacuation moves (fixed once: changing it would make a
# returning source miss the moves an older conductor made).
EVACUATION_NAMESPACE = uuid_lib.UUID("6f1c1b5e-2f0b-4d7a-9a57-0c1e5e7a1d42")

# The classes a guest's spec is made of, and where they sit in a request.
COMPUTE_CLASSES = frozenset({orc.VCPU, orc.PCPU, orc.MEMORY_MB})


def evacuation_migration_uuid(instance_uuid: str, source_root_uuid: str) -> str:
    return str(uuid_lib.uuid5(EVACUATION_NAMESPACE,
                              f"{instance_uuid.lower()}:{source_root_uuid.lower()}"))


def evacuation_name_free_again(recorded: Migration, asked: MoveKind,
                               instance_here: bool) -> bool:
    """Whether an evacuation asked for under the name of one this host
    recorded is a new move rather than a retry of that one. The name is a
    function of the instance and the source only, so an instance evacuated
    from a host, moved back to it later, and evacuated from it again, comes
    with the first evacuation's name. A retry of the first finds the
    instance here (a destination keeps it from its accept on); a new one
    comes once the first is settled here (confirmed) and the instance has
    left since. Anything else is a retry, answered from the record."""
    return (asked is MoveKind.EVACUATION and recorded.kind is MoveKind.EVACUATION
            and recorded.role is MigrationRole.DESTINATION
            and recorded.state is MigrationState.CONFIRMED and not instance_here)


def evacuated_away(on_our_providers: bool, elsewhere: set[str] | None,
                   open_move_here: Migration | None, evacuation_hold_here: bool) -> bool:
    """Whether a returning source gives the instance up: Placement holds its
    allocations, all on another host's providers, no move in flight on this
    host owns it (a live migration's source, say, whose instance consumer
    already holds the destination), and the evacuation's migration consumer
    (evacuation_migration_uuid) holds its share of this host, as the
    conductor's allocation swap (the Evacuator of
    compute_agent/conductor/evacuation.py) left it. Without that hold it is
    a move whose source step this host has not recorded yet: a conductor's
    swap for a resize or live migration also puts the instance's
    allocations on the destination first. Unknown (None) is never taken
    for elsewhere."""
    return (not on_our_providers and bool(elsewhere) and open_move_here is None
            and evacuation_hold_here)


def spec_from_allocations(instance_uuid: str,
                          allocations: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    """The instance's spec as Placement keeps it: vCPUs (shared and
    dedicated) and memory summed over its providers. Its name is not in
    Placement; the rebuilt instance is named by its uuid (the guest's domain
    is anyway)."""
    vcpus, memory_mb = carried(allocations.values())
    if not vcpus or not memory_mb:
        raise ValueError(f"instance {instance_uuid}: its allocations hold no CPU or "
                         "no memory; not an instance this agent can rebuild")
    return {"name": f"instance-{instance_uuid}", "vcpus": vcpus,
            "memory_mb": memory_mb}


# --- the conductor's second run ------------------------------------------------

@dataclass(frozen=True)
class InterruptedEvacuation:
    """An instance whose allocations a conductor moved to ``destination``
    for an evacuation of the source, and then left: it may have died before
    the destination answered, or before it even called."""

    instance: str
    migration: str
    destination_root: str
    # Provider -> resources: what the instance now holds on the destination,
    # and what its move still holds on the source (its spec, as at first).
    destination_allocations: Mapping[str, Mapping[str, int]]
    source_allocations: Mapping[str, Mapping[str, int]]


def interrupted_evacuations(source_root_uuid: str,
                            migrations_on_source: Mapping[str, Mapping[str, Mapping[str, int]]],
                            consumers_by_root: Mapping[str, Mapping[str, Mapping[str, Mapping[str, int]]]]
                            ) -> list[InterruptedEvacuation]:
    """The instances on other hosts (root -> consumer -> provider ->
    resources) that an evacuation of the source moved there: those whose
    evacuation move, named from the instance and the source, is one of the
    migration consumers still holding the source's share (migration ->
    provider -> resources). The source drops that consumer when it
    returns; until then it names the instance."""
    found = []
    for root, consumers in sorted(consumers_by_root.items()):
        if root == source_root_uuid:
            continue
        for consumer, allocations in sorted(consumers.items()):
            move = evacuation_migration_uuid(consumer, source_root_uuid)
            if move in migrations_on_source:
                found.append(InterruptedEvacuation(consumer, move, root, allocations,
                                                   migrations_on_source[move]))
    return found


class DestinationRecord(str, Enum):
    """What the destination of an interrupted evacuation has of it."""

    DONE = "done"  # rebuilt there, the move confirmed: nothing to do
    ACCEPTED = "accepted"  # it owns the rebuild: wait for it
    NONE = "none"  # never accepted it: call it again (a retry is idempotent)
    OTHER = "other"  # it has the instance but not this move: hands off


def destination_record(view: dict[str, Any] | None, migration_uuid: str) -> DestinationRecord:
    """``view``: the destination's get_instance answer, None when it has no
    such instance."""
    if view is None:
        return DestinationRecord.NONE
    moves = [m for m in view["migrations"] if m["uuid"] == migration_uuid]
    if not moves:
        return DestinationRecord.OTHER
    if view["running"] and all(m["state"] == "confirmed" for m in moves):
        return DestinationRecord.DONE
    return DestinationRecord.ACCEPTED
