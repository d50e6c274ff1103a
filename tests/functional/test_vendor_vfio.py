"""NVIDIA's vendor-specific VFIO vGPU (vGPU 17 and later) through the
production libvirt driver and the real Placement: a VF's type written at
claim time, cleared on release, kept across a restart and written back
after a reboot.

The sysfs is SysfsBuilder's, following NVIDIA's vGPU user guide: each VF
lists what it can create now in nvidia/creatable_vgpu_types and takes a
type when its id is written to nvidia/current_vgpu_type; the builder's
answer_vgpu_type_writes plays the NVIDIA driver's part after the agent's
writes. Guests run on the libvirt test driver, whose live XML shows what a
running guest holds, as for the other VF tests (test_libvirt_claims.py);
a real QEMU cannot start on a VF this machine does not have.
"""
from __future__ import annotations

import uuid

import pytest
from lxml import etree

from compute_agent.compute.manager import ComputeManager
from compute_agent.compute.tracker import Tracker
from compute_agent.daemon import start_up
from compute_agent.drivers.errors import MdevError
from compute_agent.drivers.fake_sysfs import VgpuCard
from compute_agent.drivers.libvirt.sysfs import SysfsReader
from compute_agent.exception import ClaimFailed
from compute_agent.health.rules import DeviceFault
from compute_agent.store.store import Store
from tests.functional.helpers import get, put_allocations, unallocate
from tests.functional.libvirt_host import Host

# Two L40-like GPUs (48 GB), 4 VFs each. A is in equal-size mode, NVIDIA's
# default; B in mixed-size mode.
PF_A, PF_B = "0000:41:00.0", "0000:42:00.0"
L40 = {557: "NVIDIA L40-12Q", 558: "NVIDIA L40-24Q", 560: "NVIDIA L40-48Q"}
SPEC = {"name": "vgpu-guest", "vcpus": 1, "memory_mb": 512}
TRAIT = {557: "CUSTOM_MDEV_TYPE_NVIDIA_557", 558: "CUSTOM_MDEV_TYPE_NVIDIA_558"}


@pytest.fixture
def host(tmp_path, placement):
    h = Host(tmp_path, placement.url)
    h.sys.add_numa_node(0, "0-7", 16384)
    h.vfs_a = h.sys.add_nvidia_vf_layout(PF_A, "26b5", 0,
                                         VgpuCard(L40, equal_size=True, framebuffer_gb=48))
    h.vfs_b = h.sys.add_nvidia_vf_layout(PF_B, "26b5", 0, VgpuCard(L40, framebuffer_gb=48))
    # nvidia-557 on both GPUs, named by their PFs; nvidia-558, first in
    # the config's order, on B's last two VFs only.
    h.make_agent(devices={"enabled_mdev_types": "nvidia-558,nvidia-557"},
                 **{"mdev_nvidia-557": {"device_addresses": f"{PF_A},{PF_B}"},
                    "mdev_nvidia-558": {"device_addresses": ",".join(h.vfs_b[2:])}})
    h.cycle()
    yield h
    h.agent.manager.tracker.store.close()
    h.agent.driver.cleanup()


def vf_provider(h: Host, vf: str) -> str:
    return h.p("pci_" + vf.replace(":", "_").replace(".", "_"))


def uuids(h: Host) -> dict[str, str]:
    """Provider name -> UUID, in one read (they never change here)."""
    if not hasattr(h, "uuids"):
        h.uuids = {n: p["uuid"] for n, p in h.tree().items()}
    return h.uuids


def allocations_on(h: Host, vf: str) -> dict:
    return {uuids(h)[h.p("numa_0")]: {"resources": {"VCPU": 1, "MEMORY_MB": 512}},
            uuids(h)[vf_provider(h, vf)]: {"resources": {"VGPU": 1}}}


def build(h: Host, vf: str) -> str:
    """A conductor's build: its allocations in Placement, on the VF's
    provider, then the agent's claim; the driver's answer to the write."""
    instance = str(uuid.uuid4())
    allocations = allocations_on(h, vf)
    put_allocations(h.url, instance, allocations)
    h.agent.manager.build_instance(instance, SPEC, allocations)
    h.sys.answer_vgpu_type_writes()
    h.cycle()
    return instance


def delete(h: Host, instance: str) -> None:
    """A conductor's delete: the guest and its devices, then its allocations."""
    h.agent.manager.delete_instance(instance)
    unallocate(h.url, instance)
    h.sys.answer_vgpu_type_writes()
    h.cycle()


