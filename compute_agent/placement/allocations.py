"""Allocations in Placement: which consumers hold allocations on our
providers, read only where something could have changed them
(AllocationView); every consumer's on a tree, read afresh
(tree_allocations); and one consumer's moved to another in one request,
nova's allocation swap (move_allocations).

Placement moves a provider's generation when allocations are written on
it, but not when they are deleted (``DELETE /allocations/{consumer}``), nor
on the provider a ``PUT /allocations/{consumer}`` moves a consumer away
from (an evacuation, a migration's confirm). So a provider's allocations
are read again when its generation moved since they were read, when a local
claim or release touched it (the conductor writes allocations just before
it asks us to claim), or when the last read found allocations and is older
than the refresh interval: the bound within which a deletion is seen.

The reads are saved in the store, and a restart starts from them
(``AllocationView.restore``): a provider whose generation has not moved is
not read again at once, and those that held allocations are read by age,
their reads spread over the refresh interval from the start, so that a
deletion made while the agent was down is seen within that interval and a
restart costs no read per provider.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from compute_agent.claims.model import Allocations
from compute_agent.exception import GenerationConflict
from compute_agent.placement.client import PlacementClient


def tree_allocations(client: PlacementClient, root_uuid: str) -> Allocations:
    """Every consumer's allocations over the providers Placement has in the
    tree of ``root_uuid``, read afresh: one GET for the tree and one per
    provider."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for provider in client.get_tree(root_uuid):
        for consumer, body in client.get_provider_allocations(provider["uuid"]).items():
            out.setdefault(consumer, {})[provider["uuid"]] = dict(body["resources"])
    return out


@dataclass(frozen=True)
class ProviderRead:
    """One provider's allocations as last read: its generation in the tree
    read before (never newer than the allocations read, so a change in
    between is read again next time), when, and each consumer's resources
    there (consumer -> class -> amount)."""

    generation: int | None  # None: the tree read had none for the provider
    allocations: Mapping[str, Mapping[str, int]]
    read_at: float

    @property
    def consumers(self) -> frozenset[str]:
        return frozenset(self.allocations)

    def usages(self) -> dict[str, int]:
        """What the consumers use of each class, as Placement's usages."""
        out: dict[str, int] = {}
        for resources in self.allocations.values():
            for resource_class, amount in resources.items():
                out[resource_class] = out.get(resource_class, 0) + amount
        return out


def needs_reading(last: ProviderRead | None, generation: int | None, touched: bool,
                  now: float, refresh_interval: float) -> bool:
    """Whether a provider's allocations may differ from those last read."""
    return (last is None or touched or last.generation != generation
            or refresh_due(last, now, refresh_interval))


def refresh_due(last: ProviderRead, now: float, refresh_interval: float) -> bool:
    """Whether a read is old enough to miss a deletion. A provider read
    without allocations has nothing to delete, and any allocation written
    on it since moves its generation: it is not read again by age (an idle
    empty host costs one request a cycle), except with a refresh interval
    of 0, which reads every provider every time."""
    return (now - last.read_at >= refresh_interval
            and (bool(last.allocations) or refresh_interval == 0))


def restored_read_times(holding: list[str], now: float, refresh_interval: float
                        ) -> dict[str, float]:
    """When each restored read of a provider holding allocations is taken
    to have been made: the k-th of n (in the given order) due by age at
    ``now + refresh_interval * k / n``, so that none is read at the start
    and all within one refresh interval of it (with an interval of 0,
    every one at once, as always)."""
    count = len(holding)
    return {uuid: now + refresh_interval * (k / count - 1)
            for k, uuid in enumerate(holding, start=1)}


