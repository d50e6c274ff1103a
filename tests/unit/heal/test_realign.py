"""The store follows Placement after a reshape (compute_agent/heal/realign.py), without
Placement."""
from __future__ import annotations

from compute_agent.claims.choice import Pool, Slot
from compute_agent.claims.model import Assignment, AssignmentState, Owner
from compute_agent.drivers.base import DeviceDetail, DeviceKind
from compute_agent.heal.realign import DeviceIndex, misplaced, realign

ROOT, CELL0, CELL1, PF, PMEM_FLAT, PMEM0, PMEM1, GPU = (
    "root", "cell0", "cell1", "pf", "pmem-flat", "pmem0", "pmem1", "gpu")
VF_OLD, VF_NEW = "CUSTOM_NIC", "CUSTOM_PCI_8086_154C"
PMEM = "CUSTOM_PMEM_NAMESPACE_SMALL"


def nested_pools() -> dict:
    """Two cells with CPUs and memory, a PF's VFs under their new class, a
    namespace on each cell's pmem provider, and a GPU with one mdev."""
    cell = lambda name, n: {  # noqa: E731
        "VCPU": Pool(name, "VCPU", DeviceKind.NUMA, 16, numa_node=n),
        "MEMORY_MB": Pool(name, "MEMORY_MB", DeviceKind.NUMA, 4096, numa_node=n)}
    return {
        ROOT: {"DISK_GB": Pool("h", "DISK_GB", DeviceKind.HOST_RESOURCES, 100)},
        CELL0: cell("h_numa_0", 0), CELL1: cell("h_numa_1", 1),
        PF: {VF_NEW: Pool("h_pf", VF_NEW, DeviceKind.VF, 2,
                          (Slot("0000:81:10.0", 0), Slot("0000:81:10.1", 0)), 0)},
        PMEM0: {PMEM: Pool("h_pmem0", PMEM, DeviceKind.PMEM, 1,
                           (Slot("ns0", 0, 2**30, "/dev/dax0.0"),), 0)},
        PMEM1: {PMEM: Pool("h_pmem1", PMEM, DeviceKind.PMEM, 1,
                           (Slot("ns1", 1, 2**30, "/dev/dax1.0"),), 1)},
        GPU: {"VGPU": Pool("h_gpu", "VGPU", DeviceKind.MDEV, 4, (Slot("mdev-a", 1),), 1,
                           "0000:3b:00.0", "nvidia-35")},
    }


def row(consumer: str, rp: str, rc: str, kind: DeviceKind, device: str, amount: int = 1,
        detail: DeviceDetail = DeviceDetail()) -> Assignment:
    return Assignment(f"{consumer}-{rc}-{device}", consumer, consumer, Owner.INSTANCE,
                      None, rc, rp, kind, device, amount, AssignmentState.CLAIMED, "boot",
                      detail)


def flat_rows(consumer: str = "c1") -> list[Assignment]:
    """What a flat host's claims recorded: CPUs, memory and disk on the
    root, a VF under its old class, a namespace on the flat provider."""
    return [row(consumer, ROOT, "VCPU", DeviceKind.HOST_RESOURCES, "host", 2),
            row(consumer, ROOT, "MEMORY_MB", DeviceKind.HOST_RESOURCES, "host", 1024),
            row(consumer, ROOT, "DISK_GB", DeviceKind.HOST_RESOURCES, "host", 10),
            row(consumer, PF, VF_OLD, DeviceKind.VF, "0000:81:10.1"),
            row(consumer, PMEM_FLAT, PMEM, DeviceKind.PMEM, "ns1")]


HEALED = {"c1": {ROOT: {"DISK_GB": 10}, CELL1: {"VCPU": 2, "MEMORY_MB": 1024},
                 PF: {VF_NEW: 1}, PMEM1: {PMEM: 1}, "other-host": {"VCPU": 1}}}


def where(rows: list[Assignment]) -> dict[str, tuple]:
    return {a.id: (a.provider_uuid, a.resource_class, a.kind, a.device_id, a.amount)
            for a in rows}


def test_rows_follow_the_allocations_a_reshape_moved():
    index = DeviceIndex(nested_pools())
    rows = flat_rows()
    result = realign(misplaced(rows, index), HEALED, index)
    assert result.unaligned == []
    assert where(new for _, new in result.moved) == {
        "c1-VCPU-host": (CELL1, "VCPU", DeviceKind.NUMA, "1", 2),
        "c1-MEMORY_MB-host": (CELL1, "MEMORY_MB", DeviceKind.NUMA, "1", 1024),
        f"c1-{VF_OLD}-0000:81:10.1": (PF, VF_NEW, DeviceKind.VF, "0000:81:10.1", 1),
        "c1-CUSTOM_PMEM_NAMESPACE_SMALL-ns1": (PMEM1, PMEM, DeviceKind.PMEM, "ns1", 1)}
    moved = {new.id: new for _, new in result.moved}
    # The row as a claim from the new pool records it.
    assert moved["c1-CUSTOM_PMEM_NAMESPACE_SMALL-ns1"].detail.dev_path == "/dev/dax1.0"
    assert moved["c1-VCPU-host"].detail.numa_node == 1
    assert sorted(old.id for old, _ in result.moved) == sorted(
        a.id for a in rows if a.id in moved)


