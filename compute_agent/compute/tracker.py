"""Claims: which concrete device each instance holds, recorded durably.

Every operation is a decision that the store runs in its writer thread,
just before the transaction that records it (compute_agent/store/writer.py):
decisions are made one at a time, in the order they were asked for, and
their writes reach the disk in that order. Each call returns only once its
write is on disk. The tracker's lock covers each decision and the
in-memory view, which readers share; it never covers Placement or
hypervisor I/O. Devices chosen by one decision are marked taken before
the next is made, so no interleaving of concurrent claims hands one device
out twice. Operations on one instance are serialized (a retry waits for
the first to land).

Moves follow nova's allocation-swap convention: during a move the
migration owns the source's devices and the instance owns the
destination's. A same-host resize therefore keeps both sets side by side.
"""
from __future__ import annotations

import threading
import time
import uuid as uuid_lib
from collections import defaultdict
from collections.abc import Callable, Container
from dataclasses import replace

from compute_agent.claims.choice import HeldDevices, InstanceSpec, Pool, choose, parse_allocations
from compute_agent.claims.model import (
    Assignment,
    AssignmentState,
    DeviceUse,
    Migration,
    MigrationRole,
    MigrationState,
    MoveKind,
    Owner,
    RequestDigest,
    UseState,
)
from compute_agent.claims.veto import vetoed_resources
from compute_agent.drivers.base import DeviceKind, GuestHolding, HostResource
from compute_agent.exception import InvalidRequest, MoveInProgress, NoSuchInstance, RetryMismatch
from compute_agent.metrics import Metrics
from compute_agent.moves.evacuation import evacuation_name_free_again
from compute_agent.store.assignment_id import new_assignment_id
from compute_agent.store.queries import (
    all_instances,
    all_migrations,
    delete_device_uses_sql,
    delete_instance_sql,
    delete_migration_sql,
    device_uses,
    insert_assignments_sql,
    instance_requests,
    live_assignments,
    put_device_uses_sql,
    put_instance_sql,
    put_migration_sql,
    realign_assignments_sql,
    update_assignments_sql,
)
from compute_agent.store.store import Store
from compute_agent.store.writer import Decision, Statement


def check_uuid(value, field_name: str) -> str:
    if isinstance(value, str):
        try:
            return str(uuid_lib.UUID(value))
        except ValueError:
            pass
    raise InvalidRequest(field_name, value, "must be a UUID")


def check_move_of(m: Migration, instance_uuid) -> Migration:
    """``m``, once it is checked to move the instance named: every move step
    asks this before anything else, for a move named with another
    instance's uuid is not this one's."""
    instance_uuid = check_uuid(instance_uuid, "instance_uuid")
    if m.instance_uuid != instance_uuid:
        raise InvalidRequest("instance_uuid", instance_uuid,
                             f"migration {m.uuid} moves instance {m.instance_uuid}")
    return m


def check_one_consumer(uuid: str, field_name: str, taken: Container[str],
                       taken_by: str) -> None:
    """An instance and a move never share a uuid on a host: each is a
    consumer of its own in Placement, and the store keys both by it. A
    call whose ``field_name`` names what is ``taken`` here as ``taken_by``
    is refused."""
    if uuid in taken:
        raise InvalidRequest(field_name, uuid, f"is {taken_by} on this host; an "
                             "instance and a move never share a uuid")


def check_retry(recorded: RequestDigest | None, asked: RequestDigest, uuid: str,
                what: str) -> None:
    """A call naming a record that an earlier call made is that call's
    retry, answered from the record, only when it asks the same; else
    RetryMismatch names the fields that differ. A record made before
    requests were recorded (store schema 6) cannot tell: it is answered
    as before, as its retry."""
    if recorded is None:
        return
    fields = recorded.differing(asked)
    if fields:
        raise RetryMismatch(uuid, fields, what)