class AllocationView:
    def __init__(self, client: PlacementClient, refresh_interval: float,
                 clock: Callable[[], float] = time.monotonic):
        self.client = client
        self.refresh_interval = refresh_interval
        self.clock = clock
        self.clear()

    def clear(self) -> None:
        """Forget every read (SIGHUP): the next answer reads every provider."""
        self._reads: dict[str, ProviderRead] = {}
        # Touched by a claim or release and not read since: kept across a
        # failed reconcile, so no hint is lost.
        self._touched: set[str] = set()

    def restore(self, saved: Mapping[str, tuple[int | None, Mapping[str, Mapping[str, int]]]]
                ) -> None:
        """Start from the reads an earlier run saved (``saved``: provider
        uuid -> generation, consumer -> class -> amount): each trusted while
        its provider's generation has not moved; those holding allocations
        read again by age, spread over the refresh interval from now
        (restored_read_times). A read without allocations needs none:
        whatever is written on its provider moves its generation."""
        now = self.clock()
        read_at = restored_read_times(sorted(u for u, (_, a) in saved.items() if a), now,
                                      self.refresh_interval)
        self._reads = {uuid: ProviderRead(generation, allocations, read_at.get(uuid, now))
                       for uuid, (generation, allocations) in saved.items()}

    def saved(self) -> dict[str, tuple[int | None, dict[str, dict[str, int]]]]:
        """The reads, to save for the next start (restore)."""
        return {uuid: (read.generation, {consumer: dict(resources) for consumer, resources
                                         in read.allocations.items()})
                for uuid, read in dict(self._reads).items()}

    def touch(self, providers: set[str]) -> None:
        """Claims or releases changed assignments on these providers."""
        self._touched |= providers

    def consumers(self, generations: Mapping[str, int | None], root_uuid: str
                  ) -> dict[str, set[str]] | None:
        """consumer uuid -> which of our providers it holds allocations on,
        for the providers of ``generations`` (uuid -> generation, from a
        read of our tree). None (unknown) when that read lacks our root: no
        providers read is not "no allocations". Raises PlacementUnavailable
        or PlacementError when a provider that needs reading cannot be read;
        what was read before then is kept."""
        if root_uuid not in generations:
            return None
        for gone in set(self._reads) - set(generations):
            del self._reads[gone]
        # A provider not in the tree has nothing to read; when it appears,
        # it is read as new.
        self._touched &= generations.keys()
        for uuid, generation in generations.items():
            self._read(uuid, generation)
        out: dict[str, set[str]] = {}
        for uuid, read in self._reads.items():
            for consumer in read.consumers:
                out.setdefault(consumer, set()).add(uuid)
        return out

    def usages(self, uuid: str, generation: int | None) -> dict[str, int]:
        """What the consumers on provider ``uuid`` use of each class, read
        under the same rule as ``consumers``: a usage read earlier can only
        be too high (a deletion not seen yet), never too low."""
        return self._read(uuid, generation).usages()

    def read_usages(self) -> dict[str, dict[str, int]]:
        """provider uuid -> what its consumers use of each class, as last
        read, for the providers read; no request. Safe from another thread
        (the metrics endpoint): the reads are copied first."""
        return {uuid: read.usages() for uuid, read in dict(self._reads).items()}

    def _read(self, uuid: str, generation: int | None) -> ProviderRead:
        now = self.clock()
        last = self._reads.get(uuid)
        if last is None or needs_reading(last, generation, uuid in self._touched, now,
                                         self.refresh_interval):
            resources = {consumer: dict(body["resources"]) for consumer, body
                         in self.client.get_provider_allocations(uuid).items()}
            last = self._reads[uuid] = ProviderRead(generation, resources, now)
            self._touched.discard(uuid)
        return last


def move_allocations(placement: PlacementClient, source_consumer: str,
                     target_consumer: str, target_type: str = "MIGRATION",
                     attempts: int = 4, replacement: dict | None = None) -> dict:
    """Move every allocation of one consumer to another in one
    ``POST /allocations``, guarded by both consumer generations: the
    instance's to its migration when a move starts (nova's allocation swap),
    and the migration's back to the instance on revert. Returns what moved.
    ``replacement``: the allocations the source consumer holds instead, in
    the same request (an evacuation's destination), none by default.
    """
    for attempt in range(attempts):
        source = placement.get_consumer_allocations(source_consumer)
        target = placement.get_consumer_allocations(target_consumer)
        moving = {rp: {"resources": a["resources"]}
                  for rp, a in source["allocations"].items()}
        body = {
            source_consumer: {
                "allocations": replacement or {}, "project_id": source["project_id"],
                "user_id": source["user_id"],
                "consumer_generation": source["consumer_generation"],
                "consumer_type": source.get("consumer_type", "INSTANCE")},
            target_consumer: {
                "allocations": moving, "project_id": source["project_id"],
                "user_id": source["user_id"],
                "consumer_generation": target.get("consumer_generation"),
                "consumer_type": target_type},
        }
        try:
            placement.post_allocations(body)
            return moving
        except GenerationConflict:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")
