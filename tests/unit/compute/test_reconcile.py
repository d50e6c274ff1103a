"""One test per reconcile rule (compute_agent/compute/reconcile.py), each named after it,
on a host world with the fake driver (which passes the driver contract)."""
from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from compute_agent.claims.model import AssignmentState, Migration, MigrationState, MoveKind
from compute_agent.compute import reconcile as rules
from compute_agent.compute.reconcile import ReconcileInputs, Report, reconcile
from compute_agent.drivers.base import DeviceKind, GuestSpec
from compute_agent.exception import SourceHostUp
from compute_agent.store.queries import live_changed_at, migrations_changed_at
from tests.functional.claims_world import World, host_dict, make_world, new_uuid, spec

VF = {"pf": {"SRIOV_NET_VF": 1}}
VGPU = {"gpu": {"VGPU": 1}}


@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    world = make_world(tmp_path)
    yield world
    world.stop()


def kinds(report: Report, fixed: bool | None = None) -> list[str]:
    return [f.kind for f in report.findings if fixed is None or f.fixed is fixed]


def built(w: World, wanted: dict[str, dict[str, int]] = VF) -> str:
    instance = new_uuid()
    w.manager.build_instance(instance, spec(), w.allocations(wanted))
    return instance


def test_the_rules_are_named_and_ordered() -> None:
    assert [r.__name__ for r in rules.INSTANCE_RULES] == [
        "claim_stuck_claiming", "evacuation_interrupted",
        "live_migration_never_started", "evacuated_elsewhere",
        "assignment_without_guest",
        "guest_devices_differ", "mdev_after_reboot", "assignment_without_allocation"]
    assert [r.__name__ for r in rules.HOST_RULES] == [
        "guest_without_assignments", "allocation_without_record",
        "device_held_outside_the_store"]


def test_claim_stuck_claiming(w: World) -> None:
    carried, lost, lacking = new_uuid(), new_uuid(), new_uuid()
    for instance in (carried, lost, lacking):
        w.tracker.claim_build(instance, spec(), w.allocations(VF))
    w.driver.spawn(w.manager.host.guest(carried))
    w.driver.spawn(GuestSpec(lacking, "vm", 1, 512, ()))  # runs, without its devices
    w.restart()

    assert kinds(w.reconcile(None, at_start=False)) == []  # only at start-up
    report = w.reconcile(None, at_start=True)
    by = {f.subject: f for f in report.findings}
    assert by[carried].fixed and "completed" in by[carried].detail
    assert by[lost].fixed and "rolled back" in by[lost].detail
    assert not by[lacking].fixed and "left alone" in by[lacking].detail
    assert {a.state for a in w.live() if a.instance_uuid == carried} == {
        AssignmentState.CLAIMED}
    assert lost not in w.instances()
    assert w.driver.guest_is_running(lacking)


def test_evacuation_interrupted(w: World) -> None:
    instance, migration = new_uuid(), new_uuid()
    w.tracker.claim_move(MoveKind.EVACUATION, migration, instance, spec(), w.allocations(VF))
    w.restart()
    report = w.reconcile(None, at_start=True)
    assert kinds(report, fixed=True) == ["evacuation_interrupted"]
    assert w.driver.guest_is_running(instance)
    assert w.migrations()[migration].state is MigrationState.CONFIRMED


def test_evacuation_interrupted_between_finish_and_confirm_is_settled(w: World) -> None:
    instance, migration = new_uuid(), new_uuid()
    w.tracker.claim_move(MoveKind.EVACUATION, migration, instance, spec(), w.allocations(VF))
    w.driver.spawn(w.manager.host.guest(instance))
    w.tracker.finish_move(migration)  # the crash comes before the confirm
    w.restart()
    assert kinds(w.reconcile(None, at_start=True), fixed=True) == [
        "evacuation_interrupted"]
    assert w.migrations()[migration].state is MigrationState.CONFIRMED
    assert w.driver.guest_is_running(instance)