def current_type(h: Host, vf: str) -> int:
    return SysfsReader(str(h.sys.root)).current_vgpu_type(vf)


def live_hostdevs(h: Host, instance: str) -> list[tuple[str, str]]:
    """(PCI address, managed) of each PCI hostdev the running guest holds."""
    assert h.agent.driver.guest_is_running(instance)
    dom = etree.fromstring(h.agent.driver.guest_definition(instance, live=True).encode())
    out = []
    for hostdev in dom.iterfind("devices/hostdev[@type='pci']"):
        a = hostdev.find("source/address")
        out.append((f"{int(a.get('domain'), 16):04x}:{int(a.get('bus'), 16):02x}:"
                    f"{int(a.get('slot'), 16):02x}.{int(a.get('function'), 16)}",
                    hostdev.get("managed")))
    return out


def stored_vgpu_vf(h: Host, instance: str) -> tuple[str, str]:
    """The VF and type the store records for the instance."""
    _, rows, _ = h.agent.manager.tracker.instance(instance)
    (row,) = [a for a in rows if a.kind.value == "vgpu_vf"]
    return row.device_id, row.detail.mdev_type


def candidates(h: Host, type_number: int) -> set[str]:
    """The VF providers Placement hands out for one vGPU of the type."""
    found = get(h.url, f"/allocation_candidates?resources=VGPU:1&required="
                       f"{TRAIT[type_number]}&in_tree={uuids(h)[h.name]}")
    names = {u: n for n, u in uuids(h).items()}
    return {names[rp] for req in found["allocation_requests"]
            for rp in req["allocations"]}


def vgpu_inventory(h: Host, vf: str) -> dict:
    rp = uuids(h)[vf_provider(h, vf)]
    return {"traits": set(get(h.url, f"/resource_providers/{rp}/traits")["traits"]),
            **get(h.url, f"/resource_providers/{rp}/inventories")["inventories"]["VGPU"]}


def test_four_builds_by_the_pf_get_four_vfs_a_fifth_is_refused(host):
    on_a = {vf_provider(host, vf): vf for vf in host.vfs_a}
    instances = []
    for _ in range(4):
        # What a scheduler does: the first candidate Placement offers.
        instances.append(build(host, on_a[sorted(candidates(host, 557) & set(on_a))[0]]))

    got = [stored_vgpu_vf(host, i) for i in instances]
    assert sorted(got) == [(vf, "nvidia-557") for vf in host.vfs_a]
    for instance, (vf, _) in zip(instances, got):
        assert current_type(host, vf) == 557
        # The VF itself, as a PCI hostdev libvirt does not rebind.
        assert live_hostdevs(host, instance) == [(vf, "no")]
    # Placement has no fifth VF of the GPU to offer, and the agent refuses
    # a claim on a VF already held.
    assert not candidates(host, 557) & set(on_a)
    with pytest.raises(ClaimFailed):
        host.agent.manager.build_instance(str(uuid.uuid4()), SPEC,
                                          allocations_on(host, host.vfs_a[0]))

    # A delete writes 0: the VF is free, and so offered, again.
    freed, _ = got[1]
    delete(host, instances[1])
    assert current_type(host, freed) == 0
    assert candidates(host, 557) & set(on_a) == {vf_provider(host, freed)}


def test_an_equal_size_card_lists_one_size_once_a_vf_has_a_type(host):
    build(host, host.vfs_a[0])
    reader = SysfsReader(str(host.sys.root))
    # Read again, never remembered: the siblings now list 12 GB types only.
    assert [sorted(reader.creatable_vgpu_types(vf)) for vf in host.vfs_a] == [
        [], [557], [557], [557]]


def test_a_mixed_card_takes_a_second_type_and_never_hands_a_vf_out_twice(host):
    b0, b1, b2, b3 = host.vfs_b
    pb = [vf_provider(host, vf) for vf in host.vfs_b]
    # Each free VF is offered as one type: 557 on B0 and B1, 558 (first
    # in the config's order) on B2 and B3.
    assert candidates(host, 557) & set(pb) == {pb[0], pb[1]}
    assert candidates(host, 558) == {pb[2], pb[3]}

    big = build(host, b2)
    small = build(host, b0)
    assert (current_type(host, b2), current_type(host, b0)) == (558, 557)
    assert stored_vgpu_vf(host, big) == (b2, "nvidia-558")
    # 12 GB left: B3 can no longer create a 24 GB vGPU, so it is offered
    # as the 12 GB type it still lists; no VF is a candidate twice.
    assert candidates(host, 558) == set()
    assert candidates(host, 557) & set(pb) == {pb[1], pb[3]}
    assert TRAIT[557] in vgpu_inventory(host, b3)["traits"]

    delete(host, small)
    assert candidates(host, 558) == {pb[3]}  # 24 GB free again
    build(host, b3)
    assert current_type(host, b3) == 558
    # The card's 48 GB are spent: B0 and B1 list nothing and stay, reserved.
    for vf in (b0, b1):
        assert vgpu_inventory(host, vf)["reserved"] == 1
    assert candidates(host, 557) & set(pb) == set()
    assert candidates(host, 558) == set()


