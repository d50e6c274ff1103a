"""The claim model's request digests: what a retry is compared with."""
from compute_agent.claims.model import RequestDigest

SPEC = {"name": "vm", "vcpus": 2, "memory_mb": 1024}
ALLOCATIONS = {"rp-1": {"resources": {"VCPU": 2, "MEMORY_MB": 1024}}}


def test_the_same_payload_in_another_key_order_has_the_same_digest():
    again = {"rp-1": {"resources": {"MEMORY_MB": 1024, "VCPU": 2}}}
    first = RequestDigest.of(spec=SPEC, allocations=ALLOCATIONS)
    assert first == RequestDigest.of(spec=dict(reversed(SPEC.items())), allocations=again)
    assert first.differing(RequestDigest.of(spec=SPEC, allocations=again)) == []


def test_the_fields_that_differ_are_named_a_spec_key_by_key():
    first = RequestDigest.of(spec=SPEC, allocations=ALLOCATIONS)
    other = RequestDigest.of(spec={**SPEC, "vcpus": 3, "name": "x"},
                             allocations={"rp-1": {"resources": {"VCPU": 3,
                                                                 "MEMORY_MB": 1024}}})
    assert first.differing(other) == ["allocations", "spec.name", "spec.vcpus"]
    assert RequestDigest.of(destination_host="b").differing(
        RequestDigest.of(destination_host="c")) == ["destination_host"]


def test_a_digest_is_kept_as_json_and_read_back_whole():
    first = RequestDigest.of(spec=SPEC, allocations=ALLOCATIONS)
    assert RequestDigest.from_json(first.to_json()) == first
    assert RequestDigest.from_json(None) is None
