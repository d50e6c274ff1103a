"""The tracker's in-memory view of the claims, and a decision's change to
it as a value.

The view mirrors the store: read from it once, then changed only by the
changes the tracker's decisions make, each applied here as it is decided
and undone if its write fails. Nothing here locks: every call is made
under the tracker's one lock (compute/tracker.py).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from types import EllipsisType
from typing import TypeVar

from compute_agent.claims.choice import HeldDevices, Pool, Taken, choose, parse_allocations
from compute_agent.claims.model import (
    Assignment,
    AssignmentState,
    DeviceUse,
    Migration,
    Owner,
    RequestDigest,
)
from compute_agent.drivers.base import DeviceKind, HostResource
from compute_agent.exception import InvalidRequest
from compute_agent.store.assignment_id import new_assignment_id
from compute_agent.store.queries import (
    all_instances,
    all_migrations,
    delete_instance_sql,
    delete_migration_sql,
    device_uses,
    insert_assignments_sql,
    instance_requests,
    live_assignments,
    put_device_uses_sql,
    put_instance_sql,
    put_migration_sql,
    update_assignments_sql,
)
from compute_agent.store.store import Store
from compute_agent.store.writer import Statement

V = TypeVar("V")


@dataclass(frozen=True)
class InstanceRecord:
    """An instance's spec as recorded, and the build that made it (None: an
    instance that stays keeps its build's)."""

    uuid: str
    spec: dict
    built: RequestDigest | None = None


@dataclass(frozen=True)
class Change:
    """What one decision changes: the assignments it claims (new) and
    those it updates (released, passed between instance and migration,
    settled), the instance and the migration (a move's record) it records,
    and what it forgets. A one-time-use device among those claimed is
    marked used with it."""

    claimed: tuple[Assignment, ...] = ()
    updated: tuple[Assignment, ...] = ()
    recorded: InstanceRecord | None = None
    migration: Migration | None = None
    # An instance that leaves this host; its migrations stay unless named
    # in forgotten_migrations, so that a retried confirm still finds them.
    forgotten_instance: str | None = None
    forgotten_migrations: tuple[str, ...] = ()

    def write(self, marked: tuple[DeviceUse, ...]) -> list[Statement]:
        """The change as the store records it, ``marked`` the devices it
        marked used."""
        out: list[Statement] = []
        if self.recorded is not None:
            out.append(put_instance_sql(self.recorded.uuid, self.recorded.spec,
                                        self.recorded.built))
        if self.claimed:
            out.append(insert_assignments_sql(list(self.claimed)))
        if marked:
            out.append(put_device_uses_sql(list(marked)))
        if self.updated:
            out.append(update_assignments_sql(list(self.updated)))
        if self.migration is not None:
            out.append(put_migration_sql(self.migration))
        if self.forgotten_instance is not None:
            out.extend(delete_instance_sql(self.forgotten_instance, moves_too=False))
        out.extend(delete_migration_sql(uuid) for uuid in self.forgotten_migrations)
        return out


@dataclass(frozen=True)
class Applied:
    """A change as the view applied it: the devices it marked used, and
    what it replaced (None: nothing was there), which its undo puts back."""

    change: Change
    marked: tuple[DeviceUse, ...]
    replaced_rows: tuple[Assignment, ...]
    replaced_instances: dict[str, dict | None]
    replaced_builds: dict[str, RequestDigest | None]
    replaced_migrations: dict[str, Migration | None]


@dataclass(frozen=True)
class Decided:
    """What a decision answers, and the change it makes (None: nothing to
    change, a retry answered from the records)."""

    answer: object
    change: Change | None = None


