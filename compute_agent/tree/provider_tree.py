"""A pure model of a resource-provider tree and the diff between two trees.

``diff(current, desired)`` yields the fewest Placement operations that turn
``current`` (what Placement holds) into ``desired`` (what the host has),
changing only what the agent owns (``compute_agent.tree.ownership``):
others' traits and an operator's reserved on device inventories stay. It
does no I/O, so it is tested without Placement.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from compute_agent.tree import ownership

# Inventory fields as Placement names them; a record is a plain dict of them.
INVENTORY_FIELDS = ("total", "reserved", "min_unit", "max_unit", "step_size",
                    "allocation_ratio")
INVENTORY_DEFAULTS: dict[str, int | float] = {"reserved": 0, "min_unit": 1, "step_size": 1,
                                              "allocation_ratio": 1.0}

# One inventory record, as Placement's JSON has it: ints, but
# allocation_ratio a float. Read field by field everywhere, so its values
# are Any rather than a union every reader would have to narrow.
Inventory = dict[str, Any]


def inventory(total: int, **fields: int | float) -> Inventory:
    """One inventory record with Placement's defaults filled in."""
    record = {"total": total, **INVENTORY_DEFAULTS, "max_unit": total}
    record.update(fields)
    unknown = set(record) - set(INVENTORY_FIELDS)
    if unknown:
        raise ValueError(f"unknown inventory fields: {sorted(unknown)}")
    return record


def normalized_inventories(invs: Mapping[str, Mapping[str, Any]]) -> dict[str, Inventory]:
    """Compare inventories the way Placement stores them: every field set,
    ratios as floats."""
    out: dict[str, Inventory] = {}
    for rc, rec in invs.items():
        full: Inventory = {**INVENTORY_DEFAULTS, "max_unit": rec["total"], **rec}
        full = {k: full[k] for k in INVENTORY_FIELDS}
        full["allocation_ratio"] = float(full["allocation_ratio"])
        out[rc] = full
    return out


@dataclass
class Provider:
    uuid: str
    name: str
    parent_uuid: str | None = None
    inventories: dict[str, Inventory] = field(default_factory=dict)
    traits: frozenset[str] = frozenset()
    # None means "not managed": the agent leaves aggregates alone.
    aggregates: frozenset[str] | None = None
    generation: int | None = None


class ProviderTree:
    """Providers by UUID (and by name). Parents always precede children in
    iteration."""

    def __init__(self, providers: Iterable[Provider] = ()):
        self._by_uuid: dict[str, Provider] = {}
        self._by_name: dict[str, Provider] = {}
        for p in providers:
            self.add(p)

    def add(self, provider: Provider) -> None:
        if provider.uuid in self._by_uuid:
            raise ValueError(f"duplicate provider uuid {provider.uuid}")
        if provider.parent_uuid and provider.parent_uuid not in self._by_uuid:
            raise ValueError(f"provider {provider.name}: parent "
                             f"{provider.parent_uuid} is not in the tree")
        self._by_uuid[provider.uuid] = provider
        self._by_name[provider.name] = provider

    def replace(self, provider: Provider) -> None:
        self.remove(provider.uuid)
        self._by_uuid[provider.uuid] = provider
        self._by_name[provider.name] = provider

    def remove(self, uuid: str) -> None:
        old = self._by_uuid.pop(uuid, None)
        if old is not None and self._by_name.get(old.name) is old:
            del self._by_name[old.name]

    def get(self, uuid: str) -> Provider | None:
        return self._by_uuid.get(uuid)

    def __getitem__(self, uuid: str) -> Provider:
        """A provider the caller knows is in the tree; KeyError if not."""
        return self._by_uuid[uuid]

    def by_name(self, name: str) -> Provider | None:
        return self._by_name.get(name)

    def named(self, name: str) -> Provider:
        """A provider the caller knows is in the tree; KeyError if not."""
        return self._by_name[name]

    def __contains__(self, uuid: str) -> bool:
        return uuid in self._by_uuid

    def __iter__(self) -> Iterator[Provider]:
        return iter(list(self._by_uuid.values()))

    def __len__(self) -> int:
        return len(self._by_uuid)

    @property
    def root(self) -> Provider | None:
        return next((p for p in self if p.parent_uuid is None), None)

    def depth_first(self) -> list[Provider]:
        """Parents before children, children in name order."""
        children: dict[str | None, list[Provider]] = {}
        for p in self:
            parent = p.parent_uuid if p.parent_uuid in self._by_uuid else None
            children.setdefault(parent, []).append(p)
        out: list[Provider] = []

        def walk(parent: str | None) -> None:
            for child in sorted(children.get(parent, []), key=lambda p: p.name):
                out.append(child)
                walk(child.uuid)

        walk(None)
        return out

    @classmethod
    def parents_first(cls, providers: Iterable[Provider]) -> ProviderTree:
        """A tree from providers in any order. ValueError when one names a
        parent that is not among them, or the parents form a loop."""
        by_uuid = {p.uuid: p for p in providers}
        ordered: list[Provider] = []
        seen: set[str] = set()

        def place(p: Provider) -> None:
            if p.uuid in seen:
                return
            seen.add(p.uuid)
            parent = by_uuid.get(p.parent_uuid) if p.parent_uuid is not None else None
            if parent is not None:
                place(parent)
            ordered.append(p)

        for p in by_uuid.values():
            place(p)
        return cls(ordered)

    def copy(self) -> ProviderTree:
        return ProviderTree(dataclasses.replace(p) for p in self.depth_first())


