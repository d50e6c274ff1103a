"""The evacuation rules both ends share (compute_agent/moves/evacuation.py), pure."""
from __future__ import annotations

import uuid

import pytest

from compute_agent.claims.model import Migration, MigrationRole, MigrationState, MoveKind
from compute_agent.moves.evacuation import (
    DestinationRecord,
    destination_record,
    evacuated_away,
    evacuation_migration_uuid,
    evacuation_name_free_again,
    interrupted_evacuations,
    spec_from_allocations,
)

ROOT, CELL0, CELL1, PF1 = (str(uuid.uuid4()) for _ in range(4))


def test_the_move_is_named_by_the_instance_and_the_source_alone():
    i = str(uuid.uuid4())
    assert evacuation_migration_uuid(i, ROOT) == evacuation_migration_uuid(i.upper(), ROOT)
    assert evacuation_migration_uuid(i, ROOT) != evacuation_migration_uuid(i, CELL0)
    assert evacuation_migration_uuid(i, ROOT) != i


def test_evacuated_away_needs_allocations_elsewhere_none_here_and_no_move_here():
    move = Migration(str(uuid.uuid4()), str(uuid.uuid4()), MoveKind.LIVE_MIGRATION,
                     MigrationRole.SOURCE, MigrationState.ACTIVE)
    assert evacuated_away(False, {"rp"}, None, True)
    assert not evacuated_away(True, {"rp"}, None, True)   # still holds ours
    assert not evacuated_away(False, set(), None, True)   # held nowhere: not "elsewhere"
    assert not evacuated_away(False, None, None, True)    # unknown
    assert not evacuated_away(False, {"rp"}, move, True)  # a move this host owns


def test_an_evacuation_name_is_free_again_once_settled_and_its_instance_left():
    def recorded(kind=MoveKind.EVACUATION, role=MigrationRole.DESTINATION,
                 state=MigrationState.CONFIRMED) -> Migration:
        return Migration(str(uuid.uuid4()), str(uuid.uuid4()), kind, role, state)

    evacuation = MoveKind.EVACUATION
    assert evacuation_name_free_again(recorded(), evacuation, instance_here=False)
    # A retry of the first: its instance is still here.
    assert not evacuation_name_free_again(recorded(), evacuation, instance_here=True)
    # Not settled yet: the first is still being rebuilt here.
    for state in (MigrationState.ACTIVE, MigrationState.FINISHED):
        assert not evacuation_name_free_again(recorded(state=state), evacuation, False)
    # Only an evacuation's derived name is ever asked for twice.
    assert not evacuation_name_free_again(recorded(kind=MoveKind.RESIZE), evacuation, False)
    assert not evacuation_name_free_again(recorded(), MoveKind.RESIZE, False)
    assert not evacuation_name_free_again(recorded(role=MigrationRole.BOTH), evacuation,
                                          False)


def test_bug_a_source_killed_before_recording_its_resize_gave_the_instance_up():
    """Found by the crash loop (seed 5): a cross-host resize's source killed
    after the conductor's allocation swap and before resize_instance was on
    its disk came back, found the instance's allocations all on the
    destination and no move of its own, took it for evacuated and destroyed
    its guest. Only the evacuation's own hold on this host says evacuated."""
    assert not evacuated_away(False, {"rp"}, None, False)


def test_the_spec_sums_cpus_and_memory():
    i = str(uuid.uuid4())
    spec = spec_from_allocations(i, {CELL0: {"PCPU": 1, "MEMORY_MB": 512},
                                     CELL1: {"VCPU": 2, "MEMORY_MB": 1024},
                                     PF1: {"SRIOV_NET_VF": 1}})
    assert spec == {"name": f"instance-{i}", "vcpus": 3, "memory_mb": 1536}
    with pytest.raises(ValueError, match="no CPU"):
        spec_from_allocations(i, {PF1: {"SRIOV_NET_VF": 1}})


# --- the conductor's second run ---------------------------------------------

def test_an_interrupted_evacuation_is_found_by_its_move_on_the_source():
    moved, done_elsewhere, stranger = (str(uuid.uuid4()) for _ in range(3))
    dest, other = str(uuid.uuid4()), str(uuid.uuid4())
    on_source = {CELL0: {"VCPU": 1, "MEMORY_MB": 256}}
    on_dest = {"dest-cell": {"VCPU": 1, "MEMORY_MB": 256}}
    migrations = {evacuation_migration_uuid(moved, ROOT): on_source,
                  # a move of another source's evacuation: not this source's
                  evacuation_migration_uuid(done_elsewhere, CELL1): on_source}
    found = interrupted_evacuations(ROOT, migrations, {
        dest: {moved: on_dest, stranger: on_dest},
        other: {done_elsewhere: on_dest},
        ROOT: {moved: on_source}})  # the source itself is never a destination
    assert [(f.instance, f.migration, f.destination_root) for f in found] == [
        (moved, evacuation_migration_uuid(moved, ROOT), dest)]
    assert found[0].destination_allocations == on_dest
    assert found[0].source_allocations == on_source


def test_no_migration_on_the_source_means_nothing_interrupted():
    i = str(uuid.uuid4())
    assert interrupted_evacuations(ROOT, {}, {"dest": {i: {}}}) == []


def view(running: bool, *moves: tuple[str, str]) -> dict:
    return {"running": running,
            "migrations": [{"uuid": u, "state": state} for u, state in moves]}


def test_what_the_destination_has_of_an_interrupted_evacuation():
    m = str(uuid.uuid4())
    assert destination_record(None, m) is DestinationRecord.NONE
    assert destination_record(view(True, (m, "confirmed")), m) is DestinationRecord.DONE
    assert destination_record(view(False, (m, "confirmed")), m) \
        is DestinationRecord.ACCEPTED  # its guest is not running yet
    assert destination_record(view(True, (m, "active")), m) is DestinationRecord.ACCEPTED
    assert destination_record(view(False, (m, "finished")), m) \
        is DestinationRecord.ACCEPTED
    assert destination_record(view(True, (str(uuid.uuid4()), "confirmed")), m) \
        is DestinationRecord.OTHER
    assert destination_record(view(True), m) is DestinationRecord.OTHER
