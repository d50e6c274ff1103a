"""What ``compute-agent-manage tree`` reports (pure): the tree the agent
would report now beside Placement's, how they differ, and each class the
host is unhealed for with the consumers that hold it.

The discovered tree is the model (compute_agent/tree/host_tree.py) with the UUIDs
Placement already uses, and reserved-until-healed applied (compute_agent/heal/rules.py):
exactly what the next cycle would report. A difference is what that cycle
would change, by the ownership rules (compute_agent/tree/ownership.py): an operator's
``reserved`` on a device inventory and others' traits are kept, so they are
no difference; a provider in our tree that is not ours is listed apart.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from compute_agent.heal.rules import Owned, hold_unhealed
from compute_agent.tree import ownership
from compute_agent.tree.provider_tree import (
    INVENTORY_FIELDS,
    Provider,
    ProviderTree,
    normalized_inventories,
    reported_traits,
    tree_as_dicts,
)

# provider uuid -> consumer uuid -> {"resources": {class: amount}}, as
# ``GET /resource_providers/{uuid}/allocations`` gives it.
ProviderAllocations = Mapping[str, Mapping[str, Mapping]]


class TreeVerdict(enum.IntEnum):
    """The command's exit code."""

    IN_STEP = 0
    OUT_OF_STEP = 1  # differences, or unhealed
    UNKNOWN = 2  # a source could not be read: never "in step"


class Presence(str, enum.Enum):
    BOTH = "both"
    ONLY_DISCOVERED = "only_discovered"  # the agent would create it
    ONLY_PLACEMENT = "only_placement"  # the agent would delete it


@dataclass(frozen=True)
class FieldDifference:
    field: str
    placement: object
    discovered: object


@dataclass(frozen=True)
class InventoryDifference:
    resource_class: str
    # None: that side has no inventory of the class.
    placement: dict | None
    discovered: dict | None
    fields: tuple[FieldDifference, ...] = ()


@dataclass(frozen=True)
class ProviderDifference:
    uuid: str
    name: str
    presence: Presence
    # Name and parent, when they differ.
    attributes: tuple[FieldDifference, ...] = ()
    inventories: tuple[InventoryDifference, ...] = ()
    traits_added: frozenset[str] = frozenset()
    traits_removed: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Holder:
    consumer_uuid: str
    amount: int
    # The instance's name when the store knows the consumer.
    instance_name: str | None = None


@dataclass(frozen=True)
class UnhealedClass:
    """Allocations of a class left on a provider the model takes it off."""

    provider_uuid: str
    provider_name: str
    resource_class: str
    used: int
    holders: tuple[Holder, ...]


@dataclass
class TreeReport:
    placement: ProviderTree
    discovered: ProviderTree
    differences: list[ProviderDifference] = field(default_factory=list)
    unhealed: list[UnhealedClass] = field(default_factory=list)
    # Providers in our tree that another service owns: kept as they are.
    others: list[Provider] = field(default_factory=list)

    @property
    def verdict(self) -> TreeVerdict:
        return (TreeVerdict.OUT_OF_STEP if self.differences or self.unhealed
                else TreeVerdict.IN_STEP)

    def as_dict(self) -> dict:
        return {
            "in_step": self.verdict is TreeVerdict.IN_STEP,
            "placement": tree_as_dicts(self.placement),
            "discovered": tree_as_dicts(self.discovered),
            "differences": [_difference_dict(d) for d in self.differences],
            "unhealed": [{"resource_provider_uuid": u.provider_uuid,
                          "resource_provider_name": u.provider_name,
                          "resource_class": u.resource_class, "used": u.used,
                          "consumers": [{"consumer_uuid": h.consumer_uuid,
                                         "amount": h.amount,
                                         "instance_name": h.instance_name}
                                        for h in u.holders]}
                         for u in self.unhealed],
            "others": [{"uuid": p.uuid, "name": p.name} for p in self.others],
        }

    def describe(self) -> list[str]:
        """The differences, the unhealed classes, and a last line that
        sums them up."""
        lines = []
        if self.differences:
            lines.append("Differences (Placement -> what the agent would report):")
            lines += ["    " + line for d in self.differences
                      for line in _describe_difference(d)]
        if self.unhealed:
            lines.append("Unhealed (heal moves these allocations):")
            for u in self.unhealed:
                lines.append(f"    {u.resource_class} on {u.provider_name} "
                             f"[{u.provider_uuid}]: {u.used} used by "
                             f"{len(u.holders)} consumers")
                lines += [f"        {h.consumer_uuid} {h.amount}"
                          + (f" ({h.instance_name})" if h.instance_name else "")
                          for h in u.holders]
        lines += [f"Not the agent's, kept as they are: {p.name} [{p.uuid}]"
                  for p in self.others]
        lines.append(self.summary())
        return lines

    def summary(self) -> str:
        if self.verdict is TreeVerdict.IN_STEP:
            return "in step"
        classes = sorted({u.resource_class for u in self.unhealed})
        return (f"{len(self.differences)} providers differ; "
                f"unhealed for {', '.join(classes) if classes else 'no class'}")


def usages(allocations: ProviderAllocations) -> dict[str, dict[str, int]]:
    """Provider -> class -> amount allocated, summed over its consumers."""
    out: dict[str, dict[str, int]] = {}
    for uuid, consumers in allocations.items():
        used = out.setdefault(uuid, {})
        for body in consumers.values():
            for rc, n in body["resources"].items():
                used[rc] = used.get(rc, 0) + n
    return out