class Tracker:
    def __init__(self, store: Store, boot_id: str, metrics: Metrics | None = None):
        self.store = store
        self.boot_id = boot_id
        # Claims by kind and result, and each decision's wait for the lock.
        self.metrics = metrics or Metrics()
        self._lock = threading.Lock()
        self._pools: dict[str, dict[str, Pool]] = {}
        self._held = HeldDevices()
        # What the guests on the host hold, whatever the store says: never
        # chosen (compute_agent/claims/veto.py). The manager reads the guests before
        # every claim; a tracker without a hypervisor (the store's own
        # tests) has none.
        self._vetoed: frozenset[HostResource] = frozenset()
        self._live: dict[str, Assignment] = {}
        self._by_instance: dict[str, set[str]] = defaultdict(set)
        self._instances: dict[str, dict] = {}
        # The build that made each instance, where one did (check_retry).
        self._built: dict[str, RequestDigest] = {}
        self._migrations: dict[str, Migration] = {}
        # Providers whose assignments changed since the last
        # take_touched_providers(): where Placement's allocations may have
        # changed too (compute_agent/placement/allocations.py).
        self._touched_providers: set[str] = set()
        # One-time-use devices not clean since a claim chose them, by
        # address: never chosen again until cleaned (compute_agent/cleaning/).
        self._uses: dict[str, DeviceUse] = {}
        # Told once a claim that used a one-time-use device, or a release
        # that left one unheld, is on disk: the update loop reports it out
        # of scheduling, the cleaner starts its cleaning (compute_agent/cleaning/).
        self.on_uses_changed: Callable[[], None] = lambda: None
        # Moves on with each decision that used or freed such a device.
        self._uses_moved = 0
        self._load()

    def _load(self) -> None:
        live, instances, built, migrations, uses = self.store.read(
            lambda c: (live_assignments(c), all_instances(c), instance_requests(c),
                       all_migrations(c), device_uses(c)))
        self._uses = uses
        self._instances = instances
        self._built = built
        self._migrations = migrations
        self._index(live)

    # --- in-memory view (call under the lock) --------------------------

    def _index(self, rows: list[Assignment]) -> None:
        for a in rows:
            old = self._live.get(a.id)
            if old is not None:
                self._held.give_back([old])
            if a.state.live:
                self._live[a.id] = a
                self._by_instance[a.instance_uuid].add(a.id)
                self._held.take([a])
            else:
                self._live.pop(a.id, None)
                ids = self._by_instance.get(a.instance_uuid)
                if ids is not None:
                    ids.discard(a.id)
                    if not ids:
                        del self._by_instance[a.instance_uuid]

    def _rows_of(self, instance_uuid: str, owner: Owner | None = None,
                 migration_uuid: str | type(...) | None = ...) -> list[Assignment]:
        rows = [self._live[i] for i in sorted(self._by_instance.get(instance_uuid, ()))]
        return [a for a in rows
                if (owner is None or a.owner is owner)
                and (migration_uuid is ... or a.migration_uuid == migration_uuid)]

    def _open_move(self, instance_uuid: str) -> Migration | None:
        return next((m for m in self._migrations.values()
                     if m.instance_uuid == instance_uuid and m.open), None)

    def _change(self, rows: list[Assignment], instances: dict | None = None,
                migration: Migration | None = None, forget_instance: str | None = None,
                new_rows: list[Assignment] = (), forget_moves: bool = False,
                withdrawn_move: str | None = None,
                built: RequestDigest | None = None) -> Decision:
        """Apply changes to the in-memory view now; return the decision
        that writes them and can undo them. ``withdrawn_move``: one move's
        record forgotten (the others of its instance kept); ``built``: the
        build that makes the instances (one) in ``instances``."""
        before_rows = [self._live[a.id] for a in rows if a.id in self._live]
        touched = set(instances or ()) | ({forget_instance} - {None})
        before_instances = {k: self._instances.get(k) for k in touched}
        before_built = {k: self._built.get(k) for k in touched}
        forgotten = [u for u, m in self._migrations.items()
                     if m.instance_uuid == forget_instance] if forget_moves else []
        forgotten += [withdrawn_move] if withdrawn_move in self._migrations else []
        moves_touched = set(forgotten) | ({migration.uuid} if migration else set())
        before_moves = {k: self._migrations.get(k) for k in moves_touched}
        marked = self._newly_used(new_rows)
        self._uses.update((u.address, u) for u in marked)
        if marked or any(a.device_id in self._uses and not a.state.live for a in rows):
            self._uses_moved += 1
        self._index(list(new_rows) + list(rows))
        self._touched_providers.update(a.provider_uuid for a in (*new_rows, *rows))
        if instances:
            self._instances.update(instances)
            if built is not None:
                self._built.update(dict.fromkeys(instances, built))
        if forget_instance:
            self._instances.pop(forget_instance, None)
            self._built.pop(forget_instance, None)
        if migration:
            self._migrations[migration.uuid] = migration
        for uuid in forgotten:
            del self._migrations[uuid]

        write: list[Statement] = []
        for uuid, spec in (instances or {}).items():
            write.append(put_instance_sql(uuid, spec, built))
        if new_rows:
            write.append(insert_assignments_sql(list(new_rows)))
        if marked:
            write.append(put_device_uses_sql(marked))
        if rows:
            write.append(update_assignments_sql(list(rows)))
        if migration:
            write.append(put_migration_sql(migration))
        if forget_instance:
            write.extend(delete_instance_sql(forget_instance, forget_moves))
        if withdrawn_move:
            write.append(delete_migration_sql(withdrawn_move))

        def undo():
            # Run by the store's writer when the write fails. Only what this
            # operation touched: others may have changed the rest meanwhile.
            with self._lock:
                for a in new_rows:
                    self._index([a.with_(state=AssignmentState.RELEASED)])
                self._index(before_rows)
                for u in marked:
                    self._uses.pop(u.address, None)
                for saved, live in ((before_instances, self._instances),
                                    (before_built, self._built),
                                    (before_moves, self._migrations)):
                    for key, value in saved.items():
                        if value is None:
                            live.pop(key, None)
                        else:
                            live[key] = value

        return Decision(None, write, undo)

    # --- the protocol every operation follows ---------------------------

    def _run(self, instance_uuid: str, decide: Callable[[], Decision]):
        """Have the store make the decision, under the lock, and return its
        result once its write is on disk; tell on_uses_changed then when
        the decision used or freed a one-time-use device."""
        asked = time.perf_counter()
        uses_moved = []

        def locked() -> Decision:
            with self._lock:
                self.metrics.waited_for_lock(asked)
                before = self._uses_moved
                decision = decide()
                uses_moved.append(self._uses_moved != before)
                return decision

        result = self.store.submit_decision(instance_uuid, locked).wait()
        if any(uses_moved):
            self.on_uses_changed()
        return result

    def _newly_used(self, rows: list[Assignment]) -> list[DeviceUse]:
        """The one-time-use devices among ``rows`` just chosen: each is
        used from now on, until cleaned."""
        out = []
        for a in rows:
            pool = self._pools.get(a.provider_uuid, {}).get(a.resource_class)
            if (pool is not None and a.device_id in pool.one_time_use
                    and a.device_id not in self._uses):
                out.append(DeviceUse(a.device_id))
        return out

    def set_pools(self, pools: dict[str, dict[str, Pool]]) -> None:
        """The devices behind each provider uuid, from the latest cycle."""
        with self._lock:
            self._pools = pools

    def pools(self) -> dict[str, dict[str, Pool]]:
        with self._lock:
            return self._pools

    def set_guests(self, guests: dict[str, GuestHolding]) -> None:
        """What every guest on the host holds, as the hypervisor last said."""
        vetoed = vetoed_resources(guests)
        with self._lock:
            self._vetoed = vetoed

    def _choose_rows(self, instance_uuid: str, allocations, consumer: str,
                     migration_uuid: str | None) -> list[Assignment]:
        wanted = parse_allocations(allocations, self._pools)
        rows = [Assignment(new_assignment_id(), consumer, instance_uuid,
                           Owner.INSTANCE, migration_uuid, c.resource_class,
                           c.provider_uuid, c.kind, c.device_id, c.amount,
                           AssignmentState.CLAIMING, self.boot_id, c.detail)
                for c in choose(wanted, self._pools, self._held, vetoed=self._vetoed,
                                used=self._uses)]
        # The order every later answer uses, so a retry gets the same one.
        return sorted(rows, key=lambda a: a.id)

    # --- builds and deletes ---------------------------------------------

    def claim_build(self, instance_uuid, spec, allocations) -> list[Assignment]:
        """Choose and record devices for a new instance (state claiming).
        A retry, the same spec and allocations, returns the same
        assignments (check_retry)."""
        def decide() -> Decision:
            check_one_consumer(instance_uuid, "instance_uuid", self._migrations,
                               "a move's uuid")
            existing = self._rows_of(instance_uuid)
            if instance_uuid in self._instances and existing:
                check_retry(self._built.get(instance_uuid), asked, instance_uuid,
                            f"instance {instance_uuid} was built here by an earlier call")
                return Decision(existing)
            rows = self._choose_rows(instance_uuid, allocations, instance_uuid, None)
            d = self._change([], {instance_uuid: spec.to_payload()}, new_rows=rows,
                             built=asked)
            d.result = rows
            return d

        with self.metrics.claim("build"):
            instance_uuid = check_uuid(instance_uuid, "instance_uuid")
            spec = InstanceSpec.from_payload(spec)
            asked = claim_request(spec, allocations)
            return self._run(instance_uuid, decide)

    def complete(self, instance_uuid: str, migration_uuid: str | None = None
                 ) -> list[Assignment]:
        """The guest has its devices: claiming -> claimed."""
        def decide() -> Decision:
            rows = self._rows_of(instance_uuid, Owner.INSTANCE, migration_uuid)
            todo = [a.with_(state=AssignmentState.CLAIMED) for a in rows
                    if a.state is AssignmentState.CLAIMING]
            if not todo:
                return Decision(rows)
            d = self._change(todo)
            d.result = self._rows_of(instance_uuid, Owner.INSTANCE, migration_uuid)
            return d

        return self._run(instance_uuid, decide)

    def release_instance(self, instance_uuid: str) -> list[Assignment]:
        """Give back every device of the instance, whatever owns it, and
        forget it. Releasing what is already gone is not an error."""
        instance_uuid = check_uuid(instance_uuid, "instance_uuid")

        def decide() -> Decision:
            rows = self._rows_of(instance_uuid)
            if not rows and instance_uuid not in self._instances:
                return Decision([])
            released = [a.with_(state=AssignmentState.RELEASED) for a in rows]
            d = self._change(released, forget_instance=instance_uuid, forget_moves=True)
            d.result = released
            return d

        return self._run(instance_uuid, decide)

    def rebind_boot(self, instance_uuid: str) -> None:
        """After a host reboot, once the instance's mdevs exist again: its
        assignments belong to this boot."""
        def decide() -> Decision:
            stale = [a.with_(boot_id=self.boot_id) for a in self._rows_of(instance_uuid)
                     if a.boot_id != self.boot_id]
            return self._change(stale) if stale else Decision(None)

        self._run(instance_uuid, decide)

    def realign(self, moves: list[tuple[Assignment, Assignment]]) -> list[Assignment]:
        """Rows moved to the provider and class their allocations now sit on
        (heal; compute_agent/heal/realign.py), all in one transaction. A row changed
        since ``old`` was read (released, say) is left as it is; returns
        the rows moved."""
        def decide() -> Decision:
            done = [(old, new) for old, new in moves if self._live.get(old.id) == old]
            if not done:
                return Decision([])
            self._index([new for _, new in done])
            self._touched_providers.update(a.provider_uuid for pair in done for a in pair)

            def undo():
                with self._lock:
                    self._index([old for old, _ in done])

            return Decision([new for _, new in done],
                            [realign_assignments_sql([new for _, new in done])],
                            undo)

        return self._run("realign", decide)

    # --- one-time-use devices --------------------------------------------

    def _device_held(self, address: str) -> bool:
        return self._held.is_held(DeviceKind.PCI, address)

    def device_uses(self) -> list[tuple[DeviceUse, bool]]:
        """Every one-time-use device not clean, by address, each with
        whether a live assignment still holds it."""
        with self._lock:
            return [(u, self._device_held(a)) for a, u in sorted(self._uses.items())]

    def awaiting_cleaning(self) -> list[str]:
        """The used devices no one holds any more, whose cleaning has not
        failed: what the cleaner runs its commands on."""
        with self._lock:
            return [a for a, u in sorted(self._uses.items())
                    if u.state is UseState.USED and not self._device_held(a)]

    def _held_unrecorded(self) -> list[DeviceUse]:
        """The one-time-use devices held with no record of their use."""
        return [DeviceUse(a) for a in sorted({
            a for by_class in self._pools.values() for pool in by_class.values()
            for a in pool.one_time_use if a not in self._uses and self._device_held(a)})]

    def mark_held_used(self) -> list[str]:
        """Record used every one-time-use device an instance holds with no
        record of its use: one held before its spec said one_time_use, or
        by a guest adopted from nova-compute. Its cleaning then follows its
        release, as for a device a claim chose. Returns their addresses,
        once on disk."""
        def decide() -> Decision:
            marked = self._held_unrecorded()
            if not marked:
                return Decision([])
            self._uses.update((u.address, u) for u in marked)
            self._uses_moved += 1

            def undo():
                with self._lock:
                    for u in marked:
                        self._uses.pop(u.address, None)

            return Decision([u.address for u in marked], [put_device_uses_sql(marked)],
                            undo)

        with self._lock:
            if not self._held_unrecorded():
                return []
        return self._run("device uses", decide)

    def _use_step(self, address: str, step: Callable[[DeviceUse], DeviceUse | None]
                  ) -> DeviceUse | None:
        """Change one used device's record: ``step`` answers its new use
        (None: clean, given back), or raises InvalidRequest. On disk
        before it returns."""
        def decide() -> Decision:
            before = self._uses.get(address)
            if before is None:
                raise InvalidRequest("address", address, "is not a used one-time-use "
                                     "device of this host")
            if self._device_held(address):
                raise InvalidRequest("address", address, "is held by an instance; a "
                                     "device is cleaned once its instance gave it back")
            after = step(before)
            if after is None:
                del self._uses[address]
                write = [delete_device_uses_sql([address])]
            else:
                self._uses[address] = after
                write = [put_device_uses_sql([after])]

            def undo():
                with self._lock:
                    self._uses[address] = before

            return Decision(after, write, undo)

        return self._run(f"device {address}", decide)

    def give_back_device(self, address: str) -> None:
        """The device is clean (its cleaning succeeded, or an operator
        cleaned it by hand): back in scheduling."""
        self._use_step(address, lambda use: None)

    def cleaning_failed(self, address: str, reason: str) -> DeviceUse:
        """Its cleaning failed: it stays out, with the reason, until
        cleaned again (``clean_again``) or released by an operator."""
        return self._use_step(address, lambda use: DeviceUse(address,
                                                             UseState.CLEANING_FAILED,
                                                             reason))

    def clean_again(self, address: str) -> DeviceUse:
        """An operator asks for the cleaning again: the device waits for it
        as after its use."""
        return self._use_step(address, lambda use: DeviceUse(address))

    # --- moves ----------------------------------------------------------

    def _migration(self, migration_uuid) -> Migration:
        migration_uuid = check_uuid(migration_uuid, "migration_uuid")
        m = self._migrations.get(migration_uuid)
        if m is None:
            raise InvalidRequest("migration_uuid", migration_uuid,
                                 "no such move on this host")
        return m

    def claim_move(self, kind: MoveKind, migration_uuid, instance_uuid, spec,
                   allocations) -> list[Assignment]:
        """The destination's claim for a resize, live migration or
        evacuation. On the same host, the instance's current devices pass
        to the migration in the same commit."""
        def decide() -> Decision:
            m = self._migrations.get(migration_uuid)
            if m is not None:
                check_move_of(m, instance_uuid)
            if m is not None and evacuation_name_free_again(
                    m, kind, instance_uuid in self._instances):
                m = None  # replaced by the new move's record below
            if m is not None and m.role is not MigrationRole.SOURCE:
                # A retry. After a confirm the devices kept are the
                # instance's own; a reverted move cannot be claimed again.
                if m.state is MigrationState.REVERTED:
                    raise InvalidRequest("migration_uuid", migration_uuid,
                                         "this move was reverted")
                check_retry(m.request, asked, migration_uuid,
                            f"move {migration_uuid} was claimed here by an earlier call")
                if m.state is MigrationState.CONFIRMED:
                    return Decision(self._rows_of(instance_uuid, Owner.INSTANCE))
                return Decision(self._rows_of(instance_uuid, Owner.INSTANCE,
                                              migration_uuid))
            check_one_consumer(migration_uuid, "migration_uuid", self._instances,
                               "an instance's uuid")
            check_one_consumer(instance_uuid, "instance_uuid", self._migrations,
                               "a move's uuid")
            other = self._open_move(instance_uuid)
            if other is not None and other.uuid != migration_uuid:
                raise MoveInProgress(instance_uuid, other.uuid)
            rows = self._choose_rows(instance_uuid, allocations, instance_uuid,
                                     migration_uuid)
            if kind is MoveKind.EVACUATION and instance_uuid in self._instances:
                raise InvalidRequest("instance_uuid", instance_uuid,
                                     "is already on this host; an evacuation "
                                     "rebuilds it on another")
            current = [] if kind is MoveKind.EVACUATION else [
                a for a in self._rows_of(instance_uuid, Owner.INSTANCE)
                if a.migration_uuid != migration_uuid]
            same_host = bool(current) or m is not None
            passed = [a.with_(owner=Owner.MIGRATION, consumer_uuid=migration_uuid,
                              migration_uuid=migration_uuid) for a in current]
            old_spec = self._instances.get(instance_uuid) if same_host else None
            move = Migration(migration_uuid, instance_uuid, kind,
                             MigrationRole.BOTH if same_host
                             else MigrationRole.DESTINATION,
                             MigrationState.ACTIVE, old_spec, asked)
            d = self._change(passed, {instance_uuid: spec.to_payload()}, move,
                             new_rows=rows)
            d.result = rows
            return d

        with self.metrics.claim(kind.value):
            migration_uuid = check_uuid(migration_uuid, "migration_uuid")
            instance_uuid = check_uuid(instance_uuid, "instance_uuid")
            spec = InstanceSpec.from_payload(spec)
            asked = claim_request(spec, allocations)
            return self._run(instance_uuid, decide)

    def announce_move_source(self, kind: MoveKind, migration_uuid, instance_uuid,
                             asked: RequestDigest) -> Migration:
        """The source is told of a move before anything moves: the record
        (state ANNOUNCED) makes the instance this move's, so that a restart
        before the move starts neither gives it up nor finds the
        migration's allocations unexplained. Its devices stay the
        instance's. A retry, asking the same (``asked``: what the
        announcement says, where to), answers the record as it is now."""
        migration_uuid = check_uuid(migration_uuid, "migration_uuid")
        instance_uuid = check_uuid(instance_uuid, "instance_uuid")

        def decide() -> Decision:
            m = self._migrations.get(migration_uuid)
            if m is not None:
                check_move_of(m, instance_uuid)
                check_retry(m.request, asked, migration_uuid,
                            f"move {migration_uuid} was announced here by an earlier "
                            "call")
                return Decision(m)
            check_one_consumer(migration_uuid, "migration_uuid", self._instances,
                               "an instance's uuid")
            if instance_uuid not in self._instances:
                raise NoSuchInstance(instance_uuid)
            other = self._open_move(instance_uuid)
            if other is not None:
                raise MoveInProgress(instance_uuid, other.uuid)
            move = Migration(migration_uuid, instance_uuid, kind, MigrationRole.SOURCE,
                             MigrationState.ANNOUNCED, self._instances[instance_uuid],
                             asked)
            d = self._change([], migration=move)
            d.result = move
            return d

        return self._run(instance_uuid, decide)

    def begin_move_source(self, kind: MoveKind, migration_uuid, instance_uuid
                          ) -> list[Assignment]:
        """The source's half: the instance's devices pass to the migration
        (an announced move starts here)."""
        migration_uuid = check_uuid(migration_uuid, "migration_uuid")
        instance_uuid = check_uuid(instance_uuid, "instance_uuid")

        def decide() -> Decision:
            m = self._migrations.get(migration_uuid)
            if m is not None:
                check_move_of(m, instance_uuid)
            if m is not None and m.state is not MigrationState.ANNOUNCED:
                return Decision(self._rows_of(instance_uuid, Owner.MIGRATION,
                                              migration_uuid))
            check_one_consumer(migration_uuid, "migration_uuid", self._instances,
                               "an instance's uuid")
            if instance_uuid not in self._instances:
                raise NoSuchInstance(instance_uuid)
            other = self._open_move(instance_uuid)
            if other is not None and other.uuid != migration_uuid:
                raise MoveInProgress(instance_uuid, other.uuid)
            passed = [a.with_(owner=Owner.MIGRATION, consumer_uuid=migration_uuid,
                              migration_uuid=migration_uuid)
                      for a in self._rows_of(instance_uuid, Owner.INSTANCE)]
            # An announced move keeps what its announcement asked; one that
            # starts here unannounced asked nothing a retry could change.
            move = Migration(migration_uuid, instance_uuid, kind, MigrationRole.SOURCE,
                             MigrationState.ACTIVE, self._instances[instance_uuid],
                             None if m is None else m.request)
            d = self._change(passed, migration=move)
            d.result = passed
            return d

        return self._run(instance_uuid, decide)

    def _move_step(self, migration_uuid, step: Callable[[Migration], Decision]):
        with self._lock:
            m = self._migration(migration_uuid)
        return self._run(m.instance_uuid, lambda: step(self._migration(m.uuid)))

    def finish_move(self, migration_uuid) -> list[Assignment]:
        """The destination's guest runs with its new devices."""
        def step(m: Migration) -> Decision:
            rows = self._rows_of(m.instance_uuid, Owner.INSTANCE, m.uuid)
            if m.state is not MigrationState.ACTIVE or m.role is MigrationRole.SOURCE:
                return Decision(rows)
            done = [a.with_(state=AssignmentState.CLAIMED) for a in rows]
            d = self._change(done, migration=_with_state(m, MigrationState.FINISHED))
            d.result = done
            return d

        return self._move_step(migration_uuid, step)

    def confirm_move(self, migration_uuid) -> list[Assignment]:
        """Give back the source's devices (those the migration owns)."""
        def step(m: Migration) -> Decision:
            if m.state in (MigrationState.CONFIRMED, MigrationState.REVERTED):
                return Decision([])
            released = [a.with_(state=AssignmentState.RELEASED)
                        for a in self._rows_of(m.instance_uuid, Owner.MIGRATION, m.uuid)]
            # The devices the instance keeps no longer belong to a move.
            kept = [a.with_(migration_uuid=None)
                    for a in self._rows_of(m.instance_uuid, Owner.INSTANCE, m.uuid)]
            gone = m.role is MigrationRole.SOURCE
            d = self._change(released + kept,
                             migration=_with_state(m, MigrationState.CONFIRMED),
                             forget_instance=m.instance_uuid if gone else None)
            d.result = released
            return d

        return self._move_step(migration_uuid, step)

    def revert_move(self, migration_uuid) -> list[Assignment]:
        """Give back the new devices and return the old ones to the
        instance, on whichever side of the move this host is."""
        def step(m: Migration) -> Decision:
            if m.state in (MigrationState.CONFIRMED, MigrationState.REVERTED):
                return Decision(self._rows_of(m.instance_uuid, Owner.INSTANCE))
            released = [a.with_(state=AssignmentState.RELEASED)
                        for a in self._rows_of(m.instance_uuid, Owner.INSTANCE, m.uuid)]
            returned = [a.with_(owner=Owner.INSTANCE, consumer_uuid=m.instance_uuid,
                                migration_uuid=None)
                        for a in self._rows_of(m.instance_uuid, Owner.MIGRATION, m.uuid)]
            gone = m.role is MigrationRole.DESTINATION
            restore = {m.instance_uuid: m.old_spec} if m.old_spec and not gone else None
            d = self._change(released + returned, restore,
                             _with_state(m, MigrationState.REVERTED),
                             forget_instance=m.instance_uuid if gone else None)
            d.result = returned
            return d

        return self._move_step(migration_uuid, step)

    def withdraw_move(self, migration_uuid) -> list[Assignment]:
        """A destination's claim refused within the call that made it (the
        live migration's pre-check): its devices, its record and the
        instance it brought go, so the store is as before the call, as for
        any refused call. A later ask of the same move starts afresh."""
        def step(m: Migration) -> Decision:
            if m.role is not MigrationRole.DESTINATION or m.state is not MigrationState.ACTIVE:
                raise InvalidRequest("migration_uuid", m.uuid,
                                     "only a destination's open claim is withdrawn")
            released = [a.with_(state=AssignmentState.RELEASED)
                        for a in self._rows_of(m.instance_uuid, Owner.INSTANCE, m.uuid)]
            d = self._change(released, forget_instance=m.instance_uuid,
                             withdrawn_move=m.uuid)
            d.result = released
            return d

        return self._move_step(migration_uuid, step)

    # --- views ----------------------------------------------------------

    def held_by_class(self) -> dict[tuple[str, str], int]:
        """(resource class, assignment state) -> units that live
        assignments hold."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        with self._lock:
            for a in self._live.values():
                out[(a.resource_class, a.state.value)] += a.amount
        return dict(out)

    def holds(self, kind: DeviceKind, device_id: str) -> bool:
        """Whether a live assignment holds the device."""
        with self._lock:
            return self._held.is_held(kind, device_id)

    def take_touched_providers(self) -> set[str]:
        """The providers whose assignments changed since the last call."""
        with self._lock:
            touched, self._touched_providers = self._touched_providers, set()
            return touched

    def migration(self, migration_uuid) -> Migration:
        with self._lock:
            return self._migration(migration_uuid)

    def instance_count(self) -> int:
        """How many instances this host holds; read without the lock (a
        heartbeat must not wait for a claim)."""
        return len(self._instances)

    def knows(self, instance_uuid) -> bool:
        instance_uuid = check_uuid(instance_uuid, "instance_uuid")
        with self._lock:
            return instance_uuid in self._instances

    def instance(self, instance_uuid) -> tuple[dict, list[Assignment], list[Migration]]:
        instance_uuid = check_uuid(instance_uuid, "instance_uuid")
        with self._lock:
            if instance_uuid not in self._instances:
                raise NoSuchInstance(instance_uuid)
            return (dict(self._instances[instance_uuid]), self._rows_of(instance_uuid),
                    [m for m in self._migrations.values()
                     if m.instance_uuid == instance_uuid])

    def snapshot(self) -> tuple[dict[str, dict], list[Assignment], dict[str, Migration]]:
        with self._lock:
            return (dict(self._instances), sorted(self._live.values(), key=lambda a: a.id),
                    dict(self._migrations))


def _with_state(m: Migration, new_state: MigrationState) -> Migration:
    return replace(m, state=new_state)


def claim_request(spec: InstanceSpec, allocations) -> RequestDigest:
    """What a claim asks, as its record keeps it: the spec and the
    allocations (keyed by provider uuids in lower case, as the RPC layer
    passes them)."""
    return RequestDigest.of(spec=spec.to_payload(), allocations=allocations)
