"""What an RPC payload must be: its shape, its schema, and the rules past
a schema, each refusal one InvalidRequest naming the field (pure)."""
from __future__ import annotations

import time
import uuid

import pytest

from compute_agent.exception import InvalidRequest
from compute_agent.rpc import schemas
from tests.unit.rpc.calls import ALLOCATIONS, INSTANCE, MIGRATION, PROVIDER, RESOURCES, SPEC


def refusal(schema: dict, payload: dict) -> str:
    with pytest.raises(InvalidRequest) as caught:
        schemas.checked(schemas.validator(schema), payload)
    return str(caught.value)


@pytest.mark.parametrize("schema, payload, field", [
    (schemas.INSTANCE, {"instance_uuid": INSTANCE + "\n"}, "instance_uuid"),
    (schemas.MOVE, {"migration_uuid": MIGRATION + "\n", "instance_uuid": INSTANCE},
     "migration_uuid"),
    (schemas.CLAIM, {"instance_uuid": INSTANCE, "spec": SPEC,
                     "allocations": {PROVIDER + "\n": {"resources": {"VCPU": 1}}}},
     "allocations"),
    (schemas.CLAIM, {"instance_uuid": INSTANCE, "spec": SPEC,
                     "allocations": {PROVIDER: {"resources": {"VCPU\n": 1}}}},
     f"allocations.{PROVIDER}.resources"),
])
def test_a_trailing_newline_is_refused_naming_the_field(schema, payload, field):
    assert refusal(schema, payload).startswith(f"{field}: ")


def test_upper_case_uuids_are_accepted_and_made_lower_case():
    payload = {"migration_uuid": MIGRATION.upper(), "instance_uuid": INSTANCE.upper(),
               "spec": SPEC, "allocations": {PROVIDER.upper(): {"resources": RESOURCES}}}
    assert schemas.checked(schemas.validator(schemas.MOVE_CLAIM), payload) == {
        "migration_uuid": MIGRATION, "instance_uuid": INSTANCE, "spec": SPEC,
        "allocations": ALLOCATIONS}


def test_a_provider_named_in_two_cases_is_refused():
    allocations = {PROVIDER: {"resources": {"VCPU": 1}},
                   PROVIDER.upper(): {"resources": {"MEMORY_MB": 1}}}
    message = refusal(schemas.CLAIM, {"instance_uuid": INSTANCE, "spec": SPEC,
                                      "allocations": allocations})
    assert message.startswith(f"allocations.{PROVIDER.upper()}: names a provider "
                              "already named")


def test_a_move_named_after_its_instance_is_refused():
    message = refusal(schemas.MOVE, {"migration_uuid": INSTANCE.upper(),
                                     "instance_uuid": INSTANCE})
    assert message.startswith("migration_uuid: is the instance's own uuid")


def test_a_spec_name_the_claim_would_refuse_is_refused_here():
    message = refusal(schemas.CLAIM, {"instance_uuid": INSTANCE,
                                      "spec": {**SPEC, "name": "a\x00b"},
                                      "allocations": ALLOCATIONS})
    assert message.startswith("spec.name: must be 1 to 255 printable characters")


def nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def test_a_deeply_nested_payload_is_refused_by_its_depth():
    payload = {"instance_uuid": INSTANCE, "spec": nested(5000), "allocations": ALLOCATIONS}
    assert refusal(schemas.CLAIM, payload) == (
        "spec.a.a.a.a.a: nested deeper than 6 levels (value: an object)")


def test_the_deepest_payload_a_call_takes_is_accepted():
    payload = {"instance_uuid": INSTANCE, "spec": SPEC, "allocations": ALLOCATIONS}
    assert schemas.checked(schemas.validator(schemas.CLAIM), payload) == payload


def test_the_deepest_payload_live_migrate_takes_is_accepted():
    device = {"resource_class": "VGPU", "device": {
        "assignment_id": "a1", "kind": "mdev", "device_id": str(uuid.uuid4()),
        "amount": 1, "cpus": [], "detail": {"numa_node": 0, "mdev_type": "nvidia-35"}}}
    payload = {"migration_uuid": str(uuid.uuid4()), "instance_uuid": INSTANCE,
               "destination": {"claimed": [device], "migration_uri": "qemu+tcp://b/system"}}
    checker = schemas.validator(schemas.LIVE_MIGRATE)
    assert schemas.checked(checker, payload) == payload
    # 1.0's form, without the destination, passes the schema (the manager
    # refuses it, naming the field).
    del payload["destination"]
    assert schemas.checked(checker, payload) == payload


