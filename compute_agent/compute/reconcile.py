"""Reconciliation: the store, the hypervisor's guests and Placement's
allocations, compared. Run at start-up (when nothing is in flight) and
every few cycles. It fixes what is safe, reports the rest, and never
deletes or restarts a running guest. With ``fix=False`` it only reports
(the audit).

Every case is a named rule below, in the order they are tried: a rule
detects one disagreement and either fixes it or reports it. The
per-instance rules run for each instance the store knows; a rule that
settles an instance (rolls back its claim, gives back its devices) stops
the later rules for it. What is unknown (Placement not answering) is never
taken for empty: the rules that need Placement's allocations are skipped.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from compute_agent.claims.model import (
    Assignment,
    AssignmentState,
    Migration,
    MigrationRole,
    MigrationState,
    MoveKind,
    Owner,
)
from compute_agent.claims.veto import assignable_resources, describe_stray, stray_holdings
from compute_agent.compute.evacuation import interrupted_rebuilds
from compute_agent.compute.host import guest_device, in_guest
from compute_agent.compute.manager import ComputeManager
from compute_agent.drivers.base import (
    DeviceKind,
    ForeignGuest,
    GuestHolding,
    GuestState,
    HostResource,
    device_resources,
)
from compute_agent.moves.evacuation import evacuated_away
from compute_agent.store.queries import live_changed_at, migrations_changed_at

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Finding:
    kind: str
    subject: str  # an instance, consumer or mdev uuid
    detail: str
    fixed: bool = False


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    # What could not be read, so what no rule could compare: the report
    # is then no proof of consistency.
    unknown: list[str] = field(default_factory=list)

    @property
    def consistent(self) -> bool:
        return all(f.fixed for f in self.findings)

    def add(self, kind: str, subject: str, detail: str, fixed: bool = False) -> None:
        finding = Finding(kind, subject, detail, fixed)
        self.findings.append(finding)
        LOG.log(logging.INFO if fixed else logging.WARNING, "reconcile: %s %s: %s%s",
                kind, subject, detail, " (fixed)" if fixed else "")

    def as_dict(self) -> dict:
        return {"consistent": None if self.unknown else self.consistent,
                "findings": [asdict(f) for f in self.findings],
                "unknown": list(self.unknown)}


@dataclass(frozen=True)
class ReconcileInputs:
    """What a reconciliation is given by its caller: Placement's side as the
    caller read it, whether it may fix, and its time bounds."""

    # consumer uuid -> our providers it holds allocations on; None when
    # Placement's answer is unknown.
    allocations: dict[str, set[str]] | None
    at_start: bool
    fix: bool = True
    # Seconds for which devices whose guest has gone stay held
    # (orphan_grace_period).
    grace: float = 0
    # At start-up: instance uuid -> the providers, none of them ours, that
    # hold its allocations, for the instances with none on ours; None when
    # unknown. And how to drop the hold an evacuation's migration consumer
    # keeps on our providers.
    elsewhere: dict[str, set[str]] | None = None
    drop_evacuation_hold: Callable[[str], None] | None = None
    # The instances whose evacuation's migration consumer holds allocations
    # on our providers (the conductor's swap: Evacuator, in
    # compute_agent/conductor/evacuation.py): instance uuid -> that
    # consumer, which the instance's record explains.
    evacuation_holds: dict[str, str] = field(default_factory=dict)
    # After how many seconds a live migration announced here and never
    # started is taken for the conductor's loss, and how to end such a move
    # (its allocations back to the instance, its record rolled back).
    announced_timeout: float = float("inf")
    end_announced_move: Callable[[Migration], None] | None = None
    # The wall-clock time now, which the store's change times are in.
    clock: Callable[[], float] = time.time


@dataclass
class Pass:
    """What one reconciliation pass knows, read once at its start."""

    manager: ComputeManager
    report: Report
    inputs: ReconcileInputs
    instances: dict[str, dict]
    rows: dict[str, list[Assignment]]
    open_moves: dict[str, Migration]  # by instance uuid
    migrations: dict[str, Migration]  # every move the store knows, open or settled
    guests: dict[str, GuestState]
    boot_id: str
    changed_at: dict[str, float]
    now: float
    # The guests another manager defined (an adopted host's nova guests):
    # never redefined from the store, which would replace nova's definition.
    foreign: frozenset[str] = frozenset()
    # The evacuations accepted here and not yet settled, by instance uuid.
    rebuilds: dict[str, Migration] = field(default_factory=dict)
    # Live migrations announced here and never started: when each was
    # announced (epoch s), by migration uuid.
    announced_at: dict[str, float] = field(default_factory=dict)
    # Every guest on the host, ours and others', with what it holds.
    holdings: dict[str, GuestHolding] = field(default_factory=dict)
    # The instances an evacuation is being accepted for here now, their
    # allocations on our providers before their record is in the store.
    arriving: frozenset[str] = frozenset()

    def act(self, kind: str, subject: str, detail: str, action: Callable) -> None:
        """Fix (when fixing) and report; ``detail`` reads "what: outcome"."""
        if not self.inputs.fix:
            self.report.add(kind, subject, detail.split(":")[0])
            return
        try:
            action()
            self.report.add(kind, subject, detail, fixed=True)
        except Exception as e:  # noqa: BLE001 - one bad record must not stop the others
            self.report.add(kind, subject, f"{detail.split(':')[0]}; fixing failed: {e}")

    def claimed(self, uuid: str) -> list[Assignment]:
        return [a for a in self.rows.get(uuid, ())
                if a.state is AssignmentState.CLAIMED and a.owner is Owner.INSTANCE]


def carried(guest: GuestState) -> frozenset[str]:
    """The assignments a guest holds: what it runs with, or when stopped
    what it will start with."""
    return guest.live if guest.running else guest.saved


# --- per-instance rules: each returns True when it settled the instance ---

def claim_stuck_claiming(p: Pass, uuid: str) -> bool:
    """At start-up: a build that crashed between its claim and its
    completion. Completed when the guest carries the devices, rolled back
    when there is no guest, left alone when a running guest lacks some."""
    claiming = [a for a in p.rows.get(uuid, ())
                if a.state is AssignmentState.CLAIMING and a.migration_uuid is None]
    if not p.inputs.at_start or not claiming:
        return False
    guest = p.guests.get(uuid)
    wanted = {a.id for a in claiming if in_guest(a)}
    if guest is not None and wanted <= carried(guest):
        p.act("claim_stuck_claiming", uuid,
              "the guest has these devices: claim completed",
              lambda: p.manager.tracker.complete(uuid))
    elif guest is not None and guest.running:
        p.report.add("claim_stuck_claiming", uuid,
                     "a running guest lacks some of these devices; left alone")
    else:
        p.act("claim_stuck_claiming", uuid,
              "no guest holds these devices: claim rolled back",
              lambda: p.manager.delete_instance(uuid))
    return True


def evacuation_interrupted(p: Pass, uuid: str) -> bool:
    """At start-up, before RPC is served: an evacuation accepted here whose
    rebuild did not finish is resumed; this host is its single owner. (The
    update loop resumes the same ones at every cycle: resume_rebuilds.)"""
    if not p.inputs.at_start:
        return False
    move = p.rebuilds.get(uuid)
    if move is None:
        return False
    p.act("evacuation_interrupted", uuid,
          "resumed: guest built and the move completed",
          lambda: p.manager.finish_rebuild(move.uuid))
    return True


def evacuated_elsewhere(p: Pass, uuid: str) -> bool:
    """At start-up, before RPC is served: an instance evacuated while this
    host was down (its allocations sit on another host's providers, and no
    move in flight here owns it) is given up: its guest destroyed, running
    or not, its devices given back, and the evacuation's hold on our
    providers dropped. Skipped while Placement's answer is unknown."""
    if not p.inputs.at_start or p.inputs.allocations is None or p.inputs.elsewhere is None:
        return False
    elsewhere = p.inputs.elsewhere.get(uuid)
    if not evacuated_away(uuid in p.inputs.allocations, elsewhere, p.open_moves.get(uuid),
                          uuid in p.inputs.evacuation_holds):
        return False

    def give_up() -> None:
        p.manager.delete_instance(uuid)
        if p.inputs.drop_evacuation_hold is not None:
            p.inputs.drop_evacuation_hold(uuid)

    p.act("evacuated_elsewhere", uuid,
          f"its allocations sit on {len(elsewhere or ())} provider(s) of another host: "
          "guest destroyed, devices given back", give_up)
    return True


