"""What the tracker and the move steps check of a call before deciding
anything (compute_agent/compute/checks.py), pure: its uuids, the move it
names, and whether it retries an earlier call that asked the same."""
from __future__ import annotations

import pytest

from compute_agent.claims.model import (
    Migration,
    MigrationRole,
    MigrationState,
    MoveKind,
    RequestDigest,
)
from compute_agent.compute.checks import (
    check_move_of,
    check_one_consumer,
    check_retry,
    check_uuid,
)
from compute_agent.exception import InvalidRequest, RetryMismatch
from tests.unit.compute.trackers import SPEC, new_uuids


def test_a_uuid_is_answered_in_its_canonical_form():
    (u,) = new_uuids(1)
    assert check_uuid(u.upper(), "instance_uuid") == u
    assert check_uuid("{" + u.replace("-", "") + "}", "instance_uuid") == u


@pytest.mark.parametrize("value", ["not-a-uuid", "", 42, None, ["x"]])
def test_anything_else_is_refused_naming_the_field(value):
    with pytest.raises(InvalidRequest) as caught:
        check_uuid(value, "migration_uuid")
    assert (caught.value.field, caught.value.value, caught.value.reason) == (
        "migration_uuid", value, "must be a UUID")


def move_of(instance: str) -> Migration:
    (migration,) = new_uuids(1)
    return Migration(migration, instance, MoveKind.RESIZE, MigrationRole.BOTH,
                     MigrationState.ACTIVE)


def test_a_move_of_the_instance_named_is_answered():
    (instance,) = new_uuids(1)
    m = move_of(instance)
    assert check_move_of(m, instance) is m
    assert check_move_of(m, instance.upper()) is m


def test_a_move_of_another_instance_is_refused_naming_whose_it_is():
    instance, other = new_uuids(2)
    m = move_of(instance)
    with pytest.raises(InvalidRequest) as caught:
        check_move_of(m, other)
    assert (caught.value.field, caught.value.value, caught.value.reason) == (
        "instance_uuid", other, f"migration {m.uuid} moves instance {instance}")
    with pytest.raises(InvalidRequest, match="must be a UUID"):
        check_move_of(m, "not-a-uuid")


def test_a_uuid_taken_here_by_the_other_kind_of_consumer_is_refused():
    taken, free = new_uuids(2)
    assert check_one_consumer(free, "migration_uuid", {taken}, "an instance's uuid") is None
    with pytest.raises(InvalidRequest) as caught:
        check_one_consumer(taken, "migration_uuid", {taken}, "an instance's uuid")
    assert (caught.value.field, caught.value.value) == ("migration_uuid", taken)
    assert caught.value.reason == ("is an instance's uuid on this host; an instance "
                                   "and a move never share a uuid")


def test_a_retry_asking_the_same_is_answered_and_one_asking_otherwise_is_refused():
    (instance,) = new_uuids(1)
    recorded = RequestDigest.of(spec=SPEC, allocations={"pf": 1})
    assert check_retry(recorded, RequestDigest.of(spec=dict(SPEC), allocations={"pf": 1}),
                       instance, "built here") is None
    with pytest.raises(RetryMismatch) as caught:
        check_retry(recorded, RequestDigest.of(spec={**SPEC, "vcpus": 2},
                                               allocations={"pf": 2}),
                    instance, f"instance {instance} was built here by an earlier call")
    assert caught.value.uuid == instance
    assert caught.value.fields == ["allocations", "spec.vcpus"]
    assert caught.value.recorded == f"instance {instance} was built here by an earlier call"


def test_a_record_made_before_requests_were_recorded_answers_any_retry():
    """A store of schema 6 or older kept no request: a retry cannot be
    compared, and is answered as before."""
    (instance,) = new_uuids(1)
    assert check_retry(None, RequestDigest.of(spec=SPEC), instance, "built here") is None
