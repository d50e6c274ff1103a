"""The tracker on a real store: what an assignment records of its device."""
import uuid

import pytest

from agent import state
from agent.claims import Pool, Slot
from agent.manager import guest_spec
from agent.state import Store
from agent.tracker import Tracker
from drivers.base import DeviceKind

PF = "0b9b9f2e-5d55-4c1c-9b7e-6a2b1f0d3c44"


SPEC = {"name": "vm", "vcpus": 1, "memory_mb": 512}
ONE_VF = {PF: {"resources": {"SRIOV_NET_VF": 1}}}


def pools() -> dict:
    return {PF: {"SRIOV_NET_VF": Pool(
        "cmp_0000:81:00.0", "SRIOV_NET_VF", DeviceKind.VF, 2,
        (Slot("0000:81:10.0", numa_node=0), Slot("0000:81:10.1", numa_node=0)), 0)}}


@pytest.fixture
def tracker(tmp_path):
    store = Store(tmp_path / "state.db")
    t = Tracker(store, "boot-1")
    t.set_pools(pools())
    yield t
    store.close()


def test_a_device_on_numa_node_0_is_recorded_on_node_0(tracker):
    inst = str(uuid.uuid4())
    rows = tracker.claim_build(inst, SPEC, ONE_VF)
    assert [a.detail for a in rows] == [{"numa_node": 0}]
    stored = tracker.store.read(state.live_assignments)
    assert [a.detail for a in stored] == [{"numa_node": 0}]
    (device,) = guest_spec(inst, SPEC, stored).devices
    assert device.numa_node == 0


def boots(rows) -> set[tuple[str, str]]:
    return {(a.instance_uuid, a.boot_id) for a in rows}


def test_rebind_boot_moves_the_instances_rows_to_the_new_boot(tmp_path):
    """After a reboot (an agent on a new boot id, the same store), the
    rebound instance's rows carry the new boot id, in the store and in
    memory; another instance's rows keep theirs."""
    path = tmp_path / "state.db"
    rebound, other = str(uuid.uuid4()), str(uuid.uuid4())
    store = Store(path)
    before = Tracker(store, "boot-1")
    before.set_pools(pools())
    before.claim_build(rebound, SPEC, ONE_VF)
    before.claim_build(other, SPEC, ONE_VF)
    store.close()

    store = Store(path)
    try:
        after = Tracker(store, "boot-2")
        after.rebind_boot(rebound)
        want = {(rebound, "boot-2"), (other, "boot-1")}
        assert boots(store.read(state.live_assignments)) == want
        assert boots(after.snapshot()[1]) == want
    finally:
        store.close()
