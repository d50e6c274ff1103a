"""Resize and cold migration (compute_agent/compute/resize.py) on the fake
driver, between two hosts and within one: each step on the side it
belongs to, a move ended once (confirmed or reverted), and a guest never
left running on devices given back."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from compute_agent.claims.model import Migration, MigrationRole, MigrationState, MoveKind
from compute_agent.compute.manager import ComputeManager
from compute_agent.compute.resize import check_not_ended_otherwise
from compute_agent.drivers.fake import FakeDriver
from compute_agent.exception import DevicesInUse, InvalidRequest, NoSuchInstance, RetryMismatch
from tests.unit.compute.trackers import (
    ONE_VF,
    SPEC,
    VF0,
    VF1,
    VGPU_HOST,
    VGPU_VF0,
    VGPU_VF1,
    manager_on,
    new_uuids,
    on_vgpu_vf,
    vf_pools,
    vgpu_pools,
)

RESIZED = {**SPEC, "vcpus": 2}


def test_a_move_ends_once():
    """The other ending step on a move ended one way is refused; the same
    step is its retry; a move not ended yet ends either way."""
    instance, migration = new_uuids(2)
    for state, ends_as in [(MigrationState.CONFIRMED, MigrationState.REVERTED),
                           (MigrationState.REVERTED, MigrationState.CONFIRMED)]:
        m = Migration(migration, instance, MoveKind.RESIZE, MigrationRole.BOTH, state)
        with pytest.raises(RetryMismatch) as caught:
            check_not_ended_otherwise(m, ends_as)
        assert caught.value.fields == ["method"]
        step = "confirm_resize" if state is MigrationState.CONFIRMED else "revert_resize"
        assert caught.value.recorded == (f"move {migration} was {state.value} here "
                                         f"({step}), not {ends_as.value}")
        assert check_not_ended_otherwise(m, state) is None
    for state in (MigrationState.ACTIVE, MigrationState.FINISHED):
        m = Migration(migration, instance, MoveKind.RESIZE, MigrationRole.BOTH, state)
        for ends_as in (MigrationState.CONFIRMED, MigrationState.REVERTED):
            assert check_not_ended_otherwise(m, ends_as) is None


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[ComputeManager]:
    with manager_on(tmp_path, vf_pools()) as m:
        yield m


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[tuple[ComputeManager, ComputeManager]]:
    """A source and a destination, each with the NIC's two VFs."""
    with ExitStack() as stack:
        managers = []
        for name in ("source", "destination"):
            (tmp_path / name).mkdir()
            managers.append(stack.enter_context(manager_on(tmp_path / name, vf_pools())))
        yield managers[0], managers[1]


def running_on(manager: ComputeManager, instance: str) -> set[str] | None:
    """The devices the instance's guest runs with here; None: no guest
    runs here."""
    state = manager.driver.guest_state(instance)
    if state is None or not state.running:
        return None
    return {r.id for r in state.live_resources}


def held(manager: ComputeManager) -> list[tuple[str, str]]:
    """Every live row on the host: device and owner."""
    return sorted((a.device_id, a.owner.value) for a in manager.tracker.snapshot()[1])


def moved(source: ComputeManager, destination: ComputeManager) -> tuple[str, str]:
    """An instance built on the source and resized to the destination, its
    guest running there, the move not yet confirmed or reverted."""
    instance, migration = new_uuids(2)
    source.build_instance(instance, SPEC, ONE_VF)
    destination.prep_resize(migration, instance, RESIZED, ONE_VF)
    source.resize_instance(migration, instance)
    destination.finish_resize(migration, instance)
    return instance, migration


# --- between two hosts -------------------------------------------------------------

def test_each_side_does_its_part_of_a_move_between_hosts(hosts):
    source, destination = hosts
    instance, migration = new_uuids(2)
    source.build_instance(instance, SPEC, ONE_VF)

    claimed = destination.prep_resize(migration, instance, RESIZED, ONE_VF)
    assert claimed["migration_uuid"] == migration
    assert [(a["device_id"], a["owner"], a["state"]) for a in claimed["assignments"]] == [
        (VF0, "instance", "claiming")]
    assert destination.tracker.migration(migration).role is MigrationRole.DESTINATION

    passed = source.resize_instance(migration, instance)
    assert [(a["device_id"], a["owner"]) for a in passed["assignments"]] == [
        (VF0, "migration")]
    assert source.tracker.migration(migration).role is MigrationRole.SOURCE
    assert running_on(source, instance) is None  # stopped, still defined
    assert source.driver.guest_state(instance) is not None

    finished = destination.finish_resize(migration, instance)
    assert (finished["spec"], finished["running"]) == (RESIZED, True)
    assert running_on(destination, instance) == {VF0}
    assert destination.tracker.migration(migration).state is MigrationState.FINISHED


