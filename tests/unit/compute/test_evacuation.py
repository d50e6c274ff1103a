"""Evacuation at its destination (compute_agent/compute/evacuation.py), on
the fake driver: the rebuild accepted (fenced first, the claim on disk),
the guest built and the move settled once, here or on resuming after a
failure; and which accepted rebuilds are left to resume."""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from compute_agent.claims.model import Migration, MigrationRole, MigrationState, MoveKind
from compute_agent.compute.evacuation import interrupted_rebuilds
from compute_agent.compute.manager import ComputeManager
from compute_agent.drivers.base import GuestSpec
from compute_agent.drivers.fake import FakeDriver
from compute_agent.exception import InvalidRequest, MoveInProgress, SourceHostUp
from tests.unit.compute.trackers import ONE_VF, SPEC, VF0, manager_on, new_uuids, vf_pools


def test_the_rebuilds_left_to_resume_are_this_hosts_unsettled_evacuations_no_one_builds():
    def move(kind=MoveKind.EVACUATION, role=MigrationRole.DESTINATION,
             state=MigrationState.ACTIVE) -> Migration:
        migration, instance = new_uuids(2)
        return Migration(migration, instance, kind, role, state)

    active, finished, in_flight = move(), move(state=MigrationState.FINISHED), move()
    others = [move(state=MigrationState.CONFIRMED), move(state=MigrationState.REVERTED),
              move(kind=MoveKind.RESIZE), move(kind=MoveKind.LIVE_MIGRATION),
              move(role=MigrationRole.SOURCE), move(role=MigrationRole.BOTH)]
    found = interrupted_rebuilds([*others, finished, in_flight, active], {in_flight.uuid})
    assert found == sorted([active, finished], key=lambda m: m.uuid)


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[ComputeManager]:
    with manager_on(tmp_path, vf_pools()) as m:
        yield m


class Fence:
    """The source's fence; ``up``: the source answered its heartbeat."""

    def __init__(self, manager: ComputeManager, up: bool = False) -> None:
        self.manager = manager
        self.up = up
        # What the destination said was arriving, each time it was asked.
        self.arriving: list[frozenset[str]] = []

    def __call__(self) -> None:
        self.arriving.append(self.manager.rebuilds_arriving())
        if self.up:
            raise SourceHostUp("hosta", 60)


def running_on(manager: ComputeManager, instance: str) -> set[str] | None:
    state = manager.driver.guest_state(instance)
    if state is None or not state.running:
        return None
    return {r.id for r in state.live_resources}


def test_a_rebuild_is_accepted_after_the_fence_and_built_once(manager):
    instance, migration = new_uuids(2)
    fence = Fence(manager)
    answer = manager.accept_rebuild(migration, instance, SPEC, ONE_VF, fence)
    assert (answer["migration_uuid"], answer["instance_uuid"], answer["accepted"]) == (
        migration, instance, True)
    assert [(a["device_id"], a["state"]) for a in answer["assignments"]] == [
        (VF0, "claiming")]
    # While the fence waited, the instance was arriving; no longer.
    assert fence.arriving == [frozenset({instance})]
    assert manager.rebuilds_arriving() == frozenset()
    m = manager.tracker.migration(migration)
    assert (m.kind, m.role, m.state) == (MoveKind.EVACUATION, MigrationRole.DESTINATION,
                                         MigrationState.ACTIVE)
    assert running_on(manager, instance) is None  # built after the answer

    built = manager.finish_rebuild(migration)
    assert built is not None and built["running"] is True
    assert running_on(manager, instance) == {VF0}
    assert manager.tracker.migration(migration).state is MigrationState.CONFIRMED
    # Settled: finishing again builds nothing more (a guest stopped since
    # stays stopped); a retried accept is answered without the fence.
    manager.driver.power_off(instance)
    assert manager.finish_rebuild(migration)["running"] is False
    manager.accept_rebuild(migration, instance, SPEC, ONE_VF, fence)
    assert len(fence.arriving) == 1


def test_a_rebuild_whose_source_is_up_is_refused_before_anything_is_claimed(manager):
    instance, migration = new_uuids(2)
    with pytest.raises(SourceHostUp):
        manager.accept_rebuild(migration, instance, SPEC, ONE_VF, Fence(manager, up=True))
    assert manager.tracker.snapshot() == ({}, [], {})
    assert manager.rebuilds_arriving() == frozenset()