def test_rows_already_where_placement_holds_them_are_left_alone():
    index = DeviceIndex(nested_pools())
    result = realign(misplaced(flat_rows(), index), HEALED, index)
    aligned = [new for _, new in result.moved] + [flat_rows()[2]]
    assert misplaced(aligned, index) == []
    assert realign(aligned, HEALED, index).moved == []


def test_a_row_whose_provider_still_holds_the_allocation_stays_before_heal():
    """Unhealed: the model puts CPUs on the cells, Placement still on the
    root. The store agrees with Placement, so nothing moves."""
    index = DeviceIndex(nested_pools())
    unhealed = {"c1": {ROOT: {"VCPU": 2, "MEMORY_MB": 1024, "DISK_GB": 10},
                       PF: {VF_OLD: 1}, PMEM_FLAT: {PMEM: 1}}}
    rows = flat_rows()
    assert len(misplaced(rows, index)) == 4
    result = realign(misplaced(rows, index), unhealed, index)
    assert result.moved == [] and result.unaligned == []


def test_a_consumer_placement_holds_nothing_of_here_is_left_to_reconciliation():
    index = DeviceIndex(nested_pools())
    result = realign(flat_rows(), {"someone-else": {CELL0: {"VCPU": 1}}}, index)
    assert result.moved == [] and result.unaligned == []


def test_counted_amounts_split_over_two_cells_are_reported_not_guessed():
    index = DeviceIndex(nested_pools())
    split = {"c1": {**HEALED["c1"], CELL0: {"VCPU": 1}, CELL1: {"VCPU": 1,
                                                                 "MEMORY_MB": 1024}}}
    result = realign(misplaced(flat_rows(), index), split, index)
    [unaligned] = result.unaligned
    assert unaligned.row.id == "c1-VCPU-host"
    assert "2 providers" in str(unaligned)
    assert "c1-VCPU-host" not in {new.id for _, new in result.moved}


def test_a_device_the_model_does_not_have_is_reported():
    index = DeviceIndex(nested_pools())
    gone = row("c1", PMEM_FLAT, PMEM, DeviceKind.PMEM, "ns9")
    result = realign([gone], HEALED, index)
    assert [u.row for u in result.unaligned] == [gone]
    assert "no provider" in result.unaligned[0].reason


def test_a_device_whose_provider_holds_no_allocation_of_the_consumer_is_reported():
    index = DeviceIndex(nested_pools())
    # ns0 sits on cell 0's provider, but the consumer holds its namespace on cell 1's.
    wrong = row("c1", PMEM_FLAT, PMEM, DeviceKind.PMEM, "ns0")
    result = realign([wrong], HEALED, index)
    assert [u.row for u in result.unaligned] == [wrong] and result.moved == []


def test_more_rows_than_the_consumer_holds_there_are_reported():
    index = DeviceIndex(nested_pools())
    # Two VF rows but one VF allocated: which one is stale is a guess.
    rows = [row("c1", PF, VF_OLD, DeviceKind.VF, "0000:81:10.0"),
            row("c1", PF, VF_OLD, DeviceKind.VF, "0000:81:10.1")]
    result = realign(rows, HEALED, index)
    assert result.moved == []
    assert sorted(u.row.id for u in result.unaligned) == sorted(a.id for a in rows)
    assert "would hold 2" in result.unaligned[0].reason


def test_an_mdev_not_created_yet_follows_its_gpu():
    index = DeviceIndex(nested_pools())
    pending = row("c2", "old-gpu", "VGPU", DeviceKind.MDEV, "mdev-b",
                  detail=DeviceDetail(1, mdev_parent="0000:3b:00.0", mdev_type="nvidia-35"))
    result = realign(misplaced([pending], index), {"c2": {GPU: {"VGPU": 1}}}, index)
    assert [(new.provider_uuid, new.device_id) for _, new in result.moved] == [
        (GPU, "mdev-b")]


def test_nested_to_flat_counted_rows_go_back_to_the_root():
    flat_pools = {ROOT: {rc: Pool("h", rc, DeviceKind.HOST_RESOURCES, 100)
                         for rc in ("VCPU", "MEMORY_MB", "DISK_GB")}}
    index = DeviceIndex(flat_pools)
    rows = [row("c1", CELL1, "VCPU", DeviceKind.NUMA, "1", 2,
                detail=DeviceDetail(1))]
    result = realign(misplaced(rows, index), {"c1": {ROOT: {"VCPU": 2}}}, index)
    [(_, new)] = result.moved
    assert (new.provider_uuid, new.kind, new.device_id, new.detail.numa_node) == (
        ROOT, DeviceKind.HOST_RESOURCES, "host", None)