def live_migration_never_started(p: Pass, uuid: str) -> bool:
    """A live migration this host was told of as its source (announced)
    that has not started here. Within the bound it is the conductor's:
    the instance stays the move's, which the later rules respect as they
    do any open move (its allocations may sit on the migration consumer,
    or the destination's on the instance). Past the
    bound the conductor is taken for gone: the migration's allocations on
    our providers return to the instance and the move is ended; the guest
    runs on as it was."""
    move = p.open_moves.get(uuid)
    if move is None or move.state is not MigrationState.ANNOUNCED:
        return False
    age = p.now - p.announced_at.get(move.uuid, p.now)
    if age < p.inputs.announced_timeout:
        return False
    detail = (f"live migration {move.uuid} announced {age:.0f} s ago never "
              "started: allocations returned to the instance, move ended")
    end = p.inputs.end_announced_move
    if end is None:
        p.report.add("live_migration_never_started", uuid, detail.split(":")[0])
        return True
    p.act("live_migration_never_started", uuid, detail, lambda: end(move))
    return True


def resize_awaiting_its_end(p: Pass, uuid: str) -> Migration | None:
    """A cross-host resize that brought the instance here and that the
    conductor has not confirmed or reverted yet, as this host knows it."""
    return next((m for m in p.migrations.values()
                 if m.instance_uuid == uuid and m.kind is MoveKind.RESIZE
                 and m.role is MigrationRole.DESTINATION
                 and m.state is MigrationState.FINISHED), None)


