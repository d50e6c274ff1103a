"""The compute manager (compute_agent/compute/manager.py), the facade the RPC
server and the daemon call, on the fake driver: builds and deletes, a
failed spawn given back (or kept, while the hypervisor cannot say), a
resize on this host claimed, confirmed and reverted, a move refused
changing nothing, and each move step reaching its own module."""
from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from compute_agent.claims.model import MigrationState
from compute_agent.compute.evacuation import Evacuations
from compute_agent.compute.live_migration import LiveMigrations
from compute_agent.compute.manager import ComputeManager
from compute_agent.compute.resize import Resizes
from compute_agent.compute.tracker import Tracker
from compute_agent.drivers.base import GuestSpec
from compute_agent.drivers.errors import DriverUnavailable
from compute_agent.drivers.fake import FakeDriver
from compute_agent.exception import MoveInProgress, NoSuchInstance
from compute_agent.store.store import Store
from tests.unit.compute.trackers import (
    ONE_VF,
    SPEC,
    VF0,
    VF1,
    VGPU_HOST,
    VGPU_VF0,
    manager_on,
    new_uuids,
    on_vgpu_vf,
    vf_pools,
    vgpu_pools,
)

RESIZED = {**SPEC, "vcpus": 2}


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[ComputeManager]:
    with manager_on(tmp_path, vf_pools()) as m:
        yield m


def running_on(manager: ComputeManager, instance: str) -> set[str] | None:
    """The devices the instance's guest runs with; None: it does not run."""
    state = manager.driver.guest_state(instance)
    if state is None or not state.running:
        return None
    return {r.id for r in state.live_resources}


def devices(manager: ComputeManager, instance: str) -> list[tuple[str, str, str]]:
    """The instance's live rows: device, owner, state."""
    _, rows, _ = manager.tracker.instance(instance)
    return sorted((a.device_id, a.owner.value, a.state.value) for a in rows)


# --- build and delete -------------------------------------------------------------

def test_a_build_runs_the_guest_on_its_claimed_devices(manager):
    (instance,) = new_uuids(1)
    answer = manager.build_instance(instance, SPEC, ONE_VF)
    assert running_on(manager, instance) == {VF0}
    assert devices(manager, instance) == [(VF0, "instance", "claimed")]
    assert answer == manager.get_instance(instance)
    assert (answer["uuid"], answer["spec"], answer["running"]) == (instance, SPEC, True)
    # Its retry answers the same, claiming nothing more.
    assert manager.build_instance(instance, SPEC, ONE_VF) == answer
    assert [a.device_id for a in manager.tracker.snapshot()[1]] == [VF0]


class FailsToStart(FakeDriver):
    """Defines a guest, then fails to start it; ``down``: the hypervisor
    stops answering at that point."""

    def __init__(self, down: bool, host: dict | None = None) -> None:
        super().__init__(host)
        self.down = down

    def spawn(self, guest: GuestSpec) -> None:
        self.update_guest(guest)
        if self.down:
            raise DriverUnavailable("libvirtd did not answer", "qemu:///system")
        raise RuntimeError("internal error: qemu unexpectedly closed the monitor")

    def destroy(self, instance_uuid: str) -> None:
        if self.down:
            raise DriverUnavailable("libvirtd did not answer", "qemu:///system")
        super().destroy(instance_uuid)


def test_a_failed_spawn_removes_the_guest_and_gives_its_devices_back(tmp_path, caplog):
    with manager_on(tmp_path, vf_pools(), FailsToStart(down=False)) as manager:
        (instance,) = new_uuids(1)
        with pytest.raises(RuntimeError, match="qemu unexpectedly closed"):
            manager.build_instance(instance, SPEC, ONE_VF)
        assert manager.driver.guest_state(instance) is None
        assert not manager.tracker.knows(instance)
        assert manager.tracker.snapshot() == ({}, [], {})
        assert [r.levelno for r in caplog.records] == [logging.WARNING]
        assert "giving its devices back" in caplog.records[0].getMessage()


def test_a_failed_spawn_clears_the_vgpu_type_its_definition_wrote(tmp_path):
    with manager_on(tmp_path, vgpu_pools(), FailsToStart(False, VGPU_HOST)) as manager:
        with pytest.raises(RuntimeError):
            manager.build_instance(new_uuids(1)[0], SPEC, on_vgpu_vf(VGPU_VF0))
        assert manager.driver.vgpu_types == {}


def test_a_spawn_the_hypervisor_cannot_answer_for_keeps_its_claim(tmp_path, caplog):
    """Whether its guest exists or runs is unknown: its devices are not
    handed out again until the build's retry or the delete."""
    with manager_on(tmp_path, vf_pools(), FailsToStart(down=True)) as manager:
        (instance,) = new_uuids(1)
        with pytest.raises(DriverUnavailable):
            manager.build_instance(instance, SPEC, ONE_VF)
        assert devices(manager, instance) == [(VF0, "instance", "claiming")]
        assert [r.levelno for r in caplog.records] == [logging.WARNING]
        assert "its claim stays" in caplog.records[0].getMessage()


def test_a_delete_removes_the_guest_and_frees_its_devices_once(manager):
    first, second = new_uuids(2)
    manager.build_instance(first, SPEC, ONE_VF)
    assert manager.delete_instance(first) == {"uuid": first, "deleted": True}
    assert manager.driver.guest_state(first) is None
    with pytest.raises(NoSuchInstance):
        manager.get_instance(first)
    # Its VF is free again; a second delete is answered the same.
    manager.build_instance(second, SPEC, ONE_VF)
    assert running_on(manager, second) == {VF0}
    assert manager.delete_instance(first) == {"uuid": first, "deleted": True}
    assert running_on(manager, second) == {VF0}