def compare(placement: ProviderTree, model: ProviderTree,
            allocations: ProviderAllocations, owned: Owned = lambda p: True,
            instance_names: Mapping[str, str | None] | None = None) -> TreeReport:
    """``model`` carries Placement's UUIDs (provider_tree.adopt_uuids);
    ``allocations`` covers at least every provider compute_agent.heal.rules.moving names."""
    held = hold_unhealed(placement, model, usages(allocations), owned)
    report = TreeReport(placement, held.tree)
    reported = reported_traits(held.tree)
    for p in held.tree.depth_first():
        found = provider_difference(placement.get(p.uuid), p, reported)
        if found is not None:
            report.differences.append(found)
    for p in placement.depth_first():
        if p.uuid in held.tree:
            continue
        if owned(p):
            report.differences.append(ProviderDifference(
                p.uuid, p.name, Presence.ONLY_PLACEMENT,
                inventories=tuple(InventoryDifference(rc, rec, None) for rc, rec
                                  in sorted(normalized_inventories(p.inventories).items())),
                traits_removed=p.traits))
        else:
            report.others.append(p)
    names = instance_names or {}
    for s in held.stranded:
        holders = tuple(
            Holder(consumer, body["resources"][s.resource_class], names.get(consumer))
            for consumer, body in sorted(allocations[s.provider_uuid].items())
            if body["resources"].get(s.resource_class))
        report.unhealed.append(UnhealedClass(s.provider_uuid, s.provider_name,
                                             s.resource_class, s.used, holders))
    return report


def provider_difference(current: Provider | None, desired: Provider,
                        reported: frozenset[str]) -> ProviderDifference | None:
    """What the agent would change in one provider (None: nothing);
    ``reported`` is every trait the desired tree reports."""
    if current is None:
        return ProviderDifference(
            desired.uuid, desired.name, Presence.ONLY_DISCOVERED,
            inventories=tuple(InventoryDifference(rc, None, rec) for rc, rec
                              in sorted(normalized_inventories(desired.inventories).items())),
            traits_added=desired.traits)
    attributes = tuple(FieldDifference(f, getattr(current, attr), getattr(desired, attr))
                       for f, attr in (("name", "name"),
                                       ("parent_provider_uuid", "parent_uuid"))
                       if getattr(current, attr) != getattr(desired, attr))
    inventories = inventory_differences(
        current.inventories,
        ownership.inventories_to_write(current.inventories, desired.inventories))
    traits = ownership.traits_to_write(current.traits, desired.traits, reported)
    found = ProviderDifference(desired.uuid, desired.name, Presence.BOTH, attributes,
                               inventories, traits - current.traits,
                               current.traits - traits)
    if not (attributes or inventories or found.traits_added or found.traits_removed):
        return None
    return found


def inventory_differences(placement: Mapping[str, Mapping], discovered: Mapping[str, Mapping]
                          ) -> tuple[InventoryDifference, ...]:
    """Class by class, field by field, as Placement stores them."""
    old, new = normalized_inventories(placement), normalized_inventories(discovered)
    out = []
    for rc in sorted(set(old) | set(new)):
        if rc not in old or rc not in new:
            out.append(InventoryDifference(rc, old.get(rc), new.get(rc)))
            continue
        fields = tuple(FieldDifference(f, old[rc][f], new[rc][f])
                       for f in INVENTORY_FIELDS if old[rc][f] != new[rc][f])
        if fields:
            out.append(InventoryDifference(rc, old[rc], new[rc], fields))
    return tuple(out)


def _difference_dict(d: ProviderDifference) -> dict:
    return {
        "uuid": d.uuid, "name": d.name, "presence": d.presence.value,
        "attributes": {f.field: {"placement": f.placement, "discovered": f.discovered}
                       for f in d.attributes},
        "inventories": {
            i.resource_class: {
                "placement": i.placement, "discovered": i.discovered,
                "fields": {f.field: {"placement": f.placement,
                                     "discovered": f.discovered} for f in i.fields}}
            for i in d.inventories},
        "traits_added": sorted(d.traits_added),
        "traits_removed": sorted(d.traits_removed),
    }


def _describe_difference(d: ProviderDifference) -> list[str]:
    head = f"{d.name} [{d.uuid}]"
    if d.presence is Presence.ONLY_DISCOVERED:
        return [f"{head}: not in Placement (the agent would create it)"]
    if d.presence is Presence.ONLY_PLACEMENT:
        return [f"{head}: only in Placement (the agent would delete it)"]
    lines = [f"{head}: {f.field} {f.placement} -> {f.discovered}" for f in d.attributes]
    for i in d.inventories:
        if i.discovered is None:
            change = "removed"
        elif i.placement is None:
            change = f"added, total {i.discovered['total']}"
        else:
            change = ", ".join(f"{f.field} {f.placement} -> {f.discovered}"
                               for f in i.fields)
        lines.append(f"{head}: inventory {i.resource_class} {change}")
    if d.traits_added or d.traits_removed:
        lines.append(f"{head}: traits " + " ".join(
            [f"+{t}" for t in sorted(d.traits_added)]
            + [f"-{t}" for t in sorted(d.traits_removed)]))
    return lines
