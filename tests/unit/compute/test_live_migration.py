"""Live migration on each side (compute_agent/compute/live_migration.py),
between two host worlds on one fake network: the destination's claim, its
incoming mdevs, its settling and its rollback; the source's migration, a
failure that keeps the guest and its devices there, an outcome it cannot
tell, and a migration resumed after a restart. (The source's announcement
and its rollback are test_live_migration_source.py's; the conductor's
order of steps is tests/unit/conductor/test_live_migration.py's.)"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from compute_agent.claims.model import (
    Assignment,
    AssignmentState,
    Migration,
    MigrationRole,
    MigrationState,
    MoveKind,
    Owner,
)
from compute_agent.compute import live_migration
from compute_agent.compute.live_migration import held_by_the_guest
from compute_agent.drivers.base import (
    DeviceKind,
    ForeignGuest,
    HostResource,
    HostResourceKind,
    MigrationFailure,
)
from compute_agent.drivers.errors import LiveMigrationError
from compute_agent.drivers.fake import FakeDriver, FakeNetwork
from compute_agent.drivers.migration import LiveMigrationTarget
from compute_agent.exception import (
    InvalidRequest,
    LiveMigrationFailed,
    LiveMigrationRefused,
    MoveInProgress,
)
from tests.functional.claims_world import (
    EXISTING_MDEV,
    World,
    host_dict,
    make_world,
    new_uuid,
    spec,
)
from tests.unit.compute.trackers import new_uuids

VGPU = {"gpu": {"VGPU": 1}}
VF = {"pf": {"SRIOV_NET_VF": 1}}


def test_the_guest_holds_its_own_devices_and_those_its_migration_took_over():
    instance, moving, settled, other = new_uuids(4)
    moves = [Migration(moving, instance, MoveKind.LIVE_MIGRATION, MigrationRole.SOURCE,
                       MigrationState.ACTIVE),
             Migration(settled, instance, MoveKind.RESIZE, MigrationRole.DESTINATION,
                       MigrationState.FINISHED),
             Migration(other, instance, MoveKind.RESIZE, MigrationRole.DESTINATION,
                       MigrationState.ACTIVE)]

    def row(owner: Owner, migration: str | None) -> Assignment:
        return Assignment(new_uuid(), instance, instance, owner, migration, "VGPU", "gpu",
                          DeviceKind.MDEV, new_uuid(), 1,
                          AssignmentState.CLAIMED, "boot-1")

    assert held_by_the_guest(row(Owner.MIGRATION, moving), moving, moves)
    assert not held_by_the_guest(row(Owner.MIGRATION, other), moving, moves)
    assert held_by_the_guest(row(Owner.INSTANCE, None), moving, moves)
    # A settled move's devices keep naming it (a destination is never told
    # of the confirm): the instance's own.
    assert held_by_the_guest(row(Owner.INSTANCE, settled), moving, moves)
    # Claimed by a move still open here: not yet the guest's.
    assert not held_by_the_guest(row(Owner.INSTANCE, other), moving, moves)


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[tuple[World, World]]:
    """A source and a destination on one network; the destination's GPU
    has no mdev yet, so a claim there creates one."""
    network = FakeNetwork()
    a = make_world(tmp_path / "a", "hosta", network=network)
    b = make_world(tmp_path / "b", "hostb", host=host_dict(existing_mdev=False),
                   network=network)
    yield a, b
    a.stop()
    b.stop()


def built(w: World) -> str:
    instance = new_uuid()
    w.manager.build_instance(instance, spec(), w.allocations(VGPU))
    return instance


def claimed_at(b: World, migration: str, instance: str) -> dict:
    """The destination's answer to its pre-check, as live_migrate takes it."""
    answer = b.manager.check_can_live_migrate_destination(migration, instance, spec(),
                                                          b.allocations(VGPU))
    return {"claimed": answer["claimed"], "migration_uri": answer["migration_uri"]}


# --- the destination ---------------------------------------------------------------

def test_the_destination_claims_creates_the_mdev_and_answers_where_to_migrate(hosts):
    _, b = hosts
    instance, migration = new_uuids(2)
    answer = b.manager.check_can_live_migrate_destination(migration, instance, spec(),
                                                          b.allocations(VGPU))
    (row,) = b.live()
    assert answer["devices"] == [{"assignment_id": row.id, "kind": "mdev",
                                  "device_id": row.device_id}]
    assert [c["resource_class"] for c in answer["claimed"]] == ["VGPU"]
    assert answer["migration_uri"] == "fake://hostb"
    assert row.device_id in b.existing_mdevs()  # libvirt migrates into an existing one
    m = b.migrations()[migration]
    assert (m.role, m.state) == (MigrationRole.DESTINATION, MigrationState.ACTIVE)

    # Rolled back: the claim and the mdev made for it go.
    assert b.manager.rollback_live_migration_at_destination(migration, instance) == {
        "migration_uuid": migration, "instance": None}
    assert b.live() == [] and b.existing_mdevs() == set()
    assert b.migrations()[migration].state is MigrationState.REVERTED


