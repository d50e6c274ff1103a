"""Reserved until healed, and the heal plan: pure rules, no I/O.

When the model moves a resource class off a provider (a switch between
any two tree modes, a pmem label regrouped, a device whose class changes) while consumers still
hold that class there, the host is *unhealed* for that class, and until
heal moves those allocations:

- the old provider keeps its inventory of the class exactly as Placement
  has it, so the allocations on it stay valid;
- every provider the model gives the class to reports it with
  ``reserved = total``;
- a device provider (neither the root nor a NUMA cell) that holds a
  stranded class reports all its model classes fully reserved too: it is
  the same device, counted under a new class.

So the free capacity Placement offers never exceeds what the host has. On a
host where nobody holds a moving class, the model goes live at once.
"Unhealed" is derived each time from Placement's usages, never from a flag.

Heal then moves every stranded allocation to the provider of the device the
instance really uses, and sets every affected inventory, in one
``POST /reshaper``: all of it applies, or none.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import os_traits

from compute_agent.claims.choice import Pool
from compute_agent.claims.model import Assignment, Migration
from compute_agent.drivers.base import DeviceKind
from compute_agent.heal.errors import HealRefused
from compute_agent.tree.provider_tree import Inventory, Provider, ProviderTree

# provider uuid -> resource class -> amount used (or allocated)
Usages = Mapping[str, Mapping[str, int]]
Owned = Callable[[Provider], bool]


# --- reserved until healed ----------------------------------------------------

@dataclass(frozen=True)
class Stranded:
    """Allocations of a class left on a provider where the model no longer
    puts that class."""

    provider_uuid: str
    provider_name: str
    resource_class: str
    used: int


def leaving(current: ProviderTree, model: ProviderTree,
            owned: Owned = lambda p: True) -> dict[str, frozenset[str]]:
    """Provider uuid -> the classes it carries in Placement that the model
    takes off it (the provider gone from the model takes all). Only
    providers the agent owns: others' inventories are not ours to move."""
    out = {}
    for p in current:
        if not owned(p):
            continue
        target = model.get(p.uuid)
        gone = frozenset(set(p.inventories) - set(target.inventories if target else ()))
        if gone:
            out[p.uuid] = gone
    return out


def moving(current: ProviderTree, model: ProviderTree,
           owned: Owned = lambda p: True) -> dict[str, frozenset[str]]:
    """The leaving classes that the model gives a new home: carried by
    another provider, or by the same device under a new class. A class with
    none left with its device: that is a device gone, which the sync keeps
    fully reserved while it is allocated."""
    homes = {rc for p in model for rc in p.inventories}
    out = {}
    for uuid, classes in leaving(current, model, owned).items():
        new = model.get(uuid)
        renamed = (new is not None and bool(new.inventories)
                   and is_device_provider(current[uuid]))
        kept = frozenset(classes if renamed else classes & homes)
        if kept:
            out[uuid] = kept
    return out


def stranded(current: ProviderTree, model: ProviderTree, usages: Usages,
             owned: Owned = lambda p: True) -> list[Stranded]:
    """The moving classes that someone still uses where they were."""
    out = []
    for uuid, classes in sorted(moving(current, model, owned).items()):
        for rc in sorted(classes):
            used = usages.get(uuid, {}).get(rc, 0)
            if used > 0:
                out.append(Stranded(uuid, current[uuid].name, rc, used))
    return out


def is_device_provider(p: Provider) -> bool:
    """One device's provider: neither the root nor a NUMA cell."""
    return p.parent_uuid is not None and os_traits.HW_NUMA_ROOT not in p.traits


def fully_reserved(record: Inventory) -> Inventory:
    return {**record, "reserved": record["total"]}


@dataclass
class Held:
    tree: ProviderTree
    stranded: list[Stranded] = field(default_factory=list)

    @property
    def unhealed_classes(self) -> frozenset[str]:
        return frozenset(s.resource_class for s in self.stranded)


def hold_unhealed(current: ProviderTree, model: ProviderTree, usages: Usages,
                  owned: Owned = lambda p: True) -> Held:
    """The tree to report: ``model``, with the new homes of every stranded
    class fully reserved and the old ones kept (module docstring)."""
    found = stranded(current, model, usages, owned)
    if not found:
        return Held(model)
    classes = {s.resource_class for s in found}
    renamed_devices = {s.provider_uuid for s in found
                       if is_device_provider(current[s.provider_uuid])}
    providers = {p.uuid: dataclasses.replace(p, inventories=dict(p.inventories))
                 for p in model.depth_first()}
    for p in providers.values():
        for rc, record in p.inventories.items():
            if rc in classes or p.uuid in renamed_devices:
                p.inventories[rc] = fully_reserved(record)
    for s in found:
        _keep_with_ancestors(s.provider_uuid, current, providers)
        providers[s.provider_uuid].inventories[s.resource_class] = dict(
            current[s.provider_uuid].inventories[s.resource_class])
    return Held(ProviderTree.parents_first(providers.values()), found)


