"""The live migration's source pre-step (RPC API 1.4): the source records
the move as announced before the conductor swaps the allocations, and ends
it on rollback; the endpoint refuses this host as the destination. Hosts
are claims worlds (fake driver, which passes the driver contract). (The
conductor's order of steps is tests/unit/conductor/test_live_migration.py's.)"""
from __future__ import annotations

import pytest

from compute_agent.claims.model import MigrationRole, MigrationState, MoveKind
from compute_agent.drivers.fake import FakeNetwork
from compute_agent.exception import (
    InvalidRequest,
    LiveMigrationRefused,
    MoveInProgress,
    NoSuchInstance,
)
from tests.functional.claims_world import make_world, new_uuid, spec
from tests.unit.rpc.calls import AgentWith, RecordingManager, Served

VGPU = {"gpu": {"VGPU": 1}}
VF = {"pf": {"SRIOV_NET_VF": 1}}


@pytest.fixture
def hosts(tmp_path):
    network = FakeNetwork()
    worlds = {h: make_world(tmp_path / h, f"host{h.lower()}", network=network)
              for h in "AB"}
    yield worlds
    for w in worlds.values():
        w.stop()


def built(w, wanted=VGPU) -> str:
    instance = new_uuid()
    w.manager.build_instance(instance, spec(), w.allocations(wanted))
    return instance


def destination_answer(b, migration, instance, wanted=VGPU) -> dict:
    answer = b.manager.check_can_live_migrate_destination(
        migration, instance, spec(), b.allocations(wanted))
    return {"claimed": answer["claimed"], "migration_uri": answer["migration_uri"]}


def test_the_source_records_the_move_as_announced_and_keeps_it_across_a_restart(hosts):
    a = hosts["A"]
    instance, migration = built(a), new_uuid()
    rows = a.live()
    assert a.manager.check_can_live_migrate_source(migration, instance, "hostb") == {
        "migration_uuid": migration, "state": "announced"}
    a.restart()
    m = a.migrations()[migration]
    assert (m.kind, m.role, m.state) == (MoveKind.LIVE_MIGRATION, MigrationRole.SOURCE,
                                         MigrationState.ANNOUNCED)
    assert m.open
    assert a.live() == rows  # nothing moved: the devices are the instance's
    # A retry answers the same; another move of the instance is refused.
    assert a.manager.check_can_live_migrate_source(migration, instance, "hostb")[
        "state"] == "announced"
    with pytest.raises(MoveInProgress):
        a.manager.check_can_live_migrate_source(new_uuid(), instance, "hostb")


def test_the_source_refuses_before_recording_anything(hosts):
    a = hosts["A"]
    stopped, with_vf = built(a), built(a, VF)
    a.driver.power_off(stopped)
    before = a.store.dump()
    with pytest.raises(NoSuchInstance):
        a.manager.check_can_live_migrate_source(new_uuid(), new_uuid(), "hostb")
    with pytest.raises(InvalidRequest, match="does not run here"):
        a.manager.check_can_live_migrate_source(new_uuid(), stopped, "hostb")
    # A plain VF (its device_spec does not say live_migratable) cannot move:
    # refused before the conductor swaps anything.
    with pytest.raises(LiveMigrationRefused, match="source vf"):
        a.manager.check_can_live_migrate_source(new_uuid(), with_vf, "hostb")
    assert a.store.dump() == before


def test_fuzz_bug_a_destination_refused_by_its_pre_check_keeps_no_record(hosts):
    """Found by tools/reliability (fuzz, RPC): check_can_live_migrate_
    destination claimed, then refused a plain VF in its pre-check and gave
    the claim back, but left the move's record (reverted) in the store: a
    refused call changed it. Now the store is as before, and the same move
    asked again is refused the same way."""
    b = hosts["B"]
    before = b.store.dump()
    migration, instance = new_uuid(), new_uuid()
    for _ in range(2):
        with pytest.raises(LiveMigrationRefused, match="destination vf"):
            destination_answer(b, migration, instance, VF)
        assert b.store.dump() == before
    assert migration not in b.migrations() and not b.live()


def test_an_announced_move_starts_at_live_migrate_and_completes(hosts):
    a, b = hosts["A"], hosts["B"]
    instance, migration = built(a), new_uuid()
    a.manager.check_can_live_migrate_source(migration, instance, "hostb")
    a.restart()  # between the announcement and live_migrate
    target = destination_answer(b, migration, instance)
    assert a.manager.live_migrate(migration, instance, target)["state"] == "migrated"
    b.manager.post_live_migration_at_destination(migration, instance)
    assert a.migrations()[migration].state is MigrationState.CONFIRMED
    assert instance not in a.instances() and not a.live()
    assert b.driver.guest_is_running(instance)


def test_a_rollback_at_the_source_ends_the_move_and_the_guest_stays(hosts):
    a, b = hosts["A"], hosts["B"]
    instance, migration = built(a), new_uuid()
    rows = a.live()
    a.manager.check_can_live_migrate_source(migration, instance, "hostb")
    target = destination_answer(b, migration, instance)
    b.manager.rollback_live_migration_at_destination(migration, instance)
    assert a.manager.rollback_live_migration_at_source(migration, instance) == {
        "migration_uuid": migration, "state": "rolled_back"}
    assert a.manager.rollback_live_migration_at_source(migration, instance)[
        "state"] == "rolled_back"  # a retry
    assert a.migrations()[migration].state is MigrationState.REVERTED
    assert a.live() == rows and a.driver.guest_is_running(instance)
    # Once rolled back, the move cannot go on nor be announced again.
    with pytest.raises(InvalidRequest, match="rolled back"):
        a.manager.live_migrate(migration, instance, target)
    with pytest.raises(InvalidRequest, match="rolled back"):
        a.manager.check_can_live_migrate_source(migration, instance, "hostb")
    assert a.driver.guest_is_running(instance) and a.live() == rows
    # A move the source never heard of needs nothing.
    other = new_uuid()
    assert a.manager.rollback_live_migration_at_source(other, instance)[
        "state"] == "rolled_back"
    assert other not in a.migrations()


def test_a_rollback_at_the_source_is_refused_once_the_guest_left(hosts):
    a, b = hosts["A"], hosts["B"]
    instance, migration = built(a), new_uuid()
    a.manager.check_can_live_migrate_source(migration, instance, "hostb")
    a.manager.live_migrate(migration, instance, destination_answer(b, migration, instance))
    with pytest.raises(InvalidRequest, match="happened"):
        a.manager.rollback_live_migration_at_source(migration, instance)


# --- the endpoint ---------------------------------------------------------

def test_the_endpoint_refuses_this_host_as_the_destination():
    class Policy:
        host = "hosta"

    agent = AgentWith(RecordingManager())
    agent.policy = Policy()
    e = Served()
    e.endpoint._agent = agent
    instance, migration = new_uuid(), new_uuid()
    with pytest.raises(InvalidRequest, match="destination_host: is this host"):
        e.check_can_live_migrate_source({}, migration_uuid=migration,
                                        instance_uuid=instance, destination_host="hosta")
    with pytest.raises(InvalidRequest, match="destination_host"):
        e.check_can_live_migrate_source({}, migration_uuid=migration,
                                        instance_uuid=instance, destination_host="")
    assert agent.manager.calls == []
    e.check_can_live_migrate_source({}, migration_uuid=migration,
                                    instance_uuid=instance, destination_host="hostb")
    assert agent.manager.calls == [("check_can_live_migrate_source", migration,
                                    instance, "hostb")]