def assignment_without_guest(p: Pass, uuid: str) -> bool:
    """Devices held by an instance with no guest here and no move: given
    back once unchanged for the grace period, reported until then. The
    destination of a resize not confirmed or reverted yet keeps them
    whatever the time: its revert destroys the guest before it records the
    revert, so a destination killed in between has no guest, and giving
    the instance up would forget the move the conductor's revert, sent
    again, names ("no such move on this host"); the revert or confirm
    settles it."""
    if not p.claimed(uuid) or uuid in p.guests or uuid in p.open_moves:
        return False
    resize = resize_awaiting_its_end(p, uuid)
    if resize is not None:
        p.report.add("assignment_without_guest", uuid,
                     f"devices held by an instance that has no guest here; kept for "
                     f"its resize {resize.uuid}, which is not confirmed or reverted yet")
        return True
    waited = p.now - p.changed_at.get(uuid, p.now - p.inputs.grace)
    if waited < p.inputs.grace:
        p.report.add("assignment_without_guest", uuid,
                     f"devices held by an instance that has no guest here; "
                     f"given back once unchanged for {p.inputs.grace:.0f} s "
                     f"(now {max(waited, 0):.0f} s)")
        return True
    p.act("assignment_without_guest", uuid,
          "devices held by an instance that has no guest here: given back",
          lambda: p.manager.delete_instance(uuid))
    return True


def guest_devices_differ(p: Pass, uuid: str) -> bool:
    """A guest whose devices are not the store's. Its saved definition is
    redefined from the store; a running guest keeps its live devices until
    it is next started, so that part is reported, never fixed by a restart."""
    guest = p.guests.get(uuid)
    if guest is None or uuid in p.open_moves or not p.claimed(uuid):
        return False
    stored = frozenset(a.id for a in p.rows.get(uuid, ()) if in_guest(a))
    if uuid in p.foreign:
        if carried(guest) != stored:
            p.report.add("adopted_guest_devices_differ", uuid,
                         "the adopted guest does not hold every device the store "
                         "assigns it; left as it is")
        return False
    if guest.saved != stored:
        p.act("guest_devices_differ", uuid,
              "the guest's saved definition is not the store's: guest redefined",
              lambda: p.manager.redefine_guest(uuid))
    if guest.running and guest.live != stored:
        p.report.add("guest_running_on_other_devices", uuid,
                     "the running guest's live devices are not the store's; "
                     "left running, it takes the store's at its next start")
    return False