def test_evacuation_interrupted_is_resumed_by_the_loop_too_and_only_once(w: World) -> None:
    instance, migration = new_uuid(), new_uuid()
    w.tracker.claim_move(MoveKind.EVACUATION, migration, instance, spec(), w.allocations(VF))
    w.restart()
    assert w.manager.resume_rebuilds() == [migration]
    assert w.driver.guest_is_running(instance)
    assert w.migrations()[migration].state is MigrationState.CONFIRMED
    assert w.manager.resume_rebuilds() == []


def test_evacuated_elsewhere(w: World) -> None:
    gone, running_gone, ours, moving = built(w), built(w), built(w), built(w)
    w.driver.power_off(gone)
    # A live migration in flight from here: its instance consumer already
    # holds the destination's providers, but the move is this host's.
    w.tracker.begin_move_source(MoveKind.LIVE_MIGRATION, new_uuid(), moving)
    other_host = {new_uuid()}
    elsewhere = {gone: other_host, running_gone: other_host, moving: other_host}
    dropped = []

    # The evacuation's own migration consumer holds this host's share of the
    # two evacuated ones: what says "evacuated", not the allocations alone.
    holds = {gone: new_uuid(), running_gone: new_uuid()}
    here = {u: {w.uuid("pf")} for u in (ours, *holds.values())}

    def run(at_start: bool, allocations: dict[str, set[str]] | None = here,
            found: dict[str, set[str]] | None = elsewhere, fix: bool = True,
            evacuated: dict[str, str] = holds) -> Report:
        return reconcile(w.manager, ReconcileInputs(
            allocations, at_start=at_start, fix=fix, elsewhere=found,
            drop_evacuation_hold=dropped.append, evacuation_holds=evacuated))

    # Only at start-up, and never on unknown (audits: the other rules would
    # act on the instances with no allocation here).
    assert "evacuated_elsewhere" not in kinds(run(False, fix=False))
    assert "evacuated_elsewhere" not in kinds(run(True, found=None, fix=False))
    assert "evacuated_elsewhere" not in kinds(run(True, allocations=None, fix=False))
    # Elsewhere without an evacuation's hold: a move whose source was killed
    # before recording its side, not an evacuation.
    assert "evacuated_elsewhere" not in kinds(run(True, fix=False, evacuated={}))
    assert kinds(run(True, fix=False)).count("evacuated_elsewhere") == 2
    assert set(w.instances()) == {gone, running_gone, ours, moving} and not dropped

    report = run(True)
    assert sorted(f.subject for f in report.findings
                  if f.kind == "evacuated_elsewhere" and f.fixed) == sorted(
        [gone, running_gone])
    # The holds are the evacuation's, explained by their instances: not
    # reported in the pass that drops them (seen at scale: tools/fleet).
    assert "allocation_without_record" not in kinds(report), report.as_dict()
    assert set(w.instances()) == {ours, moving}
    assert w.driver.guest_state(gone) is None
    assert w.driver.guest_state(running_gone) is None  # destroyed though it ran
    assert w.driver.guest_is_running(ours)
    assert sorted(dropped) == sorted([gone, running_gone])
    assert not [a for a in w.live() if a.instance_uuid in (gone, running_gone)]


def test_an_announced_live_migration_keeps_its_instance_at_start_up(w: World) -> None:
    """The conductor swapped the allocations after the source recorded the
    move, then the source restarted: the instance is the move's. Its guest
    is not destroyed (evacuated_elsewhere), nothing else acts on it, and
    the migration consumer is explained (the audit is clean)."""
    instance, migration = built(w, VGPU), new_uuid()
    w.manager.check_can_live_migrate_source(migration, instance, "hostb")
    w.restart()
    # Placement after the swap: the migration holds ours, the instance
    # holds the destination's.
    allocations = {migration: {w.uuid("gpu")}}
    elsewhere = {instance: {new_uuid()}}
    for fix in (False, True):
        report = reconcile(w.manager, ReconcileInputs(
            allocations, at_start=True, fix=fix, elsewhere=elsewhere, announced_timeout=600,
            end_announced_move=lambda m: pytest.fail("ended early")))
        assert report.findings == [] and report.consistent
    assert w.driver.guest_is_running(instance)
    assert w.migrations()[migration].state is MigrationState.ANNOUNCED
    assert {a.owner.value for a in w.live() if a.instance_uuid == instance} == {
        "instance"}


