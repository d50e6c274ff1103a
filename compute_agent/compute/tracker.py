"""Claims: which concrete device each instance holds, recorded durably.

Every operation is a decision that the store runs in its writer thread,
just before the transaction that records it (compute_agent/store/writer.py):
decisions are made one at a time, in the order they were asked for, and
their writes reach the disk in that order. Each call returns only once its
write is on disk. The tracker's lock covers each decision and the
in-memory view (compute/claims_view.py), which readers share; it never
covers Placement or hypervisor I/O. Devices chosen by one decision are
marked taken before the next is made, so no interleaving of concurrent
claims hands one device out twice. Operations on one instance are
serialized (a retry waits for the first to land).

A decision answers, and says what it changes as a value (claims_view.Change),
which the view applies at once and takes back if its write fails. The
decisions for moves are in compute/move_claims.py.
"""
from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from typing import Any

from compute_agent.claims.choice import InstanceSpec, Pool
from compute_agent.claims.model import (
    Assignment,
    AssignmentState,
    DeviceUse,
    Migration,
    MoveKind,
    Owner,
    RequestDigest,
    UseState,
)
from compute_agent.claims.veto import vetoed_resources
from compute_agent.compute import move_claims
from compute_agent.compute.checks import check_one_consumer, check_retry, check_uuid
from compute_agent.compute.claims_view import Applied, Change, ClaimsView, Decided, InstanceRecord
from compute_agent.drivers.base import DeviceKind, GuestHolding
from compute_agent.exception import InvalidRequest, NoSuchInstance
from compute_agent.metrics import Metrics
from compute_agent.store.queries import delete_device_uses_sql, put_device_uses_sql, realign_assignments_sql
from compute_agent.store.store import Store
from compute_agent.store.writer import Decision