def test_a_map_of_200000_keys_is_refused_by_its_size_at_once():
    huge = {str(uuid.uuid4()): {"resources": {"VCPU": 1}} for _ in range(200_000)}
    began = time.perf_counter()
    message = refusal(schemas.CLAIM, {"instance_uuid": INSTANCE, "spec": SPEC,
                                      "allocations": huge})
    assert time.perf_counter() - began < 0.5
    assert message == "allocations: has 200000 entries, at most 64 (value: an object)"


def test_too_many_resource_classes_are_refused_by_the_schema():
    resources = {f"CUSTOM_R{i}": 1 for i in range(33)}
    message = refusal(schemas.CLAIM, {"instance_uuid": INSTANCE, "spec": SPEC,
                                      "allocations": {PROVIDER: {"resources": resources}}})
    assert message == (f"allocations.{PROVIDER}.resources: has 33 entries, at most 32 "
                       "(value: an object)")




def claim(**changes: object) -> dict:
    return {"instance_uuid": INSTANCE, "spec": SPEC, "allocations": ALLOCATIONS, **changes}


def test_a_missing_field_is_refused_naming_it():
    payload = claim()
    del payload["allocations"]
    assert refusal(schemas.CLAIM, payload) == "allocations: missing (value: None)"
    assert refusal(schemas.CLAIM, claim(spec={"name": "a", "vcpus": 2})) == \
        "spec.memory_mb: missing (value: None)"


def test_an_unknown_field_is_refused_naming_it_and_showing_its_value():
    assert refusal(schemas.CLAIM, claim(zone="a" * 500)) == (
        "zone: unknown field (value: '" + "a" * 76 + "... (500 characters))")
    assert refusal(schemas.CLAIM, claim(spec={**SPEC, "disk_gb": 1})) == \
        "spec.disk_gb: unknown field (value: 1)"


def test_a_value_out_of_its_range_is_refused_naming_the_field():
    assert refusal(schemas.CLAIM, claim(spec={**SPEC, "vcpus": 0})) == \
        "spec.vcpus: 0 is less than the minimum of 1 (value: 0)"


def test_allocations_naming_no_provider_are_refused():
    assert refusal(schemas.CLAIM, claim(allocations={})) == \
        "allocations: has 0 entries, at least 1 (value: an object)"


def test_a_spec_that_is_not_what_its_allocations_carry_is_refused():
    allocations = {PROVIDER: {"resources": {"VCPU": 4, "MEMORY_MB": 1024}}}
    assert refusal(schemas.CLAIM, claim(allocations=allocations)).startswith(
        "spec.vcpus: must equal what the allocations carry on this host's providers")


def test_a_list_wider_than_any_call_takes_is_refused_by_its_size():
    payload = {"migration_uuid": MIGRATION, "instance_uuid": INSTANCE,
               "destination": {"claimed": [{}] * 65, "migration_uri": "qemu+tcp://b/system"}}
    assert refusal(schemas.LIVE_MIGRATE, payload) == (
        "destination.claimed: has 65 entries, at most 64 (value: a list)")


def test_a_device_address_is_made_lower_case_and_a_bad_one_refused():
    checker = schemas.validator(schemas.DEVICE)
    assert schemas.checked(checker, {"address": "0000:81:0A.1"}) == {"address": "0000:81:0a.1"}
    assert refusal(schemas.DEVICE, {"address": "0000:81:20.1"}).startswith("address: ")


def test_bug_a_key_not_allowed_was_refused_with_the_schemas_regular_expression():
    # jsonschema reports a key refused by propertyNames as its pattern's
    # error: the refusal showed the pattern, and the branch meant for it
    # never ran.
    assert refusal(schemas.CLAIM, claim(allocations={"cmp1": {"resources": RESOURCES}})) == \
        "allocations: has a key that is not allowed here (value: 'cmp1')"
    assert refusal(schemas.CLAIM, claim(allocations={PROVIDER: {"resources": {"vcpu": 2}}})) == \
        f"allocations.{PROVIDER}.resources: has a key that is not allowed here (value: 'vcpu')"