def mdev_after_reboot(p: Pass, uuid: str) -> bool:
    """Assignments from an earlier boot: the instance's mdevs are created
    again (a reboot removes them), then the rows move to this boot."""
    stale = [a for a in p.rows.get(uuid, ()) if a.boot_id != p.boot_id]
    driver = p.manager.driver
    for a in stale:
        if a.kind is DeviceKind.MDEV and a.owner is Owner.INSTANCE:
            p.act("mdev_after_reboot", a.device_id,
                  f"claimed before this boot by {uuid}: recreated",
                  lambda a=a: driver.ensure_mdev(a.device_id, a.detail.mdev_parent,
                                                 a.detail.mdev_type))
    if stale and p.inputs.fix:
        p.manager.tracker.rebind_boot(uuid)
    return False


def assignment_without_allocation(p: Pass, uuid: str) -> bool:
    """Placement holds no allocation of the instance on our providers
    (evacuated away, say): a stopped guest and its devices are removed; a
    running one is reported. Skipped while Placement's answer is unknown.
    A move of the instance recorded here whose migration consumer holds our
    providers is no such case: that is the conductor's allocation swap, not
    yet swapped back after a revert that settled the move here (the source
    killed between its revert and the restart of its guest), and giving the
    instance up would lose it and forget the move the conductor's retry
    names. Reported, left alone."""
    if p.inputs.allocations is None or uuid in p.inputs.allocations or uuid in p.open_moves \
            or not p.claimed(uuid):
        return False
    swapped = sorted(m.uuid for m in p.migrations.values()
                     if m.instance_uuid == uuid and m.uuid in p.inputs.allocations)
    if swapped:
        p.report.add("assignment_without_allocation", uuid,
                     f"Placement holds its devices here for its move {swapped[0]}, "
                     "not for it (the allocations not swapped back yet); left alone")
        return False
    guest = p.guests.get(uuid)
    if guest is not None and guest.running:
        p.report.add("assignment_without_allocation", uuid,
                     "Placement has no allocation of it here, but its guest "
                     "runs; left alone")
        return False
    p.act("assignment_without_allocation", uuid,
          "Placement has no allocation of it here (evacuated?): "
          "guest and devices removed",
          lambda: p.manager.delete_instance(uuid))
    return True


INSTANCE_RULES: tuple[Callable[[Pass, str], bool], ...] = (
    claim_stuck_claiming,
    evacuation_interrupted,
    live_migration_never_started,
    evacuated_elsewhere,
    assignment_without_guest,
    guest_devices_differ,
    mdev_after_reboot,
    assignment_without_allocation,
)


# --- host-wide rules ------------------------------------------------------

def guest_without_assignments(p: Pass) -> None:
    """A guest of ours that the store does not know: reported, left alone."""
    for uuid in sorted(set(p.guests) - set(p.instances)):
        p.report.add("guest_without_assignments", uuid,
                     "a guest of ours that the store does not know; left alone")


def allocation_without_record(p: Pass) -> None:
    """A consumer holding allocations on our providers that no local record
    explains: reported. An evacuation's migration consumer is its
    instance's (Pass.evacuation_holds); an instance whose evacuation is
    being accepted here (its destination waiting the source out) is on its
    way into the store (Pass.arriving). Skipped while Placement's answer is
    unknown."""
    if p.inputs.allocations is None:
        return
    known = (set(p.instances) | set(p.migrations) | set(p.inputs.evacuation_holds.values())
             | p.arriving)
    for consumer in sorted(set(p.inputs.allocations) - known):
        p.report.add("allocation_without_record", consumer,
                     f"holds allocations on {len(p.inputs.allocations[consumer])} of our "
                     "providers that no local record explains")


