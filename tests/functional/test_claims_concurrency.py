"""Concurrent claims on one host with exactly enough devices, and bad input.

The host has exactly 32 VFs and room for exactly 32 vGPUs (no mdev exists
at first). Each claim takes 1 VF and 1 vGPU. Threads are released together
by a barrier; every claim must get distinct devices, one more must be
refused with ClaimFailed and leave the store exactly as it was. After the
first round the agent's pools are refreshed from the driver (as its update
cycle does), so later rounds must reuse the 32 mdevs that now exist rather
than create new ones.
"""
from __future__ import annotations

import threading
import uuid as uuid_lib

import pytest

from compute_agent.claims.model import AssignmentState
from compute_agent.drivers.base import DeviceKind
from compute_agent.exception import ClaimFailed, InvalidRequest
from tests.functional.claims_world import host_dict, make_world, new_uuid, spec
from tests.writer import hold_writer, wait_queued

N = 32
ROUNDS = 40
CLAIM = {"pf": {"SRIOV_NET_VF": 1}, "gpu": {"VGPU": 1}}


@pytest.fixture
def world(tmp_path):
    w = make_world(tmp_path, "conc", host_dict(vfs=N, vgpus=N, existing_mdev=False))
    yield w
    w.stop()


def held_devices(w):
    return [(a.provider_uuid, a.resource_class, a.device_id) for a in w.live()
            if not a.kind.counted]