def test_the_destination_refuses_an_instance_already_on_it(hosts):
    a, _ = hosts
    instance = built(a)
    before = a.store.dump()
    with pytest.raises(InvalidRequest, match="is on this host already"):
        a.manager.check_can_live_migrate_destination(new_uuid(), instance, spec(),
                                                     a.allocations(VGPU))
    assert a.store.dump() == before


def test_the_destination_never_claims_what_a_guest_on_it_holds(hosts):
    """A's GPU has an mdev already, which a guest not ours runs on."""
    a, _ = hosts
    a.driver.add_foreign_guest(ForeignGuest(
        new_uuid(), "not-ours", True, 1, 512,
        frozenset({HostResource(HostResourceKind.MDEV_UUID, EXISTING_MDEV)})))
    instance, migration = new_uuids(2)
    a.manager.check_can_live_migrate_destination(migration, instance, spec(),
                                                 a.allocations(VGPU))
    assert [r.device_id for r in a.live()] != [EXISTING_MDEV]


class MakesNoMdev(FakeDriver):
    """Says it created an mdev, and none appears."""

    def ensure_mdev(self, mdev_uuid: str, parent: str, type_id: str) -> None:
        pass


def test_a_destination_whose_mdev_does_not_appear_refuses_and_keeps_nothing(tmp_path):
    b = make_world(tmp_path, "hostb", driver=MakesNoMdev(host_dict(existing_mdev=False),
                                                         "hostb-boot-1"))
    try:
        before = b.store.dump()
        with pytest.raises(LiveMigrationRefused, match="does not exist on the destination"):
            b.manager.check_can_live_migrate_destination(new_uuid(), new_uuid(), spec(),
                                                         b.allocations(VGPU))
        assert b.store.dump() == before
    finally:
        b.stop()


def test_the_destination_settles_only_once_the_guest_runs_on_what_it_claimed(hosts):
    a, b = hosts
    instance, migration = built(a), new_uuid()
    target = claimed_at(b, migration, instance)
    with pytest.raises(InvalidRequest, match="the migration has not happened"):
        b.manager.post_live_migration_at_destination(migration, instance)
    assert b.migrations()[migration].state is MigrationState.ACTIVE

    a.manager.live_migrate(migration, instance, target)
    b.driver.power_off(instance)
    with pytest.raises(InvalidRequest, match="the migration has not happened"):
        b.manager.post_live_migration_at_destination(migration, instance)
    b.driver.spawn(b.manager.host.guest(instance))
    answer = b.manager.post_live_migration_at_destination(migration, instance)
    assert answer["running"] is True
    assert b.migrations()[migration].state is MigrationState.CONFIRMED
    assert [a.state for a in b.live()] == [AssignmentState.CLAIMED]
    # Settled here: no rollback can take the guest's only copy away.
    with pytest.raises(InvalidRequest, match="settled here"):
        b.manager.rollback_live_migration_at_destination(migration, instance)
    assert b.driver.guest_is_running(instance)


def test_a_rollback_is_refused_while_the_guest_runs_at_the_destination(hosts):
    a, b = hosts
    instance, migration = built(a), new_uuid()
    a.manager.live_migrate(migration, instance, claimed_at(b, migration, instance))
    with pytest.raises(InvalidRequest, match="the guest runs on this host"):
        b.manager.rollback_live_migration_at_destination(migration, instance)
    assert b.driver.guest_is_running(instance) and len(b.live()) == 1


def test_a_rollback_removes_a_guest_defined_at_the_destination_that_does_not_run(hosts):
    a, b = hosts
    instance, migration = built(a), new_uuid()
    a.manager.live_migrate(migration, instance, claimed_at(b, migration, instance))
    b.driver.power_off(instance)  # left over, never started here
    b.manager.rollback_live_migration_at_destination(migration, instance)
    assert b.driver.guest_state(instance) is None
    assert b.live() == [] and b.existing_mdevs() == set()
    with pytest.raises(InvalidRequest, match="this move was rolled back"):
        b.manager.post_live_migration_at_destination(migration, instance)


# --- the source --------------------------------------------------------------------

