"""The hypervisor's veto (compute_agent/claims/veto.py), pure: what guests hold is
never chosen, and which of it the store does not explain."""
import pytest

from compute_agent.claims.choice import Pool, Slot, Taken, Wanted, choose
from compute_agent.claims.veto import (
    StrayHolding,
    Unexplained,
    assignable_resources,
    stray_holdings,
    vetoed_resources,
)
from compute_agent.drivers.base import DeviceKind, GuestHolding, HostResource, HostResourceKind
from compute_agent.exception import ClaimFailed

PF = "00000000-0000-4000-8000-0000000000f0"
GPU = "00000000-0000-4000-8000-0000000000e0"
PMEM = "00000000-0000-4000-8000-0000000000d0"
CELL = "00000000-0000-4000-8000-0000000000a0"
VFS = ("0000:81:10.0", "0000:81:10.1", "0000:81:10.2")
MDEVS = ("11111111-0000-4000-8000-000000000001", "11111111-0000-4000-8000-000000000002")
GUEST, OTHER, THIRD = (f"aaaaaaaa-0000-4000-8000-00000000000{i}" for i in (1, 2, 3))


def pci(address: str) -> HostResource:
    return HostResource(HostResourceKind.PCI_ADDRESS, address)


def mdev(uuid: str) -> HostResource:
    return HostResource(HostResourceKind.MDEV_UUID, uuid)


def path(dev: str) -> HostResource:
    return HostResource(HostResourceKind.BACKING_PATH, dev)


def cpu(n: int) -> HostResource:
    return HostResource(HostResourceKind.HOST_CPU, str(n))


def pools(gpu_capacity: int = 2) -> dict:
    return {
        PF: {"SRIOV_NET_VF": Pool("h_PF", "SRIOV_NET_VF", DeviceKind.VF, 3,
                                  tuple(Slot(v, 1) for v in VFS), 1)},
        GPU: {"VGPU": Pool("h_gpu", "VGPU", DeviceKind.MDEV, gpu_capacity,
                           tuple(Slot(m, 0) for m in MDEVS), 0,
                           mdev_parent="0000:06:00.0", mdev_type="nvidia-35")},
        PMEM: {"CUSTOM_PMEM_NAMESPACE_64G": Pool(
            "h_pmem", "CUSTOM_PMEM_NAMESPACE_64G", DeviceKind.PMEM, 2,
            (Slot("ns0", 0, 64 << 30, "/dev/dax0.0"), Slot("ns1", 0, 64 << 30, "/dev/dax1.0")),
            0)},
        CELL: {"PCPU": Pool("h_numa_0", "PCPU", DeviceKind.PCPU, 2,
                            (Slot("2", 0), Slot("3", 0)), 0)},
    }


def ids(choices) -> list[str]:
    return [c.device_id for c in choices]


def test_every_device_a_guest_holds_is_vetoed_running_or_defined_ours_or_not():
    guests = {GUEST: GuestHolding(GUEST, True, True, frozenset({pci(VFS[2]), cpu(2)})),
              OTHER: GuestHolding(OTHER, False, False, frozenset({mdev(MDEVS[0])}))}
    assert vetoed_resources(guests) == {pci(VFS[2]), cpu(2), mdev(MDEVS[0])}
    assert vetoed_resources({}) == frozenset()


@pytest.mark.parametrize("provider, rc, vetoed, expected", [
    (PF, "SRIOV_NET_VF", pci(VFS[0]), VFS[1]),
    (GPU, "VGPU", mdev(MDEVS[0]), MDEVS[1]),
    (PMEM, "CUSTOM_PMEM_NAMESPACE_64G", path("/dev/dax0.0"), "ns1"),
    (CELL, "PCPU", cpu(2), "3"),
])
def test_a_vetoed_device_of_each_kind_is_never_chosen(provider, rc, vetoed, expected):
    wanted = [Wanted(provider, rc, 1)]
    assert ids(choose(wanted, pools(), Taken()))[0] != expected
    assert ids(choose(wanted, pools(), Taken(vetoed=frozenset({vetoed})))) == [
        expected]
    # All of the pool is more than it can give while one is vetoed.
    every = len(pools()[provider][rc].slots)
    assert len(choose([Wanted(provider, rc, every)], pools(), Taken())) == every
    with pytest.raises(ClaimFailed):
        choose([Wanted(provider, rc, every)], pools(),
               Taken(vetoed=frozenset({vetoed})))


def test_a_vetoed_mdev_takes_its_unit_of_the_gpus_capacity():
    """An mdev a guest holds counts against the type's capacity: no new
    mdev is created in its place beyond what the GPU can give."""
    every = frozenset({mdev(m) for m in MDEVS})
    with pytest.raises(ClaimFailed):
        choose([Wanted(GPU, "VGPU", 1)], pools(gpu_capacity=2), Taken(vetoed=every))
    created = choose([Wanted(GPU, "VGPU", 1)], pools(gpu_capacity=3),
                     Taken(vetoed=every))
    assert ids(created)[0] not in MDEVS


def test_stray_holdings_name_what_the_store_does_not_explain():
    assignable = assignable_resources(pools())
    assert {pci(v) for v in VFS} | {mdev(m) for m in MDEVS} | {
        path("/dev/dax0.0"), path("/dev/dax1.0"), cpu(2), cpu(3)} == assignable
    guests = {
        # The store gives it its VF; the other VF is given to THIRD.
        GUEST: GuestHolding(GUEST, True, True, frozenset({pci(VFS[0]), pci(VFS[1])})),
        # Unknown to the store: its mdev, and a device the agent never hands
        # out (not reported).
        OTHER: GuestHolding(OTHER, False, False,
                            frozenset({mdev(MDEVS[0]), pci("0000:00:1f.0")})),
        # Known, holding a CPU the store gives to nobody.
        THIRD: GuestHolding(THIRD, True, False, frozenset({cpu(3), pci(VFS[1])})),
    }
    given = {pci(VFS[0]): {GUEST}, pci(VFS[1]): {THIRD}}
    assert stray_holdings(guests, given, {GUEST, THIRD}, assignable) == [
        StrayHolding(GUEST, True, True, pci(VFS[1]), Unexplained.GIVEN_TO_ANOTHER, (THIRD,)),
        StrayHolding(OTHER, False, False, mdev(MDEVS[0]), Unexplained.GUEST_UNKNOWN),
        StrayHolding(THIRD, True, False, cpu(3), Unexplained.GIVEN_TO_NONE),
    ]
    assert stray_holdings({}, given, {GUEST}, assignable) == []