def _keep_with_ancestors(uuid: str, current: ProviderTree,
                         providers: dict[str, Provider]) -> None:
    """A provider the model drops stays while it holds stranded classes,
    and so do its ancestors (Placement deletes no parent of a child); what
    they carry besides is unused, so it goes."""
    at: str | None = uuid
    while at is not None and at not in providers:
        old = current[at]
        providers[at] = dataclasses.replace(old, inventories={})
        at = old.parent_uuid


# --- the heal plan ------------------------------------------------------------

@dataclass(frozen=True)
class Consumer:
    """A consumer's complete allocations as ``GET /allocations/{uuid}``
    gives them: every provider, this host's or not."""

    uuid: str
    allocations: dict[str, dict[str, int]]  # provider -> class -> amount
    # None: Placement's answer named none (a consumer without allocations).
    project_id: str | None
    user_id: str | None
    generation: int | None
    consumer_type: str | None = None

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "allocations": {rp: {"resources": dict(res)}
                            for rp, res in sorted(self.allocations.items())},
            "project_id": self.project_id, "user_id": self.user_id,
            "consumer_generation": self.generation}
        if self.consumer_type is not None:
            out["consumer_type"] = self.consumer_type
        return out


@dataclass(frozen=True)
class Move:
    consumer_uuid: str
    amount: int
    from_provider: str
    from_class: str
    to_provider: str
    to_class: str
    why: str


@dataclass
class Plan:
    # provider uuid -> (its generation as read, the inventories to set)
    inventories: dict[str, tuple[int | None, dict[str, Inventory]]] = field(default_factory=dict)
    consumers: dict[str, Consumer] = field(default_factory=dict)
    moves: list[Move] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.moves

    def reshaper_allocations(self) -> dict[str, dict[str, Any]]:
        return {uuid: c.body() for uuid, c in sorted(self.consumers.items())}

    def as_dict(self) -> dict[str, Any]:
        return {
            "moves": [{**dataclasses.asdict(m),
                       "from_name": self.names.get(m.from_provider),
                       "to_name": self.names.get(m.to_provider)} for m in self.moves],
            "inventories": {uuid: {"name": self.names.get(uuid), "generation": gen,
                                   "inventories": inv}
                            for uuid, (gen, inv) in sorted(self.inventories.items())},
            "consumers": sorted(self.consumers),
        }

    def describe(self) -> list[str]:
        n = self.names.get
        lines = [f"{m.consumer_uuid}: {m.from_class} {m.amount} {n(m.from_provider)} -> "
                 f"{m.to_class} {m.amount} {n(m.to_provider)} ({m.why})"
                 for m in self.moves]
        for uuid, (_, inv) in sorted(self.inventories.items(), key=lambda kv: n(kv[0]) or ""):
            shown = ", ".join(f"{rc}={r['total']}" + (f" reserved {r['reserved']}"
                                                      if r.get("reserved") else "")
                              for rc, r in sorted(inv.items())) or "none"
            lines.append(f"inventory of {n(uuid)}: {shown}")
        return lines


def capacity(record: Mapping[str, Any]) -> int:
    """What Placement lets consumers allocate of one inventory."""
    return int((record["total"] - record.get("reserved", 0))
               * record.get("allocation_ratio", 1.0))


def open_move_of(consumer_uuid: str, migrations: Iterable[Migration]) -> Migration | None:
    """The open move a consumer (an instance or a migration) is part of."""
    return next((m for m in migrations if m.open and consumer_uuid
                 in (m.uuid, m.instance_uuid)), None)


class _Locator:
    """Where each device and each cell's counted classes sit in the model."""

    def __init__(self, pools: Mapping[str, Mapping[str, Pool]]):
        self.devices: dict[tuple[DeviceKind, str], tuple[str, str, int | None]] = {}
        self.counted: dict[tuple[str, int | None], str] = {}
        self.by_class: dict[str, list[str]] = defaultdict(list)
        self.counted_classes: set[str] = set()
        for uuid, by_rc in sorted(pools.items()):
            for rc, pool in sorted(by_rc.items()):
                self.by_class[rc].append(uuid)
                if pool.kind is DeviceKind.NUMA:
                    self.counted[(rc, pool.numa_node)] = uuid
                    self.counted_classes.add(rc)
                for slot in pool.slots:
                    self.devices[(pool.kind, slot.device_id)] = (uuid, rc, slot.numa_node)

    def counted_only(self, rc: str) -> bool:
        """Only amounts of ``rc`` are tracked (CPU, memory, disk): no device."""
        return rc in self.counted_classes

    def per_cell(self, rc: str) -> bool:
        """``rc`` is counted, and split among the NUMA cells."""
        return self.counted_only(rc) and len(self.by_class[rc]) > 1

    def device(self, a: Assignment) -> tuple[str, str, int | None] | None:
        return self.devices.get((a.kind, a.device_id))

    def cell_of(self, rows: list[Assignment]) -> tuple[int | None, str]:
        """The instance's NUMA cell: its pinned CPUs' first, then any of its
        devices'."""
        found = [(a, d) for a in rows
                 if (d := self.device(a)) is not None and d[2] is not None]
        for a, d in sorted(found, key=lambda ad: ad[0].kind is not DeviceKind.PCPU):
            return d[2], ("its pinned CPUs" if a.kind is DeviceKind.PCPU
                          else f"its device {a.device_id}")
        return None, ""