def test_the_source_migrates_the_guest_and_gives_its_devices_back(hosts):
    a, b = hosts
    instance, migration = built(a), new_uuid()
    target = claimed_at(b, migration, instance)
    assert a.manager.live_migrate(migration, instance, target) == {
        "migration_uuid": migration, "state": "migrated"}
    assert a.driver.guest_state(instance) is None
    assert b.driver.guest_is_running(instance)
    assert a.live() == [] and instance not in a.instances()
    assert a.migrations()[migration].state is MigrationState.CONFIRMED
    # Its retry is answered, migrating nothing.
    assert a.manager.live_migrate(migration, instance, target)["state"] == "migrated"


def test_the_source_gives_its_devices_back_as_configured(tmp_path):
    """With remove_released_mdevs, the mdev the guest left is removed."""
    network = FakeNetwork()
    a = make_world(tmp_path / "a", "hosta", host=host_dict(existing_mdev=False),
                   network=network)
    b = make_world(tmp_path / "b", "hostb", network=network)
    try:
        a.manager.host.remove_released_mdevs = True
        instance, migration = built(a), new_uuid()
        assert len(a.existing_mdevs()) == 1
        a.manager.live_migrate(migration, instance, claimed_at(b, migration, instance))
        assert a.existing_mdevs() == set()
    finally:
        a.stop()
        b.stop()


def test_the_source_refuses_a_device_its_own_device_spec_does_not_let_move(tmp_path):
    """The destination marks its VFs live-migratable, the source does not:
    the source's own pre-check refuses before anything moves."""
    network = FakeNetwork()
    a = make_world(tmp_path / "a", "hosta", network=network)
    b = make_world(tmp_path / "b", "hostb", network=network, live_migratable=True)
    try:
        instance, migration = new_uuid(), new_uuid()
        a.manager.build_instance(instance, spec(), a.allocations(VF))
        rows = a.live()
        answer = b.manager.check_can_live_migrate_destination(migration, instance, spec(),
                                                              b.allocations(VF))
        with pytest.raises(LiveMigrationRefused, match="source vf"):
            a.manager.live_migrate(migration, instance, {
                "claimed": answer["claimed"], "migration_uri": answer["migration_uri"]})
        assert a.live() == rows and migration not in a.migrations()
        assert a.driver.guest_is_running(instance)
    finally:
        a.stop()
        b.stop()


class MigratesSlowly(FakeDriver):
    """While it migrates, the conductor (another thread) asks the source
    again: what it answered is kept."""

    def __init__(self, network: FakeNetwork) -> None:
        super().__init__(host_dict(), "hosta-boot-1", network=network, uri="fake://hosta")
        self.meanwhile: Callable[[], object] = lambda: None
        self.answered: list[object] = []

    def live_migrate(self, instance_uuid: str, dest_uri: str,
                     target: LiveMigrationTarget) -> None:
        try:
            self.answered.append(self.meanwhile())
        except MoveInProgress as e:
            self.answered.append(e)
        super().live_migrate(instance_uuid, dest_uri, target)


@pytest.mark.parametrize("step", ["live_migrate", "rollback_live_migration_at_source"])
def test_a_move_being_migrated_is_in_progress_to_any_other_caller(tmp_path, step):
    network = FakeNetwork()
    driver = MigratesSlowly(network)
    a = make_world(tmp_path / "a", "hosta", driver=driver)
    b = make_world(tmp_path / "b", "hostb", network=network)
    try:
        instance, migration = built(a), new_uuid()
        target = claimed_at(b, migration, instance)
        args = (migration, instance, target) if step == "live_migrate" else (
            migration, instance)
        driver.meanwhile = lambda: getattr(a.manager, step)(*args)
        assert a.manager.live_migrate(migration, instance, target)["state"] == "migrated"
        (refused,) = driver.answered
        assert isinstance(refused, MoveInProgress)
        assert refused.migration_uuid == migration
    finally:
        a.stop()
        b.stop()


def test_the_source_needs_the_destinations_answer(hosts):
    a, _ = hosts
    instance = built(a)
    with pytest.raises(InvalidRequest) as caught:
        a.manager.live_migrate(new_uuid(), instance, None)
    assert caught.value.field == "destination"
    with pytest.raises(InvalidRequest) as caught:
        a.manager.live_migrate(new_uuid(), instance,
                               {"claimed": {}, "migration_uri": "fake://hostb"})
    assert caught.value.field == "destination.claimed"
    assert a.driver.guest_is_running(instance)
    assert a.migrations() == {}