# A bound that is a whole number of a wall-clock time's steps (2**-22 s at
# today's times): a time plus it, and the instant before, are exact.
TIMEOUT_S = 1.0


def just_before(moment: float) -> float:
    return math.nextafter(moment, 0)


def test_live_migration_never_started(w: World) -> None:
    """Past the bound the conductor is taken for gone: the move is ended
    by the service's callback (allocations back, record rolled back); the
    audit reports it until then, and only then."""
    instance, migration = built(w, VGPU), new_uuid()
    w.manager.check_can_live_migrate_source(migration, instance, "hostb")
    ended = []

    def end(m: Migration) -> None:
        ended.append(m.uuid)
        w.manager.rollback_live_migration_at_source(m.uuid, m.instance_uuid)

    announced = w.store.read(migrations_changed_at)[migration]

    def run(fix: bool, now: float,
            callback: Callable[[Migration], None] | None = end) -> Report:
        return reconcile(w.manager, ReconcileInputs(
            {migration: {w.uuid("gpu")}}, at_start=False, fix=fix,
            announced_timeout=TIMEOUT_S, end_announced_move=callback, clock=lambda: now))

    assert run(False, just_before(announced + TIMEOUT_S)).findings == [] and not ended
    at_bound = announced + TIMEOUT_S
    audit = run(False, at_bound)
    assert kinds(audit) == ["live_migration_never_started"] and not audit.consistent
    assert not ended
    # Without a way to give the allocations back, it is reported, not ended.
    assert kinds(run(True, at_bound, None), fixed=False) == ["live_migration_never_started"]
    report = run(True, at_bound)
    assert kinds(report, fixed=True) == ["live_migration_never_started"]
    assert ended == [migration]
    assert w.migrations()[migration].state is MigrationState.REVERTED
    assert w.driver.guest_is_running(instance)
    assert "live_migration_never_started" not in kinds(run(True, at_bound))


def test_assignment_without_guest(w: World) -> None:
    instance = built(w)
    w.driver.destroy(instance)
    changed = w.store.read(live_changed_at)[instance]
    held = reconcile(w.manager, ReconcileInputs(
        None, at_start=False, grace=TIMEOUT_S,
        clock=lambda: just_before(changed + TIMEOUT_S)))
    assert kinds(held) == ["assignment_without_guest"] and not held.consistent
    assert instance in w.instances()
    # Unchanged for the grace period: given back.
    report = reconcile(w.manager, ReconcileInputs(
        None, at_start=False, grace=TIMEOUT_S, clock=lambda: changed + TIMEOUT_S))
    assert kinds(report, fixed=True) == ["assignment_without_guest"]
    assert instance not in w.instances()


def test_bug_resize_destination_killed_in_its_revert_forgot_the_move(w: World) -> None:
    """Found by reading after the crash loop's source-side case: a
    cross-host resize's destination destroys its guest, then records the
    revert. Killed in between and back after the grace period (a revert
    comes minutes or hours after the resize), it gave the guestless
    instance up and forgot the move, and the conductor's revert_resize sent
    again was answered "no such move on this host"."""
    instance, migration = new_uuid(), new_uuid()
    w.manager.prep_resize(migration, instance, spec(), w.allocations(VF))
    w.manager.finish_resize(migration, instance)
    w.driver.destroy(instance)  # revert_resize, killed before its record
    w.restart()
    changed = w.store.read(live_changed_at)[instance]

    report = reconcile(w.manager, ReconcileInputs(
        None, at_start=True, grace=TIMEOUT_S, clock=lambda: changed + TIMEOUT_S))
    assert [(f.kind, f.fixed) for f in report.findings] == [
        ("assignment_without_guest", False)], report.as_dict()
    assert instance in w.instances() and migration in w.migrations()

    assert w.manager.revert_resize(migration, instance)["instance"] is None  # again
    assert instance not in w.instances()
    assert not [a for a in w.live() if a.instance_uuid == instance]
    assert w.migrations()[migration].state is MigrationState.REVERTED