def test_a_confirm_at_the_source_removes_the_guest_that_left_and_frees_its_devices(hosts):
    source, destination = hosts
    instance, migration = moved(source, destination)
    assert source.confirm_resize(migration, instance) == {
        "migration_uuid": migration, "state": "confirmed"}
    assert source.driver.guest_state(instance) is None
    assert not source.tracker.knows(instance)
    assert held(source) == []
    # A retried confirm finds the move still recorded, and answers the same;
    # a revert of it is no retry of anything.
    assert source.confirm_resize(migration, instance) == {
        "migration_uuid": migration, "state": "confirmed"}
    with pytest.raises(RetryMismatch, match="was confirmed here"):
        source.revert_resize(migration, instance)


def test_a_revert_at_the_destination_removes_its_guest_and_claim(hosts):
    source, destination = hosts
    instance, migration = moved(source, destination)
    assert destination.revert_resize(migration, instance) == {
        "migration_uuid": migration, "instance": None}
    assert destination.driver.guest_state(instance) is None
    assert not destination.tracker.knows(instance)
    assert held(destination) == []
    with pytest.raises(InvalidRequest, match="this move was reverted"):
        destination.finish_resize(migration, instance)


def test_a_revert_at_the_source_runs_the_guest_on_its_devices_again(hosts):
    source, destination = hosts
    instance, migration = moved(source, destination)
    destination.revert_resize(migration, instance)
    answer = source.revert_resize(migration, instance)
    assert (answer["instance"]["spec"], answer["instance"]["running"]) == (SPEC, True)
    assert running_on(source, instance) == {VF0}
    assert held(source) == [(VF0, "instance")]
    with pytest.raises(RetryMismatch, match="was reverted here"):
        source.confirm_resize(migration, instance)
    assert running_on(source, instance) == {VF0}


def test_each_step_is_refused_on_the_wrong_side(hosts):
    source, destination = hosts
    instance, migration = moved(source, destination)
    with pytest.raises(InvalidRequest, match="this host is the move's destination, not its "
                                             "source or both"):
        destination.resize_instance(migration, instance)
    with pytest.raises(InvalidRequest, match="this host is the move's source, not its "
                                             "destination or both"):
        source.finish_resize(migration, instance)


def test_a_step_of_an_unknown_instance_or_another_kind_of_move_is_refused(manager):
    instance, migration = new_uuids(2)
    with pytest.raises(NoSuchInstance):
        manager.resize_instance(migration, instance)
    manager.accept_rebuild(migration, instance, SPEC, ONE_VF)
    with pytest.raises(InvalidRequest, match="is a evacuation, not a resize"):
        manager.prep_resize(migration, instance, SPEC, ONE_VF)
    with pytest.raises(InvalidRequest, match="is a evacuation, not a resize"):
        manager.finish_resize(migration, instance)
    with pytest.raises(InvalidRequest, match="no such move on this host"):
        manager.finish_resize(new_uuids(1)[0], instance)


# --- within one host ---------------------------------------------------------------

def resized_here(manager: ComputeManager) -> tuple[str, str]:
    """Built on VF0, resized on this host to VF1; the guest not yet moved."""
    instance, migration = new_uuids(2)
    manager.build_instance(instance, SPEC, ONE_VF)
    manager.prep_resize(migration, instance, RESIZED, ONE_VF)
    return instance, migration


def test_a_confirm_within_one_host_keeps_the_old_devices_while_the_guest_runs_on_them(
        manager):
    """Not finished: the guest still runs on VF0. Nothing is given back."""
    instance, migration = resized_here(manager)
    before = manager.tracker.snapshot()
    with pytest.raises(DevicesInUse) as caught:
        manager.confirm_resize(migration, instance)
    assert caught.value.devices == [f"vf {VF0}"]
    assert manager.tracker.snapshot() == before
    manager.finish_resize(migration, instance)
    manager.confirm_resize(migration, instance)
    assert held(manager) == [(VF1, "instance")]
    assert running_on(manager, instance) == {VF1}


