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
  is what the destination request must keep together (``same_subtree``).
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
from dataclasses import dataclass, field
from enum import Enum

import os_resource_classes as orc
import os_traits

from agent.claims.model import Migration, MigrationRole, MigrationState, MoveKind

# uuid5 namespace of evacuation moves (fixed once: changing it would make a
# returning source miss the moves an older conductor made).
EVACUATION_NAMESPACE = uuid_lib.UUID("6f1c1b5e-2f0b-4d7a-9a57-0c1e5e7a1d42")

# The classes a guest's spec is made of, and where they sit in a request.
CPU_CLASSES = (orc.VCPU, orc.PCPU)
COMPUTE_CLASSES = frozenset({orc.VCPU, orc.PCPU, orc.MEMORY_MB})
# Traits of a device provider that say what its devices are, beyond their
# class, and so must hold at the destination too.
MEANINGFUL_TRAIT_PREFIXES = ("CUSTOM_MDEV_TYPE_", "CUSTOM_PHYSNET_")


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
    evacuator's allocation swap left it. Without that hold it is a move
    whose source step this host has not recorded yet: a conductor's swap
    for a resize or live migration also puts the instance's allocations on
    the destination first. Unknown (None) is never taken for elsewhere."""
    return (not on_our_providers and bool(elsewhere) and open_move_here is None
            and evacuation_hold_here)


# --- the destination request ------------------------------------------------

@dataclass(frozen=True)
class SourceProvider:
    """One provider of the source's tree, as the request needs it."""

    uuid: str
    parent_uuid: str | None
    traits: frozenset[str] = frozenset()


@dataclass
class RequestGroup:
    resources: dict[str, int] = field(default_factory=dict)
    required: set[str] = field(default_factory=set)

    def param(self) -> str:
        return ",".join(f"{rc}:{n}" for rc, n in sorted(self.resources.items()))


@dataclass
class EvacuationRequest:
    """What the instance holds on the source, as allocation-candidate
    groups: the unsuffixed group (the root's classes), one group per NUMA
    cell it used (``_CELLn``, its CPUs and memory, HW_NUMA_ROOT required)
    and one per device provider (``_DEVn``), each device group tied to its
    cell's group by ``same_subtree``."""

    unsuffixed: RequestGroup = field(default_factory=RequestGroup)
    groups: dict[str, RequestGroup] = field(default_factory=dict)
    same_subtree: list[tuple[str, ...]] = field(default_factory=list)

    def query(self, in_tree: str | None = None, limit: int | None = None
              ) -> list[tuple[str, str]]:
        """GET /allocation_candidates parameters (microversion 1.36+)."""
        out: list[tuple[str, str]] = []
        if self.unsuffixed.resources:
            out.append(("resources", self.unsuffixed.param()))
            if in_tree:
                out.append(("in_tree", in_tree))
        for suffix, g in sorted(self.groups.items()):
            out.append((f"resources{suffix}", g.param()))
            if g.required:
                out.append((f"required{suffix}", ",".join(sorted(g.required))))
            # Per group: an unsuffixed in_tree alone would be a group
            # without resources, which Placement refuses (1.33+).
            if in_tree:
                out.append((f"in_tree{suffix}", in_tree))
        for tied in self.same_subtree:
            out.append(("same_subtree", ",".join(tied)))
        if self.groups:
            out.append(("group_policy", "none"))
        if limit:
            out.append(("limit", str(limit)))
        return out


def cell_of(uuid: str, providers: dict[str, SourceProvider]) -> str | None:
    """The NUMA-cell provider at or above ``uuid``, if any."""
    seen = set()
    while uuid is not None and uuid in providers and uuid not in seen:
        seen.add(uuid)
        if os_traits.HW_NUMA_ROOT in providers[uuid].traits:
            return uuid
        uuid = providers[uuid].parent_uuid
    return None


def evacuation_request(allocations: dict[str, dict[str, int]],
                       providers: dict[str, SourceProvider]) -> EvacuationRequest:
    """The request for ``allocations`` (provider uuid -> class -> amount on
    the source), ``providers`` being the source's tree. Raises ValueError
    naming a provider the tree does not have."""
    req = EvacuationRequest()
    cell_group: dict[str, str] = {}
    devices: list[tuple[str, str | None]] = []
    for rp, resources in sorted(allocations.items()):
        if rp not in providers:
            raise ValueError(f"allocations: provider {rp} is not in the source's tree")
        p = providers[rp]
        if p.parent_uuid is None:
            group = req.unsuffixed
        elif os_traits.HW_NUMA_ROOT in p.traits:
            suffix = cell_group.setdefault(rp, f"_CELL{len(cell_group)}")
            group = req.groups.setdefault(suffix, RequestGroup(
                required={os_traits.HW_NUMA_ROOT}))
        else:
            suffix = f"_DEV{len(devices)}"
            devices.append((suffix, cell_of(rp, providers)))
            group = req.groups.setdefault(suffix, RequestGroup(required={
                t for t in p.traits if t.startswith(MEANINGFUL_TRAIT_PREFIXES)}))
        for rc, n in resources.items():
            group.resources[rc] = group.resources.get(rc, 0) + n
    for suffix, cell in devices:
        if cell is not None and cell in cell_group:
            req.same_subtree.append((cell_group[cell], suffix))
    return req


def spec_from_allocations(instance_uuid: str,
                          allocations: dict[str, dict[str, int]]) -> dict:
    """The instance's spec as Placement keeps it: vCPUs (shared and
    dedicated) and memory summed over its providers. Its name is not in
    Placement; the rebuilt instance is named by its uuid (the guest's domain
    is anyway)."""
    total: dict[str, int] = {}
    for resources in allocations.values():
        for rc, n in resources.items():
            total[rc] = total.get(rc, 0) + n
    vcpus = sum(total.get(rc, 0) for rc in CPU_CLASSES)
    if not vcpus or not total.get(orc.MEMORY_MB):
        raise ValueError(f"instance {instance_uuid}: its allocations hold no CPU or "
                         "no memory; not an instance this agent can rebuild")
    return {"name": f"instance-{instance_uuid}", "vcpus": vcpus,
            "memory_mb": total[orc.MEMORY_MB]}


def candidate_root(request: dict, tree_of: dict[str, str]) -> str | None:
    """The host (root provider) an allocation request lands on, when all its
    providers are in one known tree."""
    roots = {tree_of.get(rp) for rp in request["allocations"]}
    return roots.pop() if len(roots) == 1 else None


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
    destination_allocations: dict[str, dict[str, int]]
    source_allocations: dict[str, dict[str, int]]


def interrupted_evacuations(source_root_uuid: str,
                            migrations_on_source: dict[str, dict[str, dict[str, int]]],
                            consumers_by_root: dict[str, dict[str, dict[str, int]]]
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


def destination_record(view: dict | None, migration_uuid: str) -> DestinationRecord:
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