@dataclass
class Model:
    """What a heal plans from: Placement's tree as read, the model's tree,
    and the model's pools, by provider uuid."""

    current: ProviderTree
    tree: ProviderTree
    pools: dict[str, dict[str, Pool]]


def plan_heal(model: Model, consumers: Mapping[str, Consumer],
              assignments: Iterable[Assignment], migrations: Iterable[Migration],
              owned: Owned = lambda p: True) -> Plan:
    """One reshape that puts every stranded allocation where the model
    says, or HealRefused naming the first consumer that cannot be moved.

    ``consumers`` holds at least every consumer with allocations on a
    leaving class.

    A device's allocation goes to the provider of the device the store
    assigns the consumer; a class with a single provider in the model goes
    there (the root's VCPU and MEMORY_MB in flat and numa_devices modes).
    CPU and memory split among cells go to the instance's NUMA cell, taken
    from its pinned CPUs, else from its devices; an instance with neither goes by
    the even rule: instances in UUID order, each to the cell with the
    largest free share of what it needs."""
    current = model.current
    moves = moving(current, model.tree, owned)
    migrations = list(migrations)
    by_consumer: dict[str, list[Assignment]] = defaultdict(list)
    for a in assignments:
        by_consumer[a.consumer_uuid].append(a)
    planning = _Planning(Plan(names={p.uuid: p.name
                                     for p in list(current) + list(model.tree)}),
                         model.tree, _Locator(model.pools))
    plan, where = planning.plan, planning.where
    unplaced: list[tuple[Consumer, dict[str, tuple[str, int]]]] = []
    new_allocations: dict[str, dict[str, dict[str, int]]] = {}

    for uuid, consumer in sorted(consumers.items()):
        held = {(rp, rc): n for rp, res in consumer.allocations.items()
                for rc, n in res.items() if rc in moves.get(rp, ())}
        if not held:
            continue
        move = open_move_of(uuid, migrations)
        if move is not None:
            raise HealRefused(uuid, f"is in the middle of a {move.kind} "
                              f"(migration {move.uuid}); heal once it is over")
        allocations = {rp: dict(res) for rp, res in consumer.allocations.items()}
        counted: dict[str, tuple[str, int]] = {}
        rows = by_consumer.get(uuid, [])
        for (rp, rc), amount in sorted(held.items()):
            del allocations[rp][rc]
            if where.per_cell(rc):
                counted[rc] = (rp, amount)
                continue
            for to, to_rc, n, why in planning.targets(uuid, rp, rc, amount, rows):
                planning.place(Move(uuid, n, rp, rc, to, to_rc, why), allocations)
        new_allocations[uuid] = allocations
        if counted:
            cell, why = where.cell_of(rows)
            if cell is None:
                unplaced.append((consumer, counted))
            else:
                planning.place_counted(consumer.uuid, counted, cell, why, allocations)
    planning.place_evenly(unplaced, new_allocations)
    _check_fit(plan, model.tree, planning.placed)

    for uuid, allocations in new_allocations.items():
        c = consumers[uuid]
        plan.consumers[uuid] = dataclasses.replace(
            c, allocations={rp: res for rp, res in allocations.items() if res})
    _set_inventories(plan, current, model.tree)
    return plan


def _cells(where: _Locator) -> set[int]:
    return {cell for _, cell in where.counted if cell is not None}


