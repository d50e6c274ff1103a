"""Keep Placement in step with a desired provider tree, with the fewest calls.

The cache is the agent's view of Placement: every provider of our tree with
its generation, inventories and traits, as last read or written. A cycle
starts with one ``GET /resource_providers?in_tree=<root>``; a provider whose
generation has not moved is known to match the cache and is not read again.
So a cycle in which nothing changed costs exactly one request.

Every write that changes something is one INFO line naming the provider
and what changed; a cycle that changes nothing logs nothing at INFO.
"""
from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from compute_agent.exception import GenerationConflict, PlacementError
from compute_agent.placement.client import PlacementClient
from compute_agent.tree import provider_tree as pt

LOG = logging.getLogger(__name__)


# What may be reported of a model now, given Placement's tree and what we
# own: the heal rule's hold (compute_agent/heal/hold.py), which keeps new providers
# reserved while consumers still hold their classes elsewhere.
Hold = Callable[[pt.ProviderTree, pt.ProviderTree, Callable[[pt.Provider], bool]],
                pt.ProviderTree]


@dataclass
class SyncResult:
    writes: int = 0
    warnings: list[str] = field(default_factory=list)
    # The tree as it now stands in Placement, with the UUIDs it uses.
    tree: pt.ProviderTree | None = None