def test_guest_devices_differ_on_a_stopped_guest_is_redefined(w: World) -> None:
    instance = built(w)
    w.driver.power_off(instance)
    w.driver.update_guest(GuestSpec(instance, "vm", 1, 512, ()))
    report = w.reconcile(None, at_start=False)
    assert kinds(report, fixed=True) == ["guest_devices_differ"]
    stored = {a.id for a in w.live() if a.instance_uuid == instance}
    assert w.driver.guest_state(instance).saved == stored
    assert not w.driver.guest_is_running(instance)  # never started by reconcile
    assert kinds(w.reconcile(None, at_start=False)) == []


def test_guest_devices_differ_on_a_running_guest_is_reported_and_converges(w: World) -> None:
    """Regression: reconcile compared live plus saved ids with the store and
    redefined the saved definition, which a running guest ignores, so it
    reported the same guest as fixed on every pass and never converged."""
    instance = built(w)
    stored = w.driver.guest_state(instance).live
    w.driver.power_off(instance)
    w.driver.spawn(GuestSpec(instance, "vm", 1, 512, ()))
    first = w.reconcile(None, at_start=False)
    assert kinds(first, fixed=True) == ["guest_devices_differ"]
    assert kinds(first, fixed=False) == ["guest_running_on_other_devices"]
    second = w.reconcile(None, at_start=False)
    assert kinds(second) == ["guest_running_on_other_devices"]
    assert not second.consistent
    state = w.driver.guest_state(instance)
    assert state.running and state.saved == stored and state.live == frozenset()


def test_mdev_after_reboot(tmp_path: Path) -> None:
    w = make_world(tmp_path / "created", host=host_dict(existing_mdev=False))
    instance = built(w, VGPU)
    mdev = next(a.device_id for a in w.live() if a.instance_uuid == instance
                and a.kind is DeviceKind.MDEV)
    boot = w.reboot()
    assert mdev not in w.existing_mdevs()
    report = w.reconcile(None, at_start=True)
    assert "mdev_after_reboot" in kinds(report, fixed=True)
    assert mdev in w.existing_mdevs()
    assert {a.boot_id for a in w.live() if a.instance_uuid == instance} == {boot}
    w.stop()


def test_assignment_without_allocation(w: World) -> None:
    stopped, running = built(w), built(w)
    w.driver.power_off(stopped)
    # Placement unknown: nothing is decided on it (regression: unknown was
    # read as "no allocations" and the stopped guest was destroyed).
    assert kinds(w.reconcile(None, at_start=False)) == []
    assert stopped in w.instances()
    report = w.reconcile({}, at_start=False)
    by = {f.subject: f for f in report.findings}
    assert by[stopped].fixed and stopped not in w.instances()
    assert not by[running].fixed and w.driver.guest_is_running(running)


def test_bug_reverted_resize_source_given_up_before_the_swap_back(w: World) -> None:
    """Regression (crash loop): a cross-host resize's source killed after
    its revert_resize recorded the revert and before its guest started
    again. Until the conductor swaps the allocations back, the migration
    consumer holds the instance's devices here and the instance consumer
    the destination's: start-up reconciliation took the stopped instance
    for one with no allocation here, gave it up and forgot its move, and
    the conductor's revert_resize sent again was answered "no such move on
    this host" (and the instance was lost)."""
    instance, migration = built(w), new_uuid()
    before = {a.id for a in w.live() if a.instance_uuid == instance}
    w.manager.resize_instance(migration, instance)  # the guest stops
    w.tracker.revert_move(migration)  # revert_resize, killed before the spawn
    w.restart()

    report = reconcile(w.manager, ReconcileInputs(
        {migration: {w.uuid("pf")}}, at_start=True, elsewhere={instance: {new_uuid()}}))
    assert [(f.kind, f.subject, f.fixed) for f in report.findings] == [
        ("assignment_without_allocation", instance, False)], report.as_dict()
    assert migration in w.migrations() and instance in w.instances()

    view = w.manager.revert_resize(migration, instance)["instance"]  # sent again
    assert view["running"]
    assert {a["id"] for a in view["assignments"]} == before
    # Swapped back: nothing left to say.
    assert kinds(w.reconcile({instance: {w.uuid("pf")}}, at_start=False)) == []