@dataclass
class _Planning:
    """A heal plan in the making: the plan, the model's tree, where its
    devices and cells are, and the amount placed on each (provider, class)
    so far."""

    plan: Plan
    model: ProviderTree
    where: _Locator
    placed: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))

    def place(self, move: Move, allocations: dict[str, dict[str, int]]) -> None:
        """``move`` planned, and its amount added to the consumer's new
        ``allocations``."""
        self.plan.moves.append(move)
        to = allocations.setdefault(move.to_provider, {})
        to[move.to_class] = to.get(move.to_class, 0) + move.amount
        self.placed[(move.to_provider, move.to_class)] += move.amount

    def targets(self, consumer: str, rp: str, rc: str, amount: int,
                rows: list[Assignment]) -> list[tuple[str, str, int, str]]:
        """Where a held amount of a class that is not split by cell goes."""
        where, names = self.where, self.plan.names
        homes = where.by_class.get(rc, [])
        mine = [a for a in rows if a.provider_uuid == rp and a.resource_class == rc
                and a.kind is not DeviceKind.NUMA]
        if mine and not where.counted_only(rc):
            found = [(a, where.device(a)) for a in mine]
            kept = [(a, d) for a, d in found if d is not None]
            lost = [a.device_id for a, d in found if d is None]
            if lost or sum(a.amount for a in mine) != amount:
                raise HealRefused(consumer, f"holds {amount} {rc} on {names.get(rp, rp)} "
                                  f"but its devices {lost or [a.device_id for a in mine]} "
                                  "are not in the new model")
            out: dict[tuple[str, str], list[str]] = defaultdict(list)
            for a, (to, to_rc, _) in kept:
                out[(to, to_rc)].append(a.device_id)
            return [(to, to_rc, len(ids), f"device {', '.join(sorted(ids))}")
                    for (to, to_rc), ids in sorted(out.items())]
        if len(homes) == 1:
            return [(homes[0], rc, amount, f"the only provider of {rc}")]
        raise HealRefused(consumer, f"holds {amount} {rc} on {names.get(rp, rp)}, the "
                          f"store assigns it no device there, and {len(homes)} providers "
                          f"offer {rc} in the new model")

    def place_counted(self, consumer: str, counted: dict[str, tuple[str, int]], cell: int,
                      why: str, allocations: dict[str, dict[str, int]]) -> None:
        for rc, (rp, amount) in sorted(counted.items()):
            to = self.where.counted.get((rc, cell))
            if to is None:
                raise HealRefused(consumer, f"holds {amount} {rc} and belongs to NUMA "
                                  f"cell {cell} ({why}), which has no {rc}")
            self.place(Move(consumer, amount, rp, rc, to, rc, f"NUMA cell {cell}, from {why}"),
                       allocations)

    def place_evenly(self, unplaced: list[tuple[Consumer, dict[str, tuple[str, int]]]],
                     new_allocations: dict[str, dict[str, dict[str, int]]]) -> None:
        """The even rule: each instance whole to the cell with the largest free
        share of what it needs, instances in UUID order, ties to the lower cell."""
        placed = self.placed
        for consumer, counted in unplaced:
            best: tuple[float, int] | None = None
            for cell in sorted(_cells(self.where)):
                shares: list[float] = []
                for rc, (_, amount) in counted.items():
                    to = self.where.counted.get((rc, cell))
                    record = self.model[to].inventories.get(rc) if to else None
                    if to is None or not record or capacity(record) - placed[(to, rc)] < amount:
                        break  # the cell cannot take all of it
                    shares.append((capacity(record) - placed[(to, rc)] - amount)
                                  / capacity(record))
                else:
                    score = min(shares)
                    if best is None or score > best[0]:
                        best = (score, cell)
            if best is None:
                need = ", ".join(f"{n} {rc}" for rc, (_, n) in sorted(counted.items()))
                raise HealRefused(consumer.uuid, f"needs {need} and no NUMA cell has "
                                  "that much left: it does not fit in one cell")
            self.place_counted(consumer.uuid, counted, best[1], "the even rule",
                               new_allocations[consumer.uuid])


def _check_fit(plan: Plan, model: ProviderTree, placed: dict[tuple[str, str], int]) -> None:
    for (to, rc), amount in sorted(placed.items()):
        record = model[to].inventories[rc]
        if amount > capacity(record):
            who = next(m.consumer_uuid for m in reversed(plan.moves)
                       if (m.to_provider, m.to_class) == (to, rc))
            raise HealRefused(who, f"{amount} {rc} would be allocated on "
                              f"{plan.names.get(to)}, which offers {capacity(record)}")


def _set_inventories(plan: Plan, current: ProviderTree, model: ProviderTree) -> None:
    """Every provider a move touches, and every provider of the model that
    carries a moved class, gets the model's inventories (none when the
    model drops it): the reserved-until-healed holds end here."""
    touched = {m.from_provider for m in plan.moves} | {m.to_provider for m in plan.moves}
    classes = {m.from_class for m in plan.moves} | {m.to_class for m in plan.moves}
    for p in model:
        if p.uuid in touched or set(p.inventories) & classes:
            old = current.get(p.uuid)
            plan.inventories[p.uuid] = (old.generation if old else None, p.inventories)
    for uuid in touched:
        if model.get(uuid) is None:
            plan.inventories[uuid] = (current[uuid].generation, {})