def test_a_type_the_driver_refuses_is_a_clean_claim_failure(host):
    b0, b1 = host.vfs_b[:2]
    # Behind the agent's back, the card's framebuffer goes to B1, so B0
    # lists nothing: the next cycle has not read it yet.
    host.sys.set_current_vgpu_type(b1, 560)
    instance = str(uuid.uuid4())
    with pytest.raises(MdevError, match="cannot create vGPU type 557 now"):
        host.agent.manager.build_instance(instance, SPEC, allocations_on(host, b0))
    assert current_type(host, b0) == 0
    assert not host.agent.manager.tracker.knows(instance)
    assert host.agent.driver.guest_state(instance) is None


def test_a_restart_and_a_reboot_keep_every_guests_vf_and_type(host):
    a0, a1 = host.vfs_a[:2]
    b2 = host.vfs_b[2]
    guests = {build(host, vf): vf for vf in (a0, a1, b2)}
    expected = {i: (vf, f"nvidia-{current_type(host, vf)}") for i, vf in guests.items()}

    def check() -> None:
        for instance, (vf, type_id) in expected.items():
            assert stored_vgpu_vf(host, instance) == (vf, type_id)
            assert f"nvidia-{current_type(host, vf)}" == type_id
            assert live_hostdevs(host, instance) == [(vf, "no")]

    # A restart: a new store handle, tracker and manager over the same
    # hypervisor, as a new process finds it.
    store_path = host.agent.manager.tracker.store.path
    host.agent.manager.tracker.store.close()
    host.agent.manager = ComputeManager(
        Tracker(Store(store_path), host.agent.driver.boot_id()), host.agent.driver)
    host.cycle()
    check()

    def reboot(boot_id: str) -> None:
        """The types gone and the guests stopped; the agent starts again:
        before its first cycle, the types are written back."""
        host.sys.forget_vgpu_types()
        for instance in guests:
            host.agent.driver.power_off(instance)
        host.agent.driver.boot_id = lambda: boot_id
        host.agent.manager.tracker.store.close()
        host.agent.manager = ComputeManager(Tracker(Store(store_path), boot_id),
                                            host.agent.driver)

    def first_cycles(boot_id: str) -> dict[str, int]:
        """The start's steps; returns each VF's type before the first cycle."""
        host.agent.vgpu_types_not_restored = start_up.restore_vgpu_types(
            host.agent.manager, host.agent.driver)
        host.sys.answer_vgpu_type_writes()
        before_cycle = {vf: current_type(host, vf) for vf in guests.values()}
        host.cycle()
        host.agent.reconcile(at_start=True)
        _, rows, _ = host.agent.manager.tracker.snapshot()
        assert {a.boot_id for a in rows} == {boot_id}
        return before_cycle

    reboot("boot-2")
    assert first_cycles("boot-2") == {a0: 557, a1: 557, b2: 558}
    assert host.agent.vgpu_types_not_restored == {}
    for instance in guests:
        host.agent.manager.host.run_with_store_devices(instance)
    check()

    # Another reboot, after which B2's framebuffer goes to another VF
    # before the agent starts: B2 cannot take its type back, which is
    # named, and its unit stays reserved with the reason.
    reboot("boot-3")
    host.sys.set_current_vgpu_type(host.vfs_b[0], 560)
    assert first_cycles("boot-3") == {a0: 557, a1: 557, b2: 0}
    assert list(host.agent.vgpu_types_not_restored) == [b2]
    held = vgpu_inventory(host, b2)
    assert held["reserved"] == held["total"] == 1
    assert DeviceFault.VGPU_TYPE_NOT_RESTORED.trait in held["traits"]
    lost = next(i for i, vf in guests.items() if vf == b2)
    for instance in guests:
        if instance == lost:
            with pytest.raises(MdevError):
                host.agent.manager.host.run_with_store_devices(instance)
        else:
            host.agent.manager.host.run_with_store_devices(instance)
    del expected[lost]
    check()