def claim_all_at_once(w, count: int):
    """``count`` builds released together; returns (ok uuids, refusals,
    other errors)."""
    barrier = threading.Barrier(count)
    ok, refused, errors = [], [], []
    lock = threading.Lock()

    def one():
        uuid = new_uuid()
        barrier.wait()
        try:
            w.manager.build_instance(uuid, spec(f"vm-{uuid[:6]}"), w.allocations(CLAIM))
        except ClaimFailed as e:
            with lock:
                refused.append((uuid, e))
        except Exception as e:
            with lock:
                errors.append((uuid, e))
        else:
            with lock:
                ok.append(uuid)

    threads = [threading.Thread(target=one) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a claimer hung"
    return ok, refused, errors


def test_32_concurrent_claims_get_distinct_devices(world):
    w = world
    vfs = {s.device_id for s in w.pools[w.uuid("pf")]["SRIOV_NET_VF"].slots}
    assert len(vfs) == N
    first_mdevs = None
    for round_ in range(ROUNDS):
        # Every other round, 33 claimers race for 32 devices of each kind.
        racers = N + 1 if round_ % 2 else N
        ok, refused, errors = claim_all_at_once(w, racers)
        assert not errors, errors
        assert len(ok) == N and len(refused) == racers - N, (round_, len(ok), refused)
        for uuid, _ in refused:
            assert uuid not in w.instances()

        rows = w.live()
        assert {a.instance_uuid for a in rows} == set(ok)
        held = held_devices(w)
        assert len(held) == len(set(held)) == 2 * N, f"round {round_}: a device twice"
        assert {a.device_id for a in rows if a.kind is DeviceKind.VF} == vfs
        mdevs = {a.device_id for a in rows if a.kind is DeviceKind.MDEV}
        assert len(mdevs) == N
        assert mdevs <= w.existing_mdevs(), "a claimed mdev was not created"
        if first_mdevs is None:
            first_mdevs = mdevs
        else:
            # Existing unassigned mdevs go before creating new ones.
            assert mdevs == first_mdevs, f"round {round_}: new mdevs created"
        guests = w.driver.list_guests()
        assert set(guests) == set(ok)
        for uuid in ok:
            assert guests[uuid].live == guests[uuid].saved == {
                a.id for a in rows if a.instance_uuid == uuid}
            assert all(a.state is AssignmentState.CLAIMED for a in rows if a.instance_uuid == uuid)

        # One more is refused, whatever it is, and changes nothing.
        before, guests_before = w.store.dump(), w.driver.list_guests()
        extra = new_uuid()
        with pytest.raises(ClaimFailed):
            w.manager.build_instance(extra, spec(), w.allocations(CLAIM))
        with pytest.raises(ClaimFailed):
            w.manager.build_instance(extra, spec(), w.allocations(
                {"gpu": {"VGPU": 1}}))
        assert w.store.dump() == before
        assert w.driver.list_guests() == guests_before
        if round_ % 3 == 2:
            w.restart()  # a restart between rounds loses nothing
            assert w.store.dump() == before

        # Delete everything, also concurrently.
        deleters = [threading.Thread(target=w.manager.delete_instance, args=(u,))
                    for u in ok]
        for t in deleters:
            t.start()
        for t in deleters:
            t.join(60)
        assert w.live() == [] and w.instances() == {}
        assert w.driver.list_guests() == {}
        # The update cycle refreshes the pools: the 32 mdevs now exist.
        w.tracker.set_pools(w.build_pools())


def test_concurrent_claims_in_one_batch_for_one_instance_do_not_double(world):
    """32 threads retrying the same build at once get one set of devices."""
    w = world
    uuid = new_uuid()
    barrier = threading.Barrier(N)
    answers, errors = [], []

    def one():
        barrier.wait()
        try:
            answers.append(tuple(a.id for a in w.tracker.claim_build(
                uuid, spec(), w.allocations(CLAIM))))
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(N)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(set(answers)) == 1
    assert len(held_devices(w)) == 2


def test_a_device_given_back_and_claimed_at_once_is_written_in_that_order(tmp_path):
    """The release of the only VF and another instance's claim of it are
    decided in one batch, release first: the claim gets the VF, and both
    writes land (the store would refuse the claim's insert if it reached
    the disk before the release)."""
    w = make_world(tmp_path, "order", host_dict(vfs=1, vgpus=4, existing_mdev=False))
    try:
        first, second = new_uuid(), new_uuid()
        one_vf = w.allocations({"pf": {"SRIOV_NET_VF": 1}})
        w.tracker.claim_build(first, spec(), one_vf)
        commits = w.tracker.store._commits
        gate = hold_writer(commits)
        batches = commits.batches
        errors = []

        def run(call, *args):
            try:
                call(*args)
            except Exception as e:
                errors.append(e)

        callers = [threading.Thread(target=run, args=(w.tracker.release_instance, first)),
                   threading.Thread(target=run, args=(w.tracker.claim_build, second,
                                                      spec(), one_vf))]
        for n, caller in enumerate(callers, 1):
            caller.start()
            wait_queued(commits, n)
        gate.set()
        for t in callers:
            t.join(10)
        assert not errors, errors
        assert commits.batches - batches == 2  # the holding job's, then both in one
        rows = w.live()
        assert [(a.instance_uuid, a.kind) for a in rows] == [(second, DeviceKind.VF)]
    finally:
        w.stop()


# --- bad input ------------------------------------------------------------------

def _refused(w, call, field_part: str):
    before, guests = w.store.dump(), w.driver.list_guests()
    with pytest.raises(InvalidRequest) as e:
        call()
    assert field_part in e.value.field, (e.value.field, str(e.value))
    assert e.value.field in str(e.value)
    assert w.store.dump() == before, "a refused request changed the store"
    assert w.driver.list_guests() == guests
    return e.value


def bad_cases(w):
    pf = w.uuid("pf")
    stranger = str(uuid_lib.uuid4())
    return [
        # (allocations, spec, the field the error must name)
        ({stranger: {"resources": {"SRIOV_NET_VF": 1}}}, spec(), f"allocations.{stranger}"),
        ({pf: {"resources": {"CUSTOM_NOPE": 1}}}, spec(), f"allocations.{pf}.resources"),
        ({pf: {"resources": {"NOT_A_CLASS": 1}}}, spec(), f"allocations.{pf}.resources"),
        ({pf: {"resources": {"SRIOV_NET_VF": -1}}}, spec(),
         f"allocations.{pf}.resources.SRIOV_NET_VF"),
        ({pf: {"resources": {"SRIOV_NET_VF": 0}}}, spec(),
         f"allocations.{pf}.resources.SRIOV_NET_VF"),
        ({pf: {"resources": {"SRIOV_NET_VF": True}}}, spec(),
         f"allocations.{pf}.resources.SRIOV_NET_VF"),
        ({pf: {"resources": {"SRIOV_NET_VF": 33}}}, spec(),
         f"allocations.{pf}.resources.SRIOV_NET_VF"),
        ({pf: {"resources": {"VGPU": 1}}}, spec(), f"allocations.{pf}.resources.VGPU"),
        ({}, spec(), "allocations"),
        ({pf: {}}, spec(), f"allocations.{pf}.resources"),
        (w.allocations(CLAIM), {"vcpus": 1, "memory_mb": 512}, "spec.name"),
        (w.allocations(CLAIM), {"name": "vm", "memory_mb": 512}, "spec.vcpus"),
        (w.allocations(CLAIM), {"name": "vm", "vcpus": 1}, "spec.memory_mb"),
        (w.allocations(CLAIM), {"name": "vm", "vcpus": -2, "memory_mb": 512}, "spec.vcpus"),
    ]


def test_bad_build_requests_are_refused_naming_the_field(world):
    w = world
    # Something already there, so that "unchanged" means something.
    w.manager.build_instance(new_uuid(), spec(), w.allocations(CLAIM))
    for allocations, s, field in bad_cases(w):
        _refused(w, lambda: w.manager.build_instance(new_uuid(), s, allocations), field)
    with pytest.raises(InvalidRequest) as e:
        w.manager.build_instance("not-a-uuid", spec(), w.allocations(CLAIM))
    assert e.value.field == "instance_uuid"


def test_bad_move_requests_are_refused_naming_the_field(world):
    w = world
    inst = new_uuid()
    w.manager.build_instance(inst, spec(), w.allocations(CLAIM))
    for allocations, s, field in bad_cases(w):
        _refused(w, lambda: w.manager.prep_resize(new_uuid(), inst, s, allocations), field)
        # A live migration comes from another host: an instance not here.
        _refused(w, lambda: w.manager.check_can_live_migrate_destination(
            new_uuid(), new_uuid(), s, allocations), field)
        _refused(w, lambda: w.manager.rebuild_instance(new_uuid(), inst, s, allocations),
                 field)
    # And the instance still moves normally afterwards.
    held = {a.id for a in w.live() if a.instance_uuid == inst}
    mig = new_uuid()
    w.manager.prep_resize(mig, inst, spec(vcpus=2), w.allocations(CLAIM))
    w.manager.resize_instance(mig, inst)
    w.manager.finish_resize(mig, inst)
    assert w.instances()[inst] == spec(vcpus=2)
    w.manager.revert_resize(mig, inst)
    assert {a.id for a in w.live() if a.instance_uuid == inst} == held
    assert w.instances()[inst] == spec()
    assert not w.migrations()[mig].open