def test_guest_without_assignments(w: World) -> None:
    instance = built(w)
    w.tracker.release_instance(instance)
    report = w.reconcile(None, at_start=False)
    # Its VF, which the store gave back, is one the agent hands out.
    assert kinds(report) == ["guest_without_assignments", "device_held_outside_the_store"]
    assert w.driver.guest_is_running(instance)


def test_device_held_outside_the_store(w: World) -> None:
    """A guest the store does not know holds a VF, and another holds one the
    store gives to a third instance: each reported, never fixed, and
    neither device is chosen again."""
    forgotten, holder, owner = built(w), built(w), built(w)
    vf_of = {i: next(a.device_id for a in w.live()
                     if a.instance_uuid == i and a.kind is DeviceKind.VF)
             for i in (forgotten, holder, owner)}
    w.tracker.release_instance(forgotten)  # the store forgets; the guest holds on
    # The holder's definition names the owner's VF too (it runs on its own).
    w.driver.update_guest(replace(w.driver.guests[holder].saved, devices=tuple(
        replace(d, device_id=vf_of[owner]) if d.kind is DeviceKind.VF else d
        for d in w.driver.guests[holder].saved.devices)))

    report = w.reconcile(None, at_start=False)
    found = [(f.subject, f.detail, f.fixed) for f in report.findings
             if f.kind == "device_held_outside_the_store"]
    veto = ": never chosen for a claim while a guest holds it; left alone"
    assert found == sorted([
        (forgotten, f"PCI device {vf_of[forgotten]} held by this running guest of ours; "
                    f"the store does not know this guest{veto}", False),
        (holder, f"PCI device {vf_of[owner]} held by this running guest of ours; "
                 f"the store gives it to instance {owner}{veto}", False)])
    # The fourth VF is the only one left to a build.
    fourth = built(w)
    assert [a.device_id for a in w.live()
            if a.instance_uuid == fourth and a.kind is DeviceKind.VF] == sorted(
        set(d.address for d in w.driver.host.pci_devices if d.parent_address)
        - set(vf_of.values()))


def test_allocation_without_record(w: World) -> None:
    instance, stranger = built(w), new_uuid()
    report = w.reconcile({instance: {w.uuid("pf")}, stranger: {w.uuid("pf")}},
                         at_start=False)
    assert [(f.kind, f.subject) for f in report.findings] == [
        ("allocation_without_record", stranger)]
    assert kinds(w.reconcile(None, at_start=False)) == []


def test_bug_an_evacuation_waiting_out_its_source_was_an_allocation_without_record(w: World) -> None:
    """The conductor puts the instance's allocations on the destination's
    providers, then calls it; the destination waits service_down_time for
    the source to be found down before the store has the instance. A
    reconciliation meanwhile reported the allocations as unexplained."""
    instance, migration = new_uuid(), new_uuid()
    in_fence, refuse = threading.Event(), threading.Event()

    def fence() -> None:
        in_fence.set()
        refuse.wait(10)
        raise SourceHostUp("source", 20)

    def accept() -> None:
        with pytest.raises(SourceHostUp):
            w.manager.accept_rebuild(migration, instance, spec(), w.allocations(VF), fence)
    accepting = threading.Thread(target=accept)
    accepting.start()
    assert in_fence.wait(10)
    held = {instance: {w.uuid("pf")}}
    assert kinds(w.reconcile(held, at_start=False)) == []
    refuse.set()
    accepting.join(10)
    assert [(f.kind, f.subject) for f in w.reconcile(held, at_start=False).findings] == [
        ("allocation_without_record", instance)]
