"""The conductor's side of one live migration, as ``compute-agent-ctl
live-migrate INSTANCE --target HOST`` runs it.

1. The source is where Placement has the instance: the one host whose tree
   holds all its allocations (a host's root provider is named after it).
   An instance whose allocations span two hosts is in a move already.
2. Its spec (name, vCPUs, memory) is the source agent's, which is up: a
   live migration moves a running guest.
3. The destination's allocations come from ``GET /allocation_candidates``
   restricted to the target's tree, asking for what the instance holds
   with each device kept on one NUMA cell with its CPUs (``same_subtree``,
   the request an evacuation makes: agent/moves/evacuation.py).
4. agent.rpcapi.live_migrate_instance does the rest, in the order of RPC
   API 1.4: the source is told, the allocations swapped, the destination
   claims, the source migrates, the destination settles; or all of it is
   rolled back.
"""
from __future__ import annotations

import uuid as uuid_lib

import os_traits

from agent.moves.evacuation import candidate_root, evacuation_request
from agent.exception import NoSuchInstance
from agent.placement.client import PlacementClient
from agent.rpc.client import ComputeAgentAPI, live_migrate_instance
from agent.conductor.source_tree import read_device_traits, read_source_tree
from agent.conductor.errors import LiveMigrationNotPossible


class LiveMigrator:
    def __init__(self, placement: PlacementClient, api: ComputeAgentAPI):
        self.placement = placement
        self.api = api

    def _provider(self, uuid: str) -> dict:
        (found,) = self.placement.get_providers(uuid=uuid)
        return found

    def _root_named(self, host: str) -> str | None:
        roots = self.placement.get_providers(name=host, required=os_traits.COMPUTE_NODE)
        return roots[0]["uuid"] if roots else None

    def source_of(self, instance_uuid: str, field: str = "INSTANCE"
                  ) -> tuple[str, str, dict[str, dict[str, int]]]:
        """The host Placement has the instance (or the consumer ``field``
        names) on, its root provider, and its allocations there
        (provider -> class -> amount)."""
        held = self.placement.get_consumer_allocations(instance_uuid)
        allocations = {rp: dict(a["resources"]) for rp, a in held["allocations"].items()}
        if not allocations:
            raise LiveMigrationNotPossible(field, instance_uuid,
                                           "holds no allocations in Placement")
        roots = {self._provider(rp)["root_provider_uuid"] for rp in allocations}
        if len(roots) != 1:
            raise LiveMigrationNotPossible(
                field, instance_uuid, f"holds allocations on {len(roots)} hosts: "
                "it is in a move already")
        root = roots.pop()
        return self._provider(root)["name"], root, allocations

    def destination_allocations(self, instance_uuid: str,
                                allocations: dict[str, dict[str, int]],
                                source_root: str, target: str, target_root: str) -> dict:
        """Allocations on the target's tree for what the instance holds, in
        Placement's shape; LiveMigrationNotPossible when it has no room."""
        source_tree = read_source_tree(self.placement, source_root)
        read_device_traits(self.placement, source_tree, allocations)
        request = evacuation_request(allocations, source_tree)
        found = self.placement.get_allocation_candidates(
            request.query(in_tree=target_root))
        tree_of = {rp: s["root_provider_uuid"]
                   for rp, s in found.get("provider_summaries", {}).items()}
        for candidate in found["allocation_requests"]:
            if candidate_root(candidate, tree_of) == target_root:
                return candidate["allocations"]
        raise LiveMigrationNotPossible(
            "--target", target, f"has no room for instance {instance_uuid} with each "
            "device on its CPUs' NUMA cell (allocation candidates)")

    def live_migrate(self, instance_uuid: str, target: str,
                     migration_uuid: str | None = None) -> dict:
        """Move the running instance to ``target``; the agents' refusals and
        failures are raised as they sent them, after the rollback. With the
        ``migration_uuid`` of a run whose outcome was unknown, that move is
        resumed: it is settled or rolled back."""
        migration = migration_uuid or str(uuid_lib.uuid4())
        if migration_uuid is not None and self.placement.get_consumer_allocations(
                migration)["allocations"]:
            return self._resume(instance_uuid, target, migration)
        source, source_root, allocations = self.source_of(instance_uuid)
        if target == source:
            raise LiveMigrationNotPossible("--target", target, "is the instance's "
                                           "host already")
        target_root = self._root_named(target)
        if target_root is None:
            raise LiveMigrationNotPossible("--target", target,
                                           "is no compute host in Placement")
        spec = self.api.get_instance(source, instance_uuid)["spec"]
        wanted = self.destination_allocations(instance_uuid, allocations, source_root,
                                              target, target_root)
        return self._run(instance_uuid, source, target, spec, wanted, migration)

    def _resume(self, instance_uuid: str, target: str, migration: str) -> dict:
        """A move an earlier run started (the allocation swap gave the
        migration the source's allocations) and left with its outcome
        unknown: the source is where the migration's allocations are, the
        destination's allocations the instance's own, as that run wrote
        them."""
        source, _, _ = self.source_of(migration, "--migration")
        if source == target:
            raise LiveMigrationNotPossible("--migration", migration,
                                           f"moves instance {instance_uuid} away from "
                                           f"{target}, not to it")
        wanted = {rp: {"resources": a["resources"]} for rp, a in
                  self.placement.get_consumer_allocations(instance_uuid)
                  ["allocations"].items()}
        try:
            spec = self.api.get_instance(source, instance_uuid)["spec"]
        except NoSuchInstance:  # the source gave it up: the guest left it
            spec = self.api.get_instance(target, instance_uuid)["spec"]
        return self._run(instance_uuid, source, target, spec, wanted, migration)

    def _run(self, instance_uuid: str, source: str, target: str, spec: dict,
             wanted: dict, migration: str) -> dict:
        arrived = live_migrate_instance(self.api, self.placement, instance_uuid, source,
                                        target, spec, wanted, migration)
        return {"instance": instance_uuid, "source": source, "destination": target,
                "migration": migration, "running": arrived["running"]}