class Tracker:
    def __init__(self, store: Store, boot_id: str, metrics: Metrics | None = None) -> None:
        self.store = store
        self.boot_id = boot_id
        # Claims by kind and result, and each decision's wait for the lock.
        self.metrics = metrics or Metrics()
        self._lock = threading.Lock()
        self._view = ClaimsView.read(store, boot_id)
        # Told once a claim that used a one-time-use device, or a release
        # that left one unheld, is on disk: the update loop reports it out
        # of scheduling, the cleaner starts its cleaning (compute_agent/cleaning/).
        self.on_uses_changed: Callable[[], None] = lambda: None

    # --- the protocol every operation follows ---------------------------

    def _run(self, instance_uuid: str, decide: Callable[[], Decision]) -> Any:
        """Have the store make the decision, under the lock, and return its
        result once its write is on disk; tell on_uses_changed then when
        the decision used or freed a one-time-use device."""
        asked = time.perf_counter()
        uses_moved = []

        def locked() -> Decision:
            with self._lock:
                self.metrics.waited_for_lock(asked)
                before = self._view.uses_moved
                decision = decide()
                uses_moved.append(self._view.uses_moved != before)
                return decision

        result = self.store.submit_decision(instance_uuid, locked).wait()
        if any(uses_moved):
            self.on_uses_changed()
        return result

    def _decision(self, decided: Decided) -> Decision:
        """The decision as the store runs it: its change applied to the view
        now, written next, and undone if the write fails."""
        if decided.change is None:
            return Decision(decided.answer)
        applied = self._view.apply(decided.change)
        return Decision(decided.answer, decided.change.write(applied.marked),
                        partial(self._undo, applied))

    def _undo(self, applied: Applied) -> None:
        # Run by the store's writer when the write fails.
        with self._lock:
            self._view.undo(applied)

    def set_pools(self, pools: dict[str, dict[str, Pool]]) -> None:
        """The devices behind each provider uuid, from the latest cycle."""
        with self._lock:
            self._view.pools = pools

    def pools(self) -> dict[str, dict[str, Pool]]:
        with self._lock:
            return self._view.pools

    def set_guests(self, guests: dict[str, GuestHolding]) -> None:
        """What every guest on the host holds, as the hypervisor last said."""
        vetoed = vetoed_resources(guests)
        with self._lock:
            self._view.vetoed = vetoed

    # --- builds and deletes ---------------------------------------------

    def claim_build(self, instance_uuid: str, spec: dict, allocations: dict
                    ) -> list[Assignment]:
        """Choose and record devices for a new instance (state claiming).
        A retry, the same spec and allocations, returns the same
        assignments (check_retry)."""
        def decide() -> Decision:
            view = self._view
            check_one_consumer(instance_uuid, "instance_uuid", view.migrations,
                               "a move's uuid")
            existing = view.rows_of(instance_uuid)
            if instance_uuid in view.instances and existing:
                check_retry(view.built.get(instance_uuid), asked, instance_uuid,
                            f"instance {instance_uuid} was built here by an earlier call")
                return Decision(existing)
            rows = view.choose_rows(instance_uuid, allocations, instance_uuid, None)
            return self._decision(Decided(rows, Change(
                claimed=tuple(rows),
                recorded=InstanceRecord(instance_uuid, claimed_spec.to_payload(), asked))))

        with self.metrics.claim("build"):
            instance_uuid = check_uuid(instance_uuid, "instance_uuid")
            claimed_spec = InstanceSpec.from_payload(spec)
            asked = claim_request(claimed_spec, allocations)
            return self._run(instance_uuid, decide)

    def complete(self, instance_uuid: str, migration_uuid: str | None = None
                 ) -> list[Assignment]:
        """The guest has its devices: claiming -> claimed."""
        def decide() -> Decision:
            rows = self._view.rows_of(instance_uuid, Owner.INSTANCE, migration_uuid)
            todo = [a.with_(state=AssignmentState.CLAIMED) for a in rows
                    if a.state is AssignmentState.CLAIMING]
            if not todo:
                return Decision(rows)
            d = self._decision(Decided(None, Change(updated=tuple(todo))))
            # Answered as the view holds them once changed.
            d.result = self._view.rows_of(instance_uuid, Owner.INSTANCE, migration_uuid)
            return d

        return self._run(instance_uuid, decide)

    def release_instance(self, instance_uuid: str) -> list[Assignment]:
        """Give back every device of the instance, whatever owns it, and
        forget it and its moves. Releasing what is already gone is not an
        error."""
        instance_uuid = check_uuid(instance_uuid, "instance_uuid")

        def decide() -> Decision:
            rows = self._view.rows_of(instance_uuid)
            if not rows and instance_uuid not in self._view.instances:
                return Decision([])
            released = [a.with_(state=AssignmentState.RELEASED) for a in rows]
            return self._decision(Decided(released, Change(
                updated=tuple(released), forgotten_instance=instance_uuid,
                forgotten_migrations=self._view.migrations_of(instance_uuid))))

        return self._run(instance_uuid, decide)

    def rebind_boot(self, instance_uuid: str) -> None:
        """After a host reboot, once the instance's mdevs exist again: its
        assignments belong to this boot."""
        def decide() -> Decision:
            stale = [a.with_(boot_id=self.boot_id) for a in self._view.rows_of(instance_uuid)
                     if a.boot_id != self.boot_id]
            if not stale:
                return Decision(None)
            return self._decision(Decided(None, Change(updated=tuple(stale))))

        self._run(instance_uuid, decide)

    def realign(self, moves: list[tuple[Assignment, Assignment]]) -> list[Assignment]:
        """Rows moved to the provider and class their allocations now sit on
        (heal; compute_agent/heal/realign.py), all in one transaction. A row changed
        since ``old`` was read (released, say) is left as it is; returns
        the rows moved."""
        def decide() -> Decision:
            done = [(old, new) for old, new in moves if self._view.live.get(old.id) == old]
            if not done:
                return Decision([])
            self._view.index([new for _, new in done])
            self._view.touched_providers.update(a.provider_uuid for pair in done for a in pair)

            def undo() -> None:
                with self._lock:
                    self._view.index([old for old, _ in done])

            return Decision([new for _, new in done],
                            [realign_assignments_sql([new for _, new in done])],
                            undo)

        return self._run("realign", decide)

    # --- one-time-use devices --------------------------------------------

    def device_uses(self) -> list[tuple[DeviceUse, bool]]:
        """Every one-time-use device not clean, by address, each with
        whether a live assignment still holds it."""
        with self._lock:
            return [(u, self._view.device_held(a)) for a, u in sorted(self._view.uses.items())]

    def awaiting_cleaning(self) -> list[str]:
        """The used devices no one holds any more, whose cleaning has not
        failed: what the cleaner runs its commands on."""
        with self._lock:
            return [a for a, u in sorted(self._view.uses.items())
                    if u.state is UseState.USED and not self._view.device_held(a)]

    def mark_held_used(self) -> list[str]:
        """Record used every one-time-use device an instance holds with no
        record of its use: one held before its spec said one_time_use, or
        by a guest adopted from nova-compute. Its cleaning then follows its
        release, as for a device a claim chose. Returns their addresses,
        once on disk."""
        def decide() -> Decision:
            marked = self._view.held_unrecorded()
            if not marked:
                return Decision([])
            self._view.uses.update((u.address, u) for u in marked)
            self._view.uses_moved += 1

            def undo() -> None:
                with self._lock:
                    for u in marked:
                        self._view.uses.pop(u.address, None)

            return Decision([u.address for u in marked], [put_device_uses_sql(marked)],
                            undo)

        with self._lock:
            if not self._view.held_unrecorded():
                return []
        return self._run("device uses", decide)

    def _use_step(self, address: str, step: Callable[[DeviceUse], DeviceUse | None]
                  ) -> DeviceUse | None:
        """Change one used device's record: ``step`` answers its new use
        (None: clean, given back), or raises InvalidRequest. On disk
        before it returns."""
        def decide() -> Decision:
            before = self._view.uses.get(address)
            if before is None:
                raise InvalidRequest("address", address, "is not a used one-time-use "
                                     "device of this host")
            if self._view.device_held(address):
                raise InvalidRequest("address", address, "is held by an instance; a "
                                     "device is cleaned once its instance gave it back")
            after = step(before)
            if after is None:
                del self._view.uses[address]
                write = [delete_device_uses_sql([address])]
            else:
                self._view.uses[address] = after
                write = [put_device_uses_sql([after])]

            def undo() -> None:
                with self._lock:
                    self._view.uses[address] = before

            return Decision(after, write, undo)

        return self._run(f"device {address}", decide)

    def give_back_device(self, address: str) -> None:
        """The device is clean (its cleaning succeeded, or an operator
        cleaned it by hand): back in scheduling."""
        self._use_step(address, lambda use: None)

    def cleaning_failed(self, address: str, reason: str) -> DeviceUse | None:
        """Its cleaning failed: it stays out, with the reason, until
        cleaned again (``clean_again``) or released by an operator."""
        return self._use_step(address, lambda use: DeviceUse(address,
                                                             UseState.CLEANING_FAILED,
                                                             reason))

    def clean_again(self, address: str) -> DeviceUse | None:
        """An operator asks for the cleaning again: the device waits for it
        as after its use."""
        return self._use_step(address, lambda use: DeviceUse(address))

    # --- moves (compute/move_claims.py decides) --------------------------

    def claim_move(self, kind: MoveKind, migration_uuid: str, instance_uuid: str,
                   spec: dict, allocations: dict) -> list[Assignment]:
        """The destination's claim for a resize, live migration or
        evacuation. On the same host, the instance's current devices pass
        to the migration in the same commit."""
        with self.metrics.claim(kind.value):
            migration_uuid = check_uuid(migration_uuid, "migration_uuid")
            instance_uuid = check_uuid(instance_uuid, "instance_uuid")
            claimed_spec = InstanceSpec.from_payload(spec)
            request = move_claims.ClaimRequest(claimed_spec, allocations,
                                               claim_request(claimed_spec, allocations))
            return self._run(instance_uuid, lambda: self._decision(move_claims.claim_move(
                self._view, kind, migration_uuid, instance_uuid, request)))

    def announce_move_source(self, kind: MoveKind, migration_uuid: str, instance_uuid: str,
                             asked: RequestDigest) -> Migration:
        """The source is told of a move before anything moves: the record
        (state ANNOUNCED) makes the instance this move's, so that a restart
        before the move starts neither gives it up nor finds the
        migration's allocations unexplained. Its devices stay the
        instance's. A retry, asking the same (``asked``: what the
        announcement says, where to), answers the record as it is now."""
        migration_uuid = check_uuid(migration_uuid, "migration_uuid")
        instance_uuid = check_uuid(instance_uuid, "instance_uuid")
        return self._run(instance_uuid, lambda: self._decision(move_claims.announce_source(
            self._view, kind, migration_uuid, instance_uuid, asked)))

    def begin_move_source(self, kind: MoveKind, migration_uuid: str, instance_uuid: str
                          ) -> list[Assignment]:
        """The source's half: the instance's devices pass to the migration
        (an announced move starts here)."""
        migration_uuid = check_uuid(migration_uuid, "migration_uuid")
        instance_uuid = check_uuid(instance_uuid, "instance_uuid")
        return self._run(instance_uuid, lambda: self._decision(move_claims.begin_source(
            self._view, kind, migration_uuid, instance_uuid)))

    def _move_step(self, migration_uuid: str,
                   step: Callable[[ClaimsView, Migration], Decided]) -> Any:
        m = self.migration(migration_uuid)
        return self._run(m.instance_uuid, lambda: self._decision(
            step(self._view, self._view.migration(m.uuid))))

    def finish_move(self, migration_uuid: str) -> list[Assignment]:
        """The destination's guest runs with its new devices."""
        return self._move_step(migration_uuid, move_claims.finish)

    def confirm_move(self, migration_uuid: str) -> list[Assignment]:
        """Give back the source's devices (those the migration owns)."""
        return self._move_step(migration_uuid, move_claims.confirm)

    def revert_move(self, migration_uuid: str) -> list[Assignment]:
        """Give back the new devices and return the old ones to the
        instance, on whichever side of the move this host is."""
        return self._move_step(migration_uuid, move_claims.revert)

    def withdraw_move(self, migration_uuid: str) -> list[Assignment]:
        """A destination's claim refused within the call that made it (the
        live migration's pre-check): its devices, its record and the
        instance it brought go, so the store is as before the call, as for
        any refused call. A later ask of the same move starts afresh."""
        return self._move_step(migration_uuid, move_claims.withdraw)

    # --- views ----------------------------------------------------------

    def held_by_class(self) -> dict[tuple[str, str], int]:
        """(resource class, assignment state) -> units that live
        assignments hold."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        with self._lock:
            for a in self._view.live.values():
                out[(a.resource_class, a.state.value)] += a.amount
        return dict(out)

    def holds(self, kind: DeviceKind, device_id: str) -> bool:
        """Whether a live assignment holds the device."""
        with self._lock:
            return self._view.held.is_held(kind, device_id)

    def take_touched_providers(self) -> set[str]:
        """The providers whose assignments changed since the last call."""
        with self._lock:
            touched, self._view.touched_providers = self._view.touched_providers, set()
            return touched

    def migration(self, migration_uuid: str) -> Migration:
        migration_uuid = check_uuid(migration_uuid, "migration_uuid")
        with self._lock:
            return self._view.migration(migration_uuid)

    def instance_count(self) -> int:
        """How many instances this host holds; read without the lock (a
        heartbeat must not wait for a claim)."""
        return len(self._view.instances)

    def knows(self, instance_uuid: str) -> bool:
        instance_uuid = check_uuid(instance_uuid, "instance_uuid")
        with self._lock:
            return instance_uuid in self._view.instances

    def instance(self, instance_uuid: str) -> tuple[dict, list[Assignment], list[Migration]]:
        instance_uuid = check_uuid(instance_uuid, "instance_uuid")
        with self._lock:
            if instance_uuid not in self._view.instances:
                raise NoSuchInstance(instance_uuid)
            return (dict(self._view.instances[instance_uuid]), self._view.rows_of(instance_uuid),
                    [m for m in self._view.migrations.values()
                     if m.instance_uuid == instance_uuid])

    def snapshot(self) -> tuple[dict[str, dict], list[Assignment], dict[str, Migration]]:
        with self._lock:
            return (dict(self._view.instances), sorted(self._view.live.values(), key=lambda a: a.id),
                    dict(self._view.migrations))


def claim_request(spec: InstanceSpec, allocations: dict) -> RequestDigest:
    """What a claim asks, as its record keeps it: the spec and the
    allocations (keyed by provider uuids in lower case, as the RPC layer
    passes them)."""
    return RequestDigest.of(spec=spec.to_payload(), allocations=allocations)
