"""Reconciliation: the store, the hypervisor's guests and Placement's
allocations, compared. Run at start-up (when nothing is in flight) and
every few cycles. It fixes what is safe, reports the rest, and never
deletes a running guest. With ``fix=False`` it only reports (the audit).
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field

from agent import state
from agent.claim_model import AssignmentState, MigrationRole, MoveKind, Owner
from agent.manager import ComputeManager, in_guest
from drivers.base import DeviceKind

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

    @property
    def consistent(self) -> bool:
        return all(f.fixed for f in self.findings)

    def add(self, kind: str, subject: str, detail: str, fixed: bool = False) -> None:
        finding = Finding(kind, subject, detail, fixed)
        self.findings.append(finding)
        LOG.log(logging.INFO if fixed else logging.WARNING, "reconcile: %s %s: %s%s",
                kind, subject, detail, " (fixed)" if fixed else "")

    def as_dict(self) -> dict:
        return {"consistent": self.consistent,
                "findings": [asdict(f) for f in self.findings]}


def reconcile(manager: ComputeManager, allocations: dict[str, set[str]] | None,
              at_start: bool, fix: bool = True, grace: float = 0) -> Report:
    """``allocations``: consumer uuid -> our providers it holds allocations
    on, or None when Placement could not be asked. ``grace``: seconds for
    which devices whose guest has gone stay held (orphan_grace_period)."""
    tracker, driver = manager.tracker, manager.driver
    report = Report()
    instances, live, moves = tracker.snapshot()
    changed_at = tracker.store.read(state.live_changed_at) if grace else {}
    now = time.time()
    guests = driver.list_guests()
    open_moves = {m.instance_uuid: m for m in moves.values() if m.open}
    by_instance: dict[str, list] = {}
    for a in live:
        by_instance.setdefault(a.instance_uuid, []).append(a)

    for uuid in sorted(set(guests) - set(instances)):
        report.add("guest_without_assignments", uuid,
                   "a guest of ours that the store does not know; left alone")

    boot_id = driver.boot_id()
    for uuid in sorted(instances):
        rows = by_instance.get(uuid, [])
        move = open_moves.get(uuid)
        claiming = [a for a in rows if a.state is AssignmentState.CLAIMING
                    and a.migration_uuid is None]
        if at_start and claiming:
            # A build that crashed between its claim and its completion.
            carried = {a.id for a in claiming if in_guest(a)}
            if uuid in guests and carried <= guests[uuid]:
                _fix(report, fix, "claim_stuck_claiming", uuid,
                     "the guest has these devices: claim completed",
                     lambda: tracker.complete(uuid))
            elif driver.guest_is_running(uuid):
                report.add("claim_stuck_claiming", uuid,
                           "a running guest lacks some of these devices; left alone")
            else:
                _fix(report, fix, "claim_stuck_claiming", uuid,
                     "no guest holds these devices: claim rolled back",
                     lambda: manager.delete_instance(uuid))
            continue
        if at_start and move is not None and move.kind is MoveKind.EVACUATION \
                and move.role is MigrationRole.DESTINATION:
            _fix(report, fix, "evacuation_interrupted", uuid,
                 "resumed: guest built and the move completed",
                 lambda: manager.rebuild_instance(move.uuid, uuid, instances[uuid], None))
            continue
        claimed = [a for a in rows if a.state is AssignmentState.CLAIMED
                   and a.owner is Owner.INSTANCE]
        if claimed and uuid not in guests and move is None:
            waited = now - changed_at.get(uuid, now - grace)
            if waited < grace:
                report.add("assignment_without_guest", uuid,
                           f"devices held by an instance that has no guest here; "
                           f"given back once unchanged for {grace:.0f} s "
                           f"(now {max(waited, 0):.0f} s)")
                continue
            _fix(report, fix, "assignment_without_guest", uuid,
                 "devices held by an instance that has no guest here: given back",
                 lambda: manager.delete_instance(uuid))
            continue
        if move is None and uuid in guests and claimed \
                and guests[uuid] != {a.id for a in rows if in_guest(a)}:
            _fix(report, fix, "guest_devices_differ", uuid,
                 "the guest's devices are not the store's: guest redefined",
                 lambda: manager.redefine_guest(uuid))
        stale = [a for a in rows if a.boot_id != boot_id]
        for a in stale:
            if a.kind is DeviceKind.MDEV and a.owner is Owner.INSTANCE:
                _fix(report, fix, "mdev_after_reboot", a.device_id,
                     f"claimed before this boot by {uuid}: recreated",
                     lambda a=a: driver.ensure_mdev(a.device_id, a.detail.mdev_parent,
                                                    a.detail.mdev_type))
        if stale and fix:
            tracker.rebind_boot(uuid)
        if allocations is not None and claimed and move is None \
                and uuid not in allocations:
            if driver.guest_is_running(uuid):
                report.add("assignment_without_allocation", uuid,
                           "Placement has no allocation of it here, but its guest "
                           "runs; left alone")
            else:
                _fix(report, fix, "assignment_without_allocation", uuid,
                     "Placement has no allocation of it here (evacuated?): "
                     "guest and devices removed",
                     lambda: manager.delete_instance(uuid))

    if allocations is not None:
        known = set(instances) | set(moves)
        for consumer in sorted(set(allocations) - known):
            report.add("allocation_without_record", consumer,
                       f"holds allocations on {len(allocations[consumer])} of our "
                       "providers that no local record explains")
    return report


def _fix(report: Report, fix: bool, kind: str, subject: str, detail: str, action) -> None:
    if not fix:
        report.add(kind, subject, detail.split(":")[0])
        return
    try:
        action()
        report.add(kind, subject, detail, fixed=True)
    except Exception as e:  # one bad record must not stop the others
        report.add(kind, subject, f"{detail.split(':')[0]}; fixing failed: {e}")