def test_an_instance_with_a_guest_here_is_not_evacuated_here(manager):
    """A guest the store does not know: refused before the fence is asked."""
    instance, migration = new_uuids(2)
    manager.driver.spawn(GuestSpec(instance, "left-over", 1, 512))
    fence = Fence(manager)
    with pytest.raises(InvalidRequest, match="has a guest on this host"):
        manager.accept_rebuild(migration, instance, SPEC, ONE_VF, fence)
    assert fence.arriving == []
    assert manager.tracker.snapshot() == ({}, [], {})


def test_a_second_evacuation_under_a_settled_ones_name_is_fenced_again(manager):
    """The instance evacuated here left since, and is evacuated again from
    the same source: a new move under the first one's name."""
    instance, migration, resize = new_uuids(3)
    fence = Fence(manager)
    manager.rebuild_instance(migration, instance, SPEC, ONE_VF, fence)
    # It leaves by a resize to another host; this host keeps its moves.
    manager.resize_instance(resize, instance)
    manager.confirm_resize(resize, instance)
    assert manager.tracker.migration(migration).state is MigrationState.CONFIRMED
    assert not manager.tracker.knows(instance)

    manager.rebuild_instance(migration, instance, SPEC, ONE_VF, fence)
    assert len(fence.arriving) == 2
    assert running_on(manager, instance) == {VF0}
    assert manager.tracker.migration(migration).state is MigrationState.CONFIRMED


class BuildsWhileBuilding(FakeDriver):
    """A spawn during which another caller asks for the same move
    (``meanwhile``): what it was answered, or raised, is kept."""

    def __init__(self) -> None:
        super().__init__()
        self.meanwhile: Callable[[], object] = lambda: None
        self.answered: list[object] = []

    def spawn(self, guest: GuestSpec) -> None:
        call, self.meanwhile = self.meanwhile, lambda: None  # once
        try:
            self.answered.append(call())
        except MoveInProgress as e:
            self.answered.append(e)
        super().spawn(guest)


@pytest.fixture
def building(tmp_path: Path) -> Iterator[ComputeManager]:
    with manager_on(tmp_path, vf_pools(), BuildsWhileBuilding()) as m:
        yield m


def test_a_move_is_built_by_one_caller_at_a_time(building):
    instance, migration = new_uuids(2)
    building.accept_rebuild(migration, instance, SPEC, ONE_VF)
    building.driver.meanwhile = lambda: building.finish_rebuild(migration)
    done = building.finish_rebuild(migration)
    assert building.driver.answered == [None]
    assert done is not None and done["running"] is True
    assert building.tracker.migration(migration).state is MigrationState.CONFIRMED


def test_a_rebuild_another_caller_is_building_is_answered_as_a_move_in_progress(building):
    """API 1.0's rebuild, accepted and built in one call, meets a build of
    the same move under way: let that one finish."""
    instance, migration = new_uuids(2)
    building.accept_rebuild(migration, instance, SPEC, ONE_VF)
    building.driver.meanwhile = lambda: building.rebuild_instance(migration, instance,
                                                                  SPEC, ONE_VF)
    building.finish_rebuild(migration)
    (refused,) = building.driver.answered
    assert isinstance(refused, MoveInProgress)
    assert (refused.instance_uuid, refused.migration_uuid) == (instance, migration)


class FailsToStartOnce(FakeDriver):
    failures = 1

    def spawn(self, guest: GuestSpec) -> None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("internal error: qemu unexpectedly closed the monitor")
        super().spawn(guest)


def test_a_rebuild_that_failed_is_resumed_on_the_next_pass(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="compute_agent.compute.evacuation")
    with manager_on(tmp_path, vf_pools(), FailsToStartOnce()) as manager:
        instance, migration = new_uuids(2)
        manager.accept_rebuild(migration, instance, SPEC, ONE_VF)
        with pytest.raises(RuntimeError):
            manager.finish_rebuild(migration)
        assert manager.tracker.migration(migration).state is MigrationState.ACTIVE
        manager.driver.failures = 1
        assert manager.resume_rebuilds() == []
        assert manager.resume_rebuilds() == [migration]
        assert running_on(manager, instance) == {VF0}
        assert manager.tracker.migration(migration).state is MigrationState.CONFIRMED
        assert manager.resume_rebuilds() == []
        assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
            (logging.WARNING, f"Evacuation {migration} of instance {instance} not resumed "
                              "yet: internal error: qemu unexpectedly closed the monitor"),
            (logging.INFO, f"Evacuation {migration} of instance {instance} resumed: "
                           "guest built, move completed")]