class ClaimsView:
    def __init__(self, boot_id: str) -> None:
        self.boot_id = boot_id
        self.pools: dict[str, dict[str, Pool]] = {}
        self.held = HeldDevices()
        # What the guests on the host hold, whatever the store says: never
        # chosen (compute_agent/claims/veto.py). The manager reads the guests
        # before every claim; a tracker without a hypervisor (the store's
        # own tests) has none.
        self.vetoed: frozenset[HostResource] = frozenset()
        self.live: dict[str, Assignment] = {}
        self.by_instance: dict[str, set[str]] = defaultdict(set)
        self.instances: dict[str, dict] = {}
        # The build that made each instance, where one did (check_retry).
        self.built: dict[str, RequestDigest] = {}
        self.migrations: dict[str, Migration] = {}
        # Providers whose assignments changed since the tracker's last
        # take_touched_providers(): where Placement's allocations may have
        # changed too (compute_agent/placement/allocations.py).
        self.touched_providers: set[str] = set()
        # One-time-use devices not clean since a claim chose them, by
        # address: never chosen again until cleaned (compute_agent/cleaning/).
        self.uses: dict[str, DeviceUse] = {}
        # Moves on with each change that used or freed such a device.
        self.uses_moved = 0

    @classmethod
    def read(cls, store: Store, boot_id: str) -> ClaimsView:
        view = cls(boot_id)
        live, view.instances, view.built, view.migrations, view.uses = store.read(
            lambda c: (live_assignments(c), all_instances(c), instance_requests(c),
                       all_migrations(c), device_uses(c)))
        view.index(live)
        return view

    def index(self, rows: list[Assignment]) -> None:
        for a in rows:
            old = self.live.get(a.id)
            if old is not None:
                self.held.give_back([old])
            if a.state.live:
                self.live[a.id] = a
                self.by_instance[a.instance_uuid].add(a.id)
                self.held.take([a])
            else:
                self.live.pop(a.id, None)
                ids = self.by_instance.get(a.instance_uuid)
                if ids is not None:
                    ids.discard(a.id)
                    if not ids:
                        del self.by_instance[a.instance_uuid]

    def rows_of(self, instance_uuid: str, owner: Owner | None = None,
                migration_uuid: str | EllipsisType | None = ...) -> list[Assignment]:
        rows = [self.live[i] for i in sorted(self.by_instance.get(instance_uuid, ()))]
        return [a for a in rows
                if (owner is None or a.owner is owner)
                and (migration_uuid is ... or a.migration_uuid == migration_uuid)]

    def open_migration(self, instance_uuid: str) -> Migration | None:
        return next((m for m in self.migrations.values()
                     if m.instance_uuid == instance_uuid and m.open), None)

    def migrations_of(self, instance_uuid: str) -> tuple[str, ...]:
        return tuple(u for u, m in self.migrations.items()
                     if m.instance_uuid == instance_uuid)

    def migration(self, migration_uuid: str) -> Migration:
        m = self.migrations.get(migration_uuid)
        if m is None:
            raise InvalidRequest("migration_uuid", migration_uuid,
                                 "no such move on this host")
        return m

    def choose_rows(self, instance_uuid: str, allocations: dict, consumer: str,
                    migration_uuid: str | None) -> list[Assignment]:
        wanted = parse_allocations(allocations, self.pools)
        rows = [Assignment(new_assignment_id(), consumer, instance_uuid,
                           Owner.INSTANCE, migration_uuid, c.resource_class,
                           c.provider_uuid, c.kind, c.device_id, c.amount,
                           AssignmentState.CLAIMING, self.boot_id, c.detail)
                for c in choose(wanted, self.pools, Taken(self.held, self.vetoed, self.uses))]
        # The order every later answer uses, so a retry gets the same one.
        return sorted(rows, key=lambda a: a.id)

    def newly_used(self, rows: tuple[Assignment, ...]) -> tuple[DeviceUse, ...]:
        """The one-time-use devices among ``rows`` just chosen: each is
        used from now on, until cleaned."""
        out = []
        for a in rows:
            pool = self.pools.get(a.provider_uuid, {}).get(a.resource_class)
            if (pool is not None and a.device_id in pool.one_time_use
                    and a.device_id not in self.uses):
                out.append(DeviceUse(a.device_id))
        return tuple(out)

    def device_held(self, address: str) -> bool:
        return self.held.is_held(DeviceKind.PCI, address)

    def held_unrecorded(self) -> list[DeviceUse]:
        """The one-time-use devices held with no record of their use."""
        return [DeviceUse(a) for a in sorted({
            a for by_class in self.pools.values() for pool in by_class.values()
            for a in pool.one_time_use if a not in self.uses and self.device_held(a)})]

    # --- changes ----------------------------------------------------------

    def apply(self, change: Change) -> Applied:
        """Make ``change`` in the view now, before the next decision."""
        keys = {r.uuid for r in (change.recorded,) if r is not None}
        if change.forgotten_instance is not None:
            keys.add(change.forgotten_instance)
        migrations = set(change.forgotten_migrations) | (
            {change.migration.uuid} if change.migration is not None else set())
        applied = Applied(
            change, self.newly_used(change.claimed),
            tuple(self.live[a.id] for a in change.updated if a.id in self.live),
            {k: self.instances.get(k) for k in keys},
            {k: self.built.get(k) for k in keys},
            {k: self.migrations.get(k) for k in migrations})
        self.uses.update((u.address, u) for u in applied.marked)
        if applied.marked or any(a.device_id in self.uses and not a.state.live
                                 for a in change.updated):
            self.uses_moved += 1
        self.index([*change.claimed, *change.updated])
        self.touched_providers.update(a.provider_uuid
                                      for a in (*change.claimed, *change.updated))
        if change.recorded is not None:
            self.instances[change.recorded.uuid] = change.recorded.spec
            if change.recorded.built is not None:
                self.built[change.recorded.uuid] = change.recorded.built
        if change.forgotten_instance is not None:
            self.instances.pop(change.forgotten_instance, None)
            self.built.pop(change.forgotten_instance, None)
        if change.migration is not None:
            self.migrations[change.migration.uuid] = change.migration
        for uuid in change.forgotten_migrations:
            self.migrations.pop(uuid, None)
        return applied

    def undo(self, applied: Applied) -> None:
        """Take back a change whose write failed: only what it touched, for
        later changes may have changed the rest meanwhile."""
        self.index([a.with_(state=AssignmentState.RELEASED)
                    for a in applied.change.claimed])
        self.index(list(applied.replaced_rows))
        for u in applied.marked:
            self.uses.pop(u.address, None)
        put_back(applied.replaced_instances, self.instances)
        put_back(applied.replaced_builds, self.built)
        put_back(applied.replaced_migrations, self.migrations)


def put_back(replaced: Mapping[str, V | None], now: dict[str, V]) -> None:
    """What a change replaced, back in ``now`` (None: nothing was there)."""
    for key, value in replaced.items():
        if value is None:
            now.pop(key, None)
        else:
            now[key] = value