def test_a_migration_the_hypervisor_refuses_keeps_the_guest_and_its_devices(hosts):
    a, b = hosts
    instance, migration = built(a), new_uuid()
    rows = a.live()
    target = {**claimed_at(b, migration, instance), "migration_uri": "fake://nowhere"}
    with pytest.raises(LiveMigrationFailed) as caught:
        a.manager.live_migrate(migration, instance, target)
    assert caught.value.args[2] == MigrationFailure.DESTINATION_UNREACHABLE.value
    assert a.driver.guest_is_running(instance)
    assert a.live() == rows
    assert a.migrations()[migration].state is MigrationState.REVERTED
    with pytest.raises(InvalidRequest, match="failed or was rolled back"):
        a.manager.live_migrate(migration, instance, target)


class OutcomeUnknown(FakeDriver):
    """The connection to the hypervisor breaks during the migration, or it
    says done with the guest still here."""

    says_done = False

    def live_migrate(self, instance_uuid: str, dest_uri: str,
                     target: LiveMigrationTarget) -> None:
        if not self.says_done:
            raise LiveMigrationError(MigrationFailure.OUTCOME_UNKNOWN,
                                     "connection to qemu:///system lost")


@pytest.mark.parametrize("says_done", [False, True], ids=["lost", "done yet here"])
def test_an_outcome_the_source_cannot_tell_gives_nothing_back(tmp_path, hosts, says_done):
    """Where the guest runs must be looked up on both hosts first."""
    _, b = hosts
    a = make_world(tmp_path / "c", "hostc", driver=OutcomeUnknown(host_dict(), "hostc-boot-1"))
    try:
        a.driver.says_done = says_done
        instance, migration = built(a), new_uuid()
        with pytest.raises(LiveMigrationFailed) as caught:
            a.manager.live_migrate(migration, instance, claimed_at(b, migration, instance))
        assert caught.value.args[2] == MigrationFailure.OUTCOME_UNKNOWN.value
        m = a.migrations()[migration]
        assert m.state is MigrationState.ACTIVE
        assert [r.owner for r in a.live()] == [Owner.MIGRATION]
    finally:
        a.stop()


class EarlierMigration(FakeDriver):
    """The hypervisor still runs the migration an earlier agent process
    started, for ``polls`` more looks, then it ends with the guest gone
    (``moved``) or still here."""

    def __init__(self, host: dict, boot_id: str, network: FakeNetwork, uri: str,
                 polls: int, moved: bool) -> None:
        super().__init__(host, boot_id, network=network, uri=uri)
        self.polls, self.moved = polls, moved
        self.looks = 0
        self.started: list[str] = []
        self.earlier: tuple[str, LiveMigrationTarget] | None = None

    def migrating_out(self, instance_uuid: str) -> bool:
        self.looks += 1
        if self.looks <= self.polls:
            return True
        if self.moved and self.earlier is not None:
            uri, target = self.earlier
            self.earlier = None
            super().live_migrate(instance_uuid, uri, target)
        return False

    def live_migrate(self, instance_uuid: str, dest_uri: str,
                     target: LiveMigrationTarget) -> None:
        self.started.append(instance_uuid)
        super().live_migrate(instance_uuid, dest_uri, target)


@pytest.mark.parametrize("polls, moved", [(2, True), (2, False), (0, False)],
                         ids=["guest left", "guest stayed", "none running"])
def test_a_resumed_migration_waits_for_the_earlier_one_then_goes_by_where_the_guest_is(
        tmp_path, monkeypatch, caplog, polls, moved):
    caplog.set_level(logging.INFO, logger="compute_agent.compute.live_migration")
    monkeypatch.setattr(live_migration, "EARLIER_MIGRATION_POLL_SECONDS", 0)
    network = FakeNetwork()
    b = make_world(tmp_path / "b", "hostb", network=network)
    driver = EarlierMigration(host_dict(), "hosta-boot-1", network, "fake://hosta",
                              polls=polls, moved=moved)
    a = make_world(tmp_path / "a", "hosta", driver=driver)
    try:
        instance, migration = built(a), new_uuid()
        target = claimed_at(b, migration, instance)
        # The earlier process had begun: the devices are the move's.
        a.tracker.begin_move_source(MoveKind.LIVE_MIGRATION, migration, instance)
        # What that process had asked the hypervisor for (the same pairing).
        driver.earlier = a.manager.live_migrations._target(migration, instance,
                                                           target)[::-1]

        assert a.manager.live_migrate(migration, instance, target)["state"] == "migrated"
        assert driver.looks == polls + 1
        waited = [r for r in caplog.records if "waiting for it to end" in r.getMessage()]
        assert len(waited) == (1 if polls else 0)
        # Migrated by the earlier migration, or by this call once that ended.
        assert driver.started == ([] if moved else [instance])
        assert b.driver.guest_is_running(instance)
        assert a.live() == []
    finally:
        a.stop()
        b.stop()