def tree_as_dicts(tree: ProviderTree) -> list[dict[str, Any]]:
    """Parents first; plain JSON-compatible values, by Placement's field
    names, every inventory field shown."""
    return [{"uuid": p.uuid, "name": p.name, "parent_provider_uuid": p.parent_uuid,
             "generation": p.generation,
             "inventories": normalized_inventories(p.inventories),
             "traits": sorted(p.traits)} for p in tree.depth_first()]


def describe_inventory(rc: str, record: Mapping[str, Any]) -> str:
    """``VCPU=16 (reserved 2, allocation_ratio 4.0)``: what is not a default."""
    extras = [f"{k} {record[k]}" for k in ("reserved", "allocation_ratio")
              if record.get(k, INVENTORY_DEFAULTS[k]) != INVENTORY_DEFAULTS[k]]
    return f"{rc}={record['total']}" + (f" ({', '.join(extras)})" if extras else "")


def tree_lines(providers: list[dict[str, Any]]) -> list[str]:
    """A tree as ``tree_as_dicts`` gives it, indented under its parents."""
    depth: dict[str | None, int] = {}
    lines = []
    for p in providers:
        depth[p["uuid"]] = depth.get(p["parent_provider_uuid"], -1) + 1
        indent = "    " * depth[p["uuid"]]
        lines.append(f"{indent}{p['name']}  [{p['uuid']}] generation {p['generation']}")
        if p["inventories"]:
            lines.append(f"{indent}    inventory: " + ", ".join(
                describe_inventory(rc, rec) for rc, rec in sorted(p["inventories"].items())))
        if p["traits"]:
            lines.append(f"{indent}    traits: {', '.join(sorted(p['traits']))}")
    return lines


# --- operations ------------------------------------------------------------

@dataclass(frozen=True)
class CreateProvider:
    provider: Provider


@dataclass(frozen=True)
class UpdateProvider:
    """Rename or re-parent."""
    uuid: str
    name: str
    parent_uuid: str | None


@dataclass(frozen=True)
class SetInventories:
    uuid: str
    inventories: dict[str, Inventory]


@dataclass(frozen=True)
class SetTraits:
    uuid: str
    traits: frozenset[str]


@dataclass(frozen=True)
class SetAggregates:
    uuid: str
    aggregates: frozenset[str]


@dataclass(frozen=True)
class DeleteProvider:
    uuid: str
    name: str


Operation = (CreateProvider | UpdateProvider | SetInventories | SetTraits
             | SetAggregates | DeleteProvider)


def adopt_uuids(desired: ProviderTree, current: ProviderTree) -> ProviderTree:
    """A provider that already stands in the tree under the same name keeps
    the UUID it has, whatever UUID the builder derived for it."""
    rename: dict[str, str] = {}
    for p in desired:
        existing = current.by_name(p.name)
        if existing is not None and existing.uuid != p.uuid:
            rename[p.uuid] = existing.uuid
    if not rename:
        return desired
    return ProviderTree(
        dataclasses.replace(p, uuid=rename.get(p.uuid, p.uuid),
                            parent_uuid=(rename.get(p.parent_uuid, p.parent_uuid)
                                         if p.parent_uuid is not None else None))
        for p in desired.depth_first())


def reported_traits(tree: ProviderTree) -> frozenset[str]:
    """Every trait the tree reports, on any of its providers."""
    return frozenset().union(*(p.traits for p in tree))


