"""The conductor's side of an evacuation, and of telling hosts apart by
their heartbeat: what ``compute-agent-ctl hosts`` and ``evacuate`` do.

Evacuating a down SOURCE, instance by instance:

1. Its instances are the INSTANCE consumers holding allocations on its
   tree; the spec each needs is derived from those allocations
   (agent/evacuation.py), so nothing of the dead host is needed.
2. A destination from ``GET /allocation_candidates``, one request per
   instance, with each device kept on one NUMA cell with its CPUs
   (``same_subtree``), on an up host other than the source.
3. One ``POST /allocations`` (the allocation-swap helper): the migration
   consumer takes the source's allocations, the instance the destination's.
4. ``rebuild_instance`` (1.3) to the destination, naming the source; it
   answers once the move and the claim are on its disk, and owns the
   rebuild from then on. A refusal moves the allocations back: the instance
   stays recorded on the source.
5. Progress: each accepted instance, until its guest runs.

Run again, it finds only migration consumers on the source: nothing is
evacuated twice.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import os_traits

from agent.evacuation import (SourceProvider, candidate_root, evacuation_migration_uuid,
                              evacuation_request, spec_from_allocations)
from agent.exception import AgentError, SourceHostUp
from agent.heartbeat import Heartbeat, Liveness
from agent.messaging import messaging
from agent.placement import PlacementClient
from agent.rpcapi import ComputeAgentAPI, move_allocations


class NoSuchHost(AgentError):
    def __init__(self, host: str):
        super().__init__(host)

    def __str__(self) -> str:
        return f"SOURCE: no compute host named {self.args[0]!r} in Placement"


@dataclass
class Outcome:
    """One instance of the source, and what became of it."""

    instance: str
    state: str  # accepted, running, failed, skipped
    destination: str | None = None
    migration: str | None = None
    error: str | None = None


@dataclass
class Evacuation:
    source: str
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.state in ("running", "skipped") for o in self.outcomes)

    def as_dict(self) -> dict:
        return {"source": self.source, "ok": self.ok,
                "instances": [asdict(o) for o in self.outcomes]}


class Evacuator:
    def __init__(self, placement: PlacementClient, api: ComputeAgentAPI,
                 heartbeat: Heartbeat, poll: ComputeAgentAPI | None = None):
        """``poll``: the client progress is read with, on a short timeout (a
        destination that dies must not hold the rest up); ``api`` by
        default."""
        self.placement = placement
        self.api = api
        self.poll = poll or api
        self.heartbeat = heartbeat
        self._liveness: dict[str, Liveness] = {}

    # --- hosts ------------------------------------------------------------

    def compute_roots(self) -> dict[str, str]:
        """root provider uuid -> host name, for every compute node."""
        return {p["uuid"]: p["name"] for p in
                self.placement.get_providers(required=os_traits.COMPUTE_NODE)}

    def consumers_on(self, root_uuid: str) -> dict[str, dict[str, dict[str, int]]]:
        """consumer -> provider -> resources, over the tree of ``root_uuid``."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for p in self.placement.get_tree(root_uuid):
            for consumer, body in self.placement.get_provider_allocations(
                    p["uuid"]).items():
                out.setdefault(consumer, {})[p["uuid"]] = dict(body["resources"])
        return out

    def hosts(self) -> list[dict]:
        """Every compute host: up or down by its heartbeat, when it last
        answered, and its instances (its own count when up; when down, the
        consumers Placement has on its tree)."""
        roots = self.compute_roots()
        found = self.heartbeat.check_many(sorted(roots.values()))
        out = []
        for root, name in sorted(roots.items(), key=lambda r: r[1]):
            seen = found[name]
            out.append({"host": name, "root_uuid": root, "state": seen.state.value,
                        "last_seen": seen.report["time"] if seen.up else None,
                        "instances": (seen.report["instances"] if seen.up
                                      else len(self.consumers_on(root)))})
        return out

    def _alive(self, host: str) -> bool:
        if host not in self._liveness:
            self._liveness[host] = self.heartbeat.check(host)
        return self._liveness[host].up

    # --- evacuation -------------------------------------------------------

    def evacuate(self, source: str, target: str | None = None, force: bool = False,
                 progress: Callable[[Outcome], None] = lambda o: None,
                 deadline: float | None = None) -> Evacuation:
        roots = self.compute_roots()
        by_name = {name: uuid for uuid, name in roots.items()}
        if source not in by_name:
            raise NoSuchHost(source)
        if target is not None and target not in by_name:
            raise NoSuchHost(target)
        if not force and self._alive(source):
            raise SourceHostUp(source, self.heartbeat.down_after)
        source_root = by_name[source]
        tree = self.placement.get_tree(source_root)
        cells = {p["uuid"] for p in self.placement.get_providers(
            in_tree=source_root, required=os_traits.HW_NUMA_ROOT)}
        providers = {p["uuid"]: SourceProvider(
            p["uuid"], p["parent_provider_uuid"],
            frozenset({os_traits.HW_NUMA_ROOT}) if p["uuid"] in cells else frozenset())
            for p in tree}
        traits_read: set[str] = set()
        result = Evacuation(source)
        accepted: list[Outcome] = []
        for instance, allocations in sorted(self.consumers_on(source_root).items()):
            outcome = self._evacuate_one(instance, allocations, source, source_root,
                                         providers, traits_read, roots,
                                         by_name.get(target) if target else None, force)
            if outcome is None:
                continue  # a migration's consumer, not an instance
            result.outcomes.append(outcome)
            progress(outcome)
            if outcome.state == "accepted":
                accepted.append(outcome)
        self._wait_running(accepted, progress, deadline)
        return result

    def _evacuate_one(self, instance, allocations, source, source_root, providers,
                      traits_read, roots, target_root, force) -> Outcome | None:
        held = self.placement.get_consumer_allocations(instance)
        if held.get("consumer_type", "INSTANCE") != "INSTANCE":
            return None
        if set(held["allocations"]) - set(providers):
            return Outcome(instance, "skipped",
                           error="holds allocations on another host too (in a move)")
        for rp in set(allocations) - traits_read:
            p = providers[rp]
            if p.parent_uuid is not None and rp not in _cells(providers):
                _, traits = self.placement.get_traits(rp)
                providers[rp] = SourceProvider(rp, p.parent_uuid, traits)
            traits_read.add(rp)
        try:
            spec = spec_from_allocations(instance, allocations)
            request = evacuation_request(allocations, providers)
        except ValueError as e:
            return Outcome(instance, "failed", error=str(e))
        found = self.placement.get_allocation_candidates(request.query(in_tree=target_root))
        tree_of = {rp: s["root_provider_uuid"]
                   for rp, s in found.get("provider_summaries", {}).items()}
        chosen = None
        for candidate in found["allocation_requests"]:
            root = candidate_root(candidate, tree_of)
            if root is not None and root != source_root and root in roots \
                    and self._alive(roots[root]):
                chosen = (roots[root], candidate["allocations"])
                break
        if chosen is None:
            return Outcome(instance, "failed",
                           error="no up host has room for it with each device on "
                                 "its CPUs' NUMA cell (allocation candidates)")
        destination, wanted = chosen
        migration = evacuation_migration_uuid(instance, source_root)
        move_allocations(self.placement, instance, migration, replacement=wanted)
        try:
            self.api.rebuild_instance(destination, migration, instance, spec, wanted,
                                      source_host=source, force=force)
        except messaging.MessagingTimeout:
            # It may have been accepted: the destination then owns it.
            return Outcome(instance, "failed", destination, migration,
                           f"no answer from {destination}: if it accepted the "
                           "rebuild it owns it and resumes it; see "
                           f"compute-agent-ctl show {destination} {instance}")
        except AgentError as e:
            # Refused: nothing was claimed there. The instance goes back to
            # the source's allocations, where the source's store has it.
            move_allocations(self.placement, migration, instance, "INSTANCE")
            return Outcome(instance, "failed", destination, migration,
                           _first_line(e))
        return Outcome(instance, "accepted", destination, migration)

    def _wait_running(self, accepted: list[Outcome],
                      progress: Callable[[Outcome], None],
                      deadline: float | None) -> None:
        """Until each accepted instance runs on its destination, or the
        deadline (monotonic) passes: those stay 'accepted'."""
        waiting = list(accepted)
        while waiting:
            silent: set[str] = set()  # destinations that did not answer this round
            for o in list(waiting):
                if o.destination in silent or (
                        deadline is not None and time.monotonic() > deadline):
                    continue
                try:
                    view = self.poll.get_instance(o.destination, o.instance)
                except messaging.MessagingTimeout:
                    silent.add(o.destination)
                    continue
                except (AgentError, messaging.MessagingException):
                    continue
                settled = all(m["state"] == "confirmed" for m in view["migrations"]
                              if m["uuid"] == o.migration)
                if view["running"] and settled:
                    o.state = "running"
                    progress(o)
                    waiting.remove(o)
            if not waiting or (deadline is not None and time.monotonic() > deadline):
                return
            time.sleep(0.2)


def _cells(providers: dict[str, SourceProvider]) -> set[str]:
    return {u for u, p in providers.items() if os_traits.HW_NUMA_ROOT in p.traits}


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