def device_held_outside_the_store(p: Pass) -> None:
    """A device the agent hands out that a guest holds (running, or only
    defined) and the store does not give that guest's instance: the guest
    is unknown to the store, or the store gives the device to another
    instance, or to none. Reported; the device is never chosen for a claim
    while a guest holds it (compute_agent/claims/veto.py), until an operator
    deletes or redefines the guest, or rebuilds the store."""
    given: dict[HostResource, set[str]] = {}
    for rows in p.rows.values():
        for a in rows:
            for resource in device_resources(guest_device(a)):
                given.setdefault(resource, set()).add(a.instance_uuid)
    assignable = assignable_resources(p.manager.tracker.pools())
    for stray in stray_holdings(p.holdings, given, p.instances, assignable):
        p.report.add("device_held_outside_the_store", stray.guest,
                     f"{describe_stray(stray)}: never chosen for a claim while a "
                     "guest holds it; left alone")


HOST_RULES: tuple[Callable[[Pass], None], ...] = (
    guest_without_assignments,
    allocation_without_record,
    device_held_outside_the_store,
)


def adopted_guests(foreign: dict[str, ForeignGuest], rows: dict[str, list[Assignment]]
                   ) -> dict[str, GuestState]:
    """The guests of another manager that the store holds as instances
    (compute_agent/store/adoption.py), as guests of ours: without our metadata, each
    carries the assignments whose devices it holds (counted ones hold
    nothing and are carried)."""
    out = {}
    for uuid in sorted(set(foreign) & set(rows)):
        guest = foreign[uuid]
        ids = frozenset(a.id for a in rows[uuid] if in_guest(a)
                        and device_resources(guest_device(a)) <= guest.resources)
        out[uuid] = GuestState(guest.running, ids if guest.running else frozenset(), ids,
                               guest.resources if guest.running else frozenset())
    return out


def reconcile(manager: ComputeManager, inputs: ReconcileInputs) -> Report:
    """One pass over what ``manager`` holds, with what its caller gives."""
    tracker, driver = manager.tracker, manager.driver
    # Read before the store: an acceptance that ends in between has its
    # record in the snapshot.
    arriving = manager.rebuilds_arriving()
    instances, live, moves = tracker.snapshot()
    rows: dict[str, list[Assignment]] = {}
    for a in live:
        rows.setdefault(a.instance_uuid, []).append(a)
    adopted = adopted_guests(driver.list_foreign_guests(), rows)
    holdings = driver.guest_holdings()
    tracker.set_guests(holdings)
    announced = any(m.state is MigrationState.ANNOUNCED for m in moves.values())
    p = Pass(
        manager=manager, report=Report(), inputs=inputs, instances=instances, rows=rows,
        open_moves={m.instance_uuid: m for m in moves.values() if m.open},
        migrations=dict(moves), guests={**adopted, **driver.list_guests()},
        boot_id=driver.boot_id(),
        changed_at=tracker.store.read(live_changed_at) if inputs.grace else {},
        now=inputs.clock(), foreign=frozenset(adopted),
        rebuilds={m.instance_uuid: m for m in interrupted_rebuilds(moves.values(), set())},
        announced_at=tracker.store.read(migrations_changed_at) if announced else {},
        holdings=holdings, arriving=arriving)
    for uuid in sorted(instances):
        for rule in INSTANCE_RULES:
            if rule(p, uuid):
                break
    if any(f.fixed for f in p.report.findings):
        # The host rules judge the guests as the fixes left them: a guest
        # just redefined from the store no longer holds what it held.
        p.holdings = driver.guest_holdings()
        tracker.set_guests(p.holdings)
    for host_rule in HOST_RULES:
        host_rule(p)
    if inputs.allocations is None:
        p.report.unknown.append("Placement's allocations")
    return p.report