def test_a_revert_within_one_host_stops_a_guest_on_the_new_devices_first(manager):
    instance, migration = resized_here(manager)
    manager.resize_instance(migration, instance)
    manager.finish_resize(migration, instance)
    assert running_on(manager, instance) == {VF1}
    answer = manager.revert_resize(migration, instance)
    assert answer["instance"]["spec"] == SPEC
    assert running_on(manager, instance) == {VF0}
    assert held(manager) == [(VF0, "instance")]
    # Its retry answers the instance as it is, changing nothing.
    before = manager.tracker.snapshot()
    assert manager.revert_resize(migration, instance)["instance"]["running"] is True
    assert manager.tracker.snapshot() == before


def test_a_revert_within_one_host_before_the_guest_moved_keeps_it_on_its_devices(manager):
    instance, migration = resized_here(manager)
    manager.revert_resize(migration, instance)
    assert running_on(manager, instance) == {VF0}
    assert held(manager) == [(VF0, "instance")]


def test_a_revert_stops_the_guest_before_its_new_devices_are_given_back(manager,
                                                                       monkeypatch):
    """Given back under a running guest, a device could be handed out
    twice: the guest is stopped first."""
    instance, migration = resized_here(manager)
    manager.resize_instance(migration, instance)
    manager.finish_resize(migration, instance)
    revert_move = manager.tracker.revert_move
    running_when_given_back = []

    def watched(migration_uuid: str) -> list:
        running_when_given_back.append(running_on(manager, instance))
        return revert_move(migration_uuid)

    monkeypatch.setattr(manager.tracker, "revert_move", watched)
    manager.revert_resize(migration, instance)
    assert running_when_given_back == [None]
    assert running_on(manager, instance) == {VF0}


class StopsUntilTold(FakeDriver):
    """Guests stop when told to, until ``stopping`` is False: then they
    run on (a guest that ignores its shutdown)."""

    stopping = True

    def power_off(self, instance_uuid: str) -> None:
        if self.stopping:
            super().power_off(instance_uuid)


def test_a_revert_whose_guest_does_not_stop_gives_nothing_back(tmp_path):
    with manager_on(tmp_path, vf_pools(), StopsUntilTold()) as manager:
        instance, migration = resized_here(manager)
        manager.resize_instance(migration, instance)
        manager.finish_resize(migration, instance)
        manager.driver.stopping = False
        before = manager.tracker.snapshot()
        with pytest.raises(DevicesInUse) as caught:
            manager.revert_resize(migration, instance)
        assert caught.value.devices == [f"vf {VF1}"]
        assert manager.tracker.snapshot() == before


# --- vGPU types, written at the claim ----------------------------------------------

@pytest.fixture
def vgpus(tmp_path: Path) -> Iterator[ComputeManager]:
    with manager_on(tmp_path, vgpu_pools(), FakeDriver(VGPU_HOST)) as m:
        yield m


def test_a_confirmed_resize_clears_the_type_of_the_vf_it_gave_back(vgpus):
    instance, migration = new_uuids(2)
    vgpus.build_instance(instance, SPEC, on_vgpu_vf(VGPU_VF0))
    vgpus.prep_resize(migration, instance, RESIZED, on_vgpu_vf(VGPU_VF1))
    vgpus.resize_instance(migration, instance)
    vgpus.finish_resize(migration, instance)
    vgpus.confirm_resize(migration, instance)
    assert vgpus.driver.vgpu_types == {VGPU_VF1: "nvidia-557"}


def test_a_destinations_revert_clears_the_type_of_the_vf_it_claimed(vgpus):
    instance, migration = new_uuids(2)
    vgpus.prep_resize(migration, instance, RESIZED, on_vgpu_vf(VGPU_VF0))
    assert vgpus.driver.vgpu_types == {VGPU_VF0: "nvidia-557"}
    vgpus.revert_resize(migration, instance)
    assert vgpus.driver.vgpu_types == {}