def provider_diff(current: Provider | None, desired: Provider,
                  reported: frozenset[str] = frozenset()) -> list[Operation]:
    """Operations that make one provider match; ``current`` None creates it.
    ``reported`` is every trait the desired tree reports (see
    ``ownership.agent_owns_trait``)."""
    if current is None:
        ops: list[Operation] = [CreateProvider(desired)]
        if desired.inventories:
            ops.append(SetInventories(desired.uuid, desired.inventories))
        if desired.traits:
            ops.append(SetTraits(desired.uuid, desired.traits))
        if desired.aggregates:
            ops.append(SetAggregates(desired.uuid, desired.aggregates))
        return ops
    ops = []
    if (current.name, current.parent_uuid) != (desired.name, desired.parent_uuid):
        ops.append(UpdateProvider(desired.uuid, desired.name, desired.parent_uuid))
    inventories = ownership.inventories_to_write(current.inventories,
                                                 desired.inventories, current.traits)
    if (normalized_inventories(current.inventories)
            != normalized_inventories(inventories)):
        ops.append(SetInventories(desired.uuid, inventories))
    traits = ownership.traits_to_write(current.traits, desired.traits, reported)
    if current.traits != traits:
        ops.append(SetTraits(desired.uuid, traits))
    if desired.aggregates is not None and current.aggregates != desired.aggregates:
        ops.append(SetAggregates(desired.uuid, desired.aggregates))
    return ops


def diff(current: ProviderTree, desired: ProviderTree,
         owned: Callable[[Provider], bool] = lambda provider: True) -> list[Operation]:
    """Creates and updates parent-first, then deletes leaf-first.

    Only providers for which ``owned`` is true are deleted: others (a
    neutron agent's bandwidth providers, say) may live in our tree too."""
    ops: list[Operation] = []
    reported = reported_traits(desired)
    for p in desired.depth_first():
        ops.extend(provider_diff(current.get(p.uuid), p, reported))
    for p in reversed(current.depth_first()):
        if p.uuid not in desired and owned(p):
            ops.append(DeleteProvider(p.uuid, p.name))
    return ops


# --- what an operation changes, for the log ----------------------------------

def _inventory_changes(before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
                       ) -> list[str]:
    old, new = normalized_inventories(before), normalized_inventories(after)
    out = []
    for rc in sorted(set(old) | set(new)):
        if rc not in old:
            out.append(f"inventory {rc} added, total {new[rc]['total']}"
                       f" reserved {new[rc]['reserved']}")
        elif rc not in new:
            out.append(f"inventory {rc} removed")
        else:
            fields = [f"{f} {old[rc][f]}->{new[rc][f]}" for f in INVENTORY_FIELDS
                      if old[rc][f] != new[rc][f]]
            if fields:
                out.append(f"inventory {rc} " + " ".join(fields))
    return out


def _set_changes(what: str, before: frozenset[str], after: frozenset[str]) -> str:
    return what + " " + " ".join([f"+{t}" for t in sorted(after - before)]
                                 + [f"-{t}" for t in sorted(before - after)])


def describe(op: Operation, before: Provider | None) -> str:
    """One line naming the provider (name and uuid) and what ``op``
    changes in it; ``before`` is the provider as it stood (None for a
    create)."""
    if isinstance(op, CreateProvider):
        p = op.provider
        return (f"created provider {p.name} ({p.uuid})"
                + (f" under {p.parent_uuid}" if p.parent_uuid else " as a root"))
    name = before.name if before else getattr(op, "name", "?")
    head = f"provider {name} ({op.uuid}): "
    if isinstance(op, DeleteProvider):
        return f"deleted provider {op.name} ({op.uuid})"
    if isinstance(op, UpdateProvider):
        parts = []
        if before is None or before.name != op.name:
            parts.append(f"renamed to {op.name}")
        if before is None or before.parent_uuid != op.parent_uuid:
            parts.append(f"parent {before.parent_uuid if before else None}"
                         f"->{op.parent_uuid}")
        return head + ", ".join(parts)
    if isinstance(op, SetInventories):
        return head + ", ".join(_inventory_changes(
            before.inventories if before else {}, op.inventories))
    if isinstance(op, SetTraits):
        return head + _set_changes("traits", before.traits if before else frozenset(),
                                   op.traits)
    return head + _set_changes("aggregates", (before.aggregates or frozenset())
                               if before else frozenset(), op.aggregates)
