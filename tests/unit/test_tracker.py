"""The tracker on a real store: what an assignment records of its device."""
import uuid

import pytest

from agent import state
from agent.claims import Pool, Slot
from agent.manager import describe, guest_spec
from agent.state import Store
from agent.tracker import Tracker
from drivers.base import DeviceDetail, DeviceKind

PF = "0b9b9f2e-5d55-4c1c-9b7e-6a2b1f0d3c44"
ROOT = "5e1c0c5a-8a4e-4d4b-9c0e-2f1d6b7a9c31"


@pytest.fixture
def tracker(tmp_path):
    store = Store(tmp_path / "state.db")
    t = Tracker(store, "boot-1")
    t.set_pools({PF: {"SRIOV_NET_VF": Pool(
        "cmp_0000:81:00.0", "SRIOV_NET_VF", DeviceKind.VF, 2,
        (Slot("0000:81:10.0", numa_node=0), Slot("0000:81:10.1", numa_node=0)), 0)}})
    yield t
    store.close()


def test_a_device_on_numa_node_0_is_recorded_on_node_0(tracker):
    inst = str(uuid.uuid4())
    spec = {"name": "vm", "vcpus": 1, "memory_mb": 512}
    rows = tracker.claim_build(inst, spec, {PF: {"resources": {"SRIOV_NET_VF": 1}}})
    assert [a.detail for a in rows] == [DeviceDetail(numa_node=0)]
    stored = tracker.store.read(state.live_assignments)
    assert [a.detail for a in stored] == [DeviceDetail(numa_node=0)]
    (device,) = guest_spec(inst, spec, stored).devices
    assert device.detail.numa_node == 0


def test_the_hosts_own_resources_are_shared_and_stay_out_of_the_guest(tmp_path):
    store = Store(tmp_path / "state.db")
    t = Tracker(store, "boot-1")
    t.set_pools({ROOT: {"DISK_GB": Pool("cmp", "DISK_GB", DeviceKind.HOST_RESOURCES, 100)}})
    spec = {"name": "vm", "vcpus": 1, "memory_mb": 512}
    try:
        for _ in range(2):  # each instance holds an amount, not the device
            inst = str(uuid.uuid4())
            (row,) = t.claim_build(inst, spec, {ROOT: {"resources": {"DISK_GB": 60}}})
            assert (row.kind, row.device_id, row.amount) == (
                DeviceKind.HOST_RESOURCES, "host", 60)
            assert guest_spec(inst, spec, [row]).devices == ()
            # The RPC answer names it as before it had a kind of its own.
            assert [(d["kind"], d["device_id"]) for d in describe([row])] == [
                ("numa", "host")]
    finally:
        store.close()