class TreeSync:
    # A provider's read, and each write, are tried this many times while
    # another writer moves its generation in between; a write's retries
    # back off from this many seconds, doubling (with jitter).
    attempts = 4
    backoff = 0.1
    # Deleting allocations does not move a provider's generation, so a
    # provider Placement kept is also retried after this long.
    kept_retry_seconds: float = 300

    def __init__(self, client: PlacementClient, root_uuid: str, hold: Hold,
                 owned: Callable[[pt.Provider], bool] = lambda p: True):
        self.client = client
        self.root_uuid = root_uuid
        self.owned = owned
        self.hold = hold
        # The tree the start's check read, for the next refresh (prime).
        self._primed: list[dict] | None = None
        # The view an earlier run saved, while it is still the cache.
        self._restored: pt.ProviderTree | None = None
        self.invalidate()

    def restore(self, view: pt.ProviderTree) -> None:
        """Start from a view saved by an earlier run: its providers are
        trusted as long as their generation has not moved."""
        self.cache = self._restored = view

    @property
    def read_this_run(self) -> bool:
        """Whether the cache holds what this process read of Placement, not
        only the view an earlier run saved (restore): its generations are
        no answer of Placement's."""
        return self.cache is not self._restored

    def prime(self, tree: list[dict]) -> None:
        """The tree as the start's one-agent check just read it
        (compute_agent/daemon/one_agent_run.py): the next refresh takes it rather than
        reading it again, so that a restart's check and its first cycle
        cost one request. Read a moment before that cycle, it is safe as
        any tree read is: what changed since moves a generation that the
        next read shows, and a write on a stale generation is refused."""
        self._primed = tree

    def invalidate(self) -> None:
        """Forget everything learnt from Placement (SIGHUP)."""
        self.cache = pt.ProviderTree()
        self._primed = None
        self._known_names: set[tuple[str, str]] = set()  # ("rc" or "trait", name)
        # uuid -> (generation, monotonic time) when Placement refused to
        # delete it.
        self._kept: dict[str, tuple[int | None, float]] = {}

    # --- reading --------------------------------------------------------

    def _read_provider(self, uuid: str, name: str, parent: str | None) -> pt.Provider:
        for _ in range(self.attempts):
            inv_gen, invs = self.client.get_inventories(uuid)
            trait_gen, traits = self.client.get_traits(uuid)
            if inv_gen == trait_gen:
                return pt.Provider(uuid, name, parent, invs, traits, None, inv_gen)
        raise GenerationConflict(f"provider {name} kept changing while read")

    def refresh(self) -> None:
        """One GET for the tree (none when primed); read only providers
        whose generation moved."""
        rows, self._primed = self._primed, None
        if rows is None:
            rows = self.client.get_tree(self.root_uuid)
        providers = []
        for row in rows:
            cached = self.cache.get(row["uuid"])
            if (cached is not None and cached.generation == row["generation"]
                    and cached.name == row["name"]
                    and cached.parent_uuid == row["parent_provider_uuid"]):
                providers.append(cached)
            else:
                providers.append(self._read_provider(row["uuid"], row["name"],
                                                     row["parent_provider_uuid"]))
        self.cache = pt.ProviderTree.parents_first(providers)

    # --- writing --------------------------------------------------------

    def _ensure_names(self, ops: list[pt.Operation]) -> int:
        """Create the custom names the operations add to a provider; those
        it already holds exist."""
        names: set[tuple[str, str]] = set()
        for op in ops:
            uuid = getattr(op, "uuid", None)
            current = self.cache.get(uuid) if uuid is not None else None
            if isinstance(op, pt.SetInventories):
                held = frozenset(current.inventories) if current else frozenset()
                names |= {("rc", rc) for rc in set(op.inventories) - held
                          if rc.startswith("CUSTOM_")}
            elif isinstance(op, pt.SetTraits):
                held = current.traits if current else frozenset()
                names |= {("trait", t) for t in op.traits - held
                          if t.startswith("CUSTOM_")}
        calls = 0
        for kind, name in sorted(names - self._known_names):
            if kind == "rc":
                self.client.ensure_resource_class(name)
            else:
                self.client.ensure_trait(name)
            self._known_names.add((kind, name))
            calls += 1
        return calls

    def _do(self, op: pt.Operation) -> None:
        before = None if isinstance(op, pt.CreateProvider) else self.cache.get(op.uuid)
        self._apply(op, before)
        LOG.info("Placement: %s", pt.describe(op, before))

    def _apply(self, op: pt.Operation, current: pt.Provider | None) -> None:
        c, cache = self.client, self.cache
        if isinstance(op, pt.CreateProvider):
            p = op.provider
            gen = c.create_provider(p.uuid, p.name, p.parent_uuid)
            cache.add(pt.Provider(p.uuid, p.name, p.parent_uuid, generation=gen))
            return
        if isinstance(op, pt.DeleteProvider):
            c.delete_provider(op.uuid)
            cache.remove(op.uuid)
            return
        if current is None:
            # Every other operation changes a provider the cache holds.
            raise KeyError(f"provider {op.uuid} is not in the cache")
        if isinstance(op, pt.UpdateProvider):
            gen = c.update_provider(op.uuid, op.name, op.parent_uuid)
            cache.replace(replace(current, name=op.name, parent_uuid=op.parent_uuid,
                                  generation=gen))
        elif isinstance(op, pt.SetTraits):
            gen = c.set_traits(op.uuid, current.generation, op.traits)
            cache.replace(replace(current, traits=op.traits, generation=gen))
        elif isinstance(op, pt.SetAggregates):
            gen = c.set_aggregates(op.uuid, current.generation, op.aggregates)
            cache.replace(replace(current, aggregates=op.aggregates, generation=gen))
        elif isinstance(op, pt.SetInventories):
            gen = c.set_inventories(op.uuid, current.generation, op.inventories)
            cache.replace(replace(current, inventories=op.inventories, generation=gen))

    def _write(self, op: pt.Operation, desired: pt.ProviderTree) -> int:
        """Apply one operation; on a lost race, re-read that provider and
        redo whatever is still needed, with backoff and jitter."""
        for attempt in range(self.attempts):
            try:
                self._do(op)
                return attempt + 1
            except GenerationConflict:
                if attempt == self.attempts - 1:
                    raise
                time.sleep(self.backoff * 2 ** attempt * random.uniform(0.5, 1.5))
                if isinstance(op, pt.CreateProvider):
                    continue  # nothing to re-read: the provider is not there yet
                old = self.cache[op.uuid]
                fresh = self._read_provider(old.uuid, old.name, old.parent_uuid)
                self.cache.replace(fresh)
                target = desired.get(op.uuid)
                redo = [o for o in pt.provider_diff(fresh, target,
                                                    pt.reported_traits(desired))
                        if type(o) is type(op)] if target else [op]
                if not redo:
                    return attempt + 1
                op = redo[0]
        raise AssertionError("unreachable")

    def _reshape(self, ops: list[pt.SetInventories]) -> int:
        """Many inventories in one atomic call, then one GET for the
        generations that Placement does not return."""
        self.client.reshape({op.uuid: (self.cache[op.uuid].generation,
                                       op.inventories) for op in ops})
        generations = {r["uuid"]: r["generation"]
                       for r in self.client.get_tree(self.root_uuid)}
        for op in ops:
            before = self.cache[op.uuid]
            LOG.info("Placement: %s", pt.describe(op, before))
            if op.uuid not in generations:
                # Deleted by another writer between the two calls: not
                # cached, so the next cycle creates it again.
                LOG.warning("Placement: provider %s (%s) was deleted by another writer "
                            "right after its inventory was written; it is created "
                            "again", before.name, op.uuid)
                self.cache.remove(op.uuid)
                continue
            self.cache.replace(replace(before, inventories=op.inventories,
                                       generation=generations[op.uuid]))
        return 2

    def _set_inventories(self, ops: list[pt.SetInventories],
                         desired: pt.ProviderTree, result: SyncResult) -> None:
        if len(ops) > 1:
            try:
                result.writes += self._reshape(ops)
                return
            except PlacementError as e:
                # One provider's refusal (inventory in use, no service
                # role) must not hold back the others: go one by one.
                LOG.info("Reshaper refused a batch of %d inventories (%s); "
                         "writing them one by one", len(ops), e)
                result.writes += 1
        for op in ops:
            try:
                result.writes += self._write(op, desired)
            except GenerationConflict:
                raise
            except PlacementError as e:
                result.warnings.append(f"inventory of {self.cache[op.uuid].name} "
                                       f"not updated: {e}")

    def _delete(self, op: pt.DeleteProvider, result: SyncResult) -> None:
        current = self.cache[op.uuid]
        generation, refused_at = self._kept.get(op.uuid, (None, 0.0))
        if (generation == current.generation
                and time.monotonic() - refused_at < self.kept_retry_seconds):
            return  # refused before, and too little has moved since
        try:
            self._do(op)
            result.writes += 1
            self._kept.pop(op.uuid, None)
            return
        except GenerationConflict:
            raise
        except PlacementError as e:
            result.writes += 1
            result.warnings.append(
                f"provider {op.name} is gone from the host but Placement keeps "
                f"it ({e.code or e.status}); it stays, fully reserved, until "
                "its allocations are removed")
        reserved = {rc: {**rec, "reserved": rec["total"]}
                    for rc, rec in current.inventories.items()}
        if reserved != current.inventories:
            result.writes += self._write(pt.SetInventories(op.uuid, reserved),
                                         pt.ProviderTree())
        self._kept[op.uuid] = (self.cache[op.uuid].generation, time.monotonic())

    def sync(self, desired: pt.ProviderTree) -> SyncResult:
        """Make Placement show ``desired``. Raises PlacementUnavailable when
        Placement cannot be reached; whatever was written stays cached."""
        self.refresh()
        desired = self.hold(self.cache, pt.adopt_uuids(desired, self.cache), self.owned)
        for uuid in list(self._kept):
            if uuid in desired:
                del self._kept[uuid]
        ops = pt.diff(self.cache, desired, self.owned)
        result = SyncResult(tree=desired)
        result.writes += self._ensure_names(ops)
        inventory_ops = [op for op in ops if isinstance(op, pt.SetInventories)]
        for op in ops:
            if isinstance(op, (pt.CreateProvider, pt.UpdateProvider,
                               pt.SetTraits, pt.SetAggregates)):
                result.writes += self._write(op, desired)
        self._set_inventories(inventory_ops, desired, result)
        for op in ops:
            if isinstance(op, pt.DeleteProvider):
                self._delete(op, result)
        for w in result.warnings:
            LOG.warning("%s", w)
        return result
