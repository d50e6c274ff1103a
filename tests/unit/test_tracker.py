"""The tracker on a real store: what an assignment records of its device."""
import uuid

import pytest

from agent import state
from agent.claims import Pool, Slot
from agent.manager import guest_spec
from agent.state import Store
from agent.tracker import Tracker
from drivers.base import DeviceDetail, DeviceKind

PF = "0b9b9f2e-5d55-4c1c-9b7e-6a2b1f0d3c44"


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
