"""A Placement stand-in for the conductor's unit tests: the read side of
PlacementClient a move's source tree needs (providers with their parents
and traits, as GET /resource_providers answers them), and the
consumers' allocations, allocation candidates and the allocation writes
an evacuation and a live migration make. Every request is counted."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Held:
    """One consumer's allocations, as ``GET /allocations/{uuid}`` tells them."""

    allocations: dict[str, dict[str, int]]  # provider -> class -> amount
    consumer_type: str = "INSTANCE"
    generation: int = 1
    project_id: str = "p"
    user_id: str = "u"


@dataclass
class Placement:
    # uuid -> (name, parent, traits)
    providers: dict[str, tuple[str, str | None, frozenset[str]]] = field(default_factory=dict)
    consumers: dict[str, Held] = field(default_factory=dict)
    # The roots whose trees have room for what is asked, best first: every
    # allocation candidate lands on one of them.
    room: list[str] = field(default_factory=list)
    # Raised by the next allocation writes, one each.
    write_errors: list[Exception] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def add(self, uuid: str, name: str, parent: str | None = None,
            traits: frozenset[str] = frozenset()) -> str:
        self.providers[uuid] = (name, parent, traits)
        return uuid

    def root_of(self, uuid: str) -> str:
        parent = self.providers[uuid][1]
        return uuid if parent is None else self.root_of(parent)

    def _row(self, uuid: str) -> dict[str, Any]:
        # GET /resource_providers' fields (microversion 1.14+).
        name, parent, _ = self.providers[uuid]
        return {"uuid": uuid, "name": name, "generation": 1,
                "parent_provider_uuid": parent, "root_provider_uuid": self.root_of(uuid)}

    # --- providers ---------------------------------------------------------

    def get_tree(self, root_uuid: str) -> list[dict]:
        self.requests.append(f"GET /resource_providers?in_tree={root_uuid}")
        return [self._row(u) for u in self.providers if self.root_of(u) == root_uuid]

    def get_providers(self, **query: str) -> list[dict[str, Any]]:
        self.requests.append("GET /resource_providers?" + "&".join(
            f"{k}={v}" for k, v in sorted(query.items())))
        required = set(query.get("required", "").split(",")) - {""}
        return [self._row(u) for u, (name, _, traits) in self.providers.items()
                if self.root_of(u) == query.get("in_tree", self.root_of(u))
                and u == query.get("uuid", u) and name == query.get("name", name)
                and required <= traits]

    def get_traits(self, uuid: str) -> tuple[int, frozenset[str]]:
        self.requests.append(f"GET /resource_providers/{uuid}/traits")
        return 1, self.providers[uuid][2]

    # --- allocations -------------------------------------------------------

    def get_provider_allocations(self, uuid: str) -> dict[str, dict]:
        self.requests.append(f"GET /resource_providers/{uuid}/allocations")
        return {consumer: {"resources": dict(held.allocations[uuid])}
                for consumer, held in self.consumers.items() if uuid in held.allocations}

    def get_consumer_allocations(self, consumer: str) -> dict:
        self.requests.append(f"GET /allocations/{consumer}")
        held = self.consumers.get(consumer)
        if held is None:
            return {"allocations": {}}
        return {"allocations": {rp: {"resources": dict(res), "generation": 1}
                                for rp, res in held.allocations.items()},
                "consumer_generation": held.generation, "project_id": held.project_id,
                "user_id": held.user_id, "consumer_type": held.consumer_type}

    def post_allocations(self, body: dict) -> None:
        self.requests.append("POST /allocations")
        if self.write_errors:
            raise self.write_errors.pop(0)
        for consumer, doc in body.items():
            allocations = {rp: dict(a["resources"]) for rp, a in doc["allocations"].items()}
            if not allocations:
                self.consumers.pop(consumer, None)
                continue
            before = self.consumers.get(consumer)
            self.consumers[consumer] = Held(
                allocations, doc.get("consumer_type", "INSTANCE"),
                before.generation + 1 if before else 1, doc["project_id"], doc["user_id"])

    def get_allocation_candidates(self, query: list[tuple[str, str]]) -> dict:
        """One candidate on each root with room (restricted to the ``in_tree``
        asked), all of what is asked on its first NUMA cell, else on the
        root itself."""
        self.requests.append("GET /allocation_candidates?" + "&".join(
            f"{k}={v}" for k, v in query))
        wanted: dict[str, int] = {}
        for key, value in query:
            if key.startswith("resources"):
                for part in value.split(","):
                    rc, amount = part.split(":")
                    wanted[rc] = wanted.get(rc, 0) + int(amount)
        in_tree = {value for key, value in query if key.startswith("in_tree")}
        candidates, summaries = [], {}
        for root in self.room:
            if in_tree and root not in in_tree:
                continue
            cells = [u for u, (_, parent, traits) in self.providers.items()
                     if parent == root and "HW_NUMA_ROOT" in traits]
            home = cells[0] if cells else root
            candidates.append({"allocations": {home: {"resources": dict(wanted)}}})
            summaries[home] = {"root_provider_uuid": root}
        return {"allocation_requests": candidates, "provider_summaries": summaries}

    def allocations_of(self, consumer: str) -> dict[str, dict[str, int]] | None:
        """What ``consumer`` holds now, None when it holds nothing."""
        held = self.consumers.get(consumer)
        return None if held is None else held.allocations