# --- a resize on this host ----------------------------------------------------------

def resized(manager: ComputeManager) -> tuple[str, str]:
    """An instance built on VF0 and resized on this host to VF1, its guest
    running there, the move not yet confirmed or reverted."""
    instance, migration = new_uuids(2)
    manager.build_instance(instance, SPEC, ONE_VF)
    claimed = manager.prep_resize(migration, instance, RESIZED, ONE_VF)
    assert [a["device_id"] for a in claimed["assignments"]] == [VF1]
    passed = manager.resize_instance(migration, instance)
    assert [(a["device_id"], a["owner"]) for a in passed["assignments"]] == [
        (VF0, "migration")]
    assert running_on(manager, instance) is None
    finished = manager.finish_resize(migration, instance)
    assert (finished["spec"], finished["running"]) == (RESIZED, True)
    assert running_on(manager, instance) == {VF1}
    return instance, migration


def test_a_confirmed_resize_keeps_the_new_devices_and_frees_the_old(manager):
    instance, migration = resized(manager)
    assert manager.confirm_resize(migration, instance) == {
        "migration_uuid": migration, "state": "confirmed"}
    assert devices(manager, instance) == [(VF1, "instance", "claimed")]
    assert running_on(manager, instance) == {VF1}
    assert manager.tracker.migration(migration).state is MigrationState.CONFIRMED


def test_a_reverted_resize_runs_on_the_old_devices_and_spec_again(manager):
    instance, migration = resized(manager)
    answer = manager.revert_resize(migration, instance)
    assert answer["migration_uuid"] == migration
    assert answer["instance"]["spec"] == SPEC
    assert devices(manager, instance) == [(VF0, "instance", "claimed")]
    assert running_on(manager, instance) == {VF0}


def test_a_move_of_an_instance_in_another_is_refused_changing_nothing(manager):
    instance, migration = resized(manager)
    before, stored = manager.tracker.snapshot(), manager.tracker.store.dump()
    with pytest.raises(MoveInProgress) as caught:
        manager.prep_resize(new_uuids(1)[0], instance, SPEC, ONE_VF)
    assert caught.value.migration_uuid == migration
    assert manager.tracker.snapshot() == before
    assert manager.tracker.store.dump() == stored
    assert running_on(manager, instance) == {VF1}


# --- the manager's parts ------------------------------------------------------------

def test_a_new_tracker_is_the_hosts_too(manager):
    """A restart within one process (the tests' reboot) reopens the store:
    every step then reads it."""
    (instance,) = new_uuids(1)
    manager.build_instance(instance, SPEC, ONE_VF)
    path = manager.tracker.store.path
    manager.tracker.store.close()
    reopened = Tracker(Store(path), manager.driver.boot_id())
    manager.tracker = reopened
    assert manager.tracker is reopened and manager.host.tracker is reopened
    assert manager.get_instance(instance)["assignments"][0]["device_id"] == VF0
    assert manager.driver is manager.host.driver


class Recorder:
    """Stands in for one of the manager's parts: answers each call with
    its name, and keeps it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str):
        def call(*args: object) -> dict:
            self.calls.append((name, args))
            return {"answered_by": name}
        return call


def fence() -> None:
    """An evacuation's fence, passed through as it is."""


STEPS = [
    ("resizes", "prep_resize", ("m", "i", SPEC, ONE_VF)),
    ("resizes", "resize_instance", ("m", "i")),
    ("resizes", "finish_resize", ("m", "i")),
    ("resizes", "confirm_resize", ("m", "i")),
    ("resizes", "revert_resize", ("m", "i")),
    ("live_migrations", "check_can_live_migrate_source", ("m", "i", "hostb")),
    ("live_migrations", "rollback_live_migration_at_source", ("m", "i")),
    ("live_migrations", "check_can_live_migrate_destination", ("m", "i", SPEC, ONE_VF)),
    ("live_migrations", "live_migrate", ("m", "i", {"migration_uri": "fake://b"})),
    ("live_migrations", "post_live_migration_at_destination", ("m", "i")),
    ("live_migrations", "rollback_live_migration_at_destination", ("m", "i")),
    ("evacuations", "accept_rebuild", ("m", "i", SPEC, ONE_VF, fence)),
    ("evacuations", "rebuilds_arriving", ()),
    ("evacuations", "finish_rebuild", ("m",)),
    ("evacuations", "rebuild_instance", ("m", "i", SPEC, ONE_VF, fence)),
    ("evacuations", "resume_rebuilds", ()),
]


@pytest.mark.parametrize("part, name, args", STEPS, ids=[name for _, name, _ in STEPS])
def test_each_move_step_is_its_kind_of_moves_step_of_the_same_name(manager, part, name,
                                                                    args):
    recorder = Recorder()
    setattr(manager, part, recorder)
    assert getattr(manager, name)(*args) == {"answered_by": name}
    assert recorder.calls == [(name, args)]


def test_the_manager_has_a_step_for_each_step_of_its_parts():
    """No step of a kind of move unreachable through the manager."""
    public = {part: {n for n in vars(cls) if not n.startswith("_")}
              for part, cls in (("resizes", Resizes), ("live_migrations", LiveMigrations),
                                ("evacuations", Evacuations))}
    assert public == {part: {name for p, name, _ in STEPS if p == part} for part in public}
