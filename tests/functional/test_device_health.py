"""Device health end to end: a running agent (its update loop and health
watch threads) on the libvirt test driver over a fake sysfs tree, and the
session's real Placement. Each test breaks a device's sysfs files the way
the kernel shows a failing device, measures how long until Placement shows
its units reserved and the reason trait, then mends the files and waits for
them to come back. A guest holding the device keeps running and keeps its
assignment and its allocation throughout.

update_interval is an hour: only the health watch's wake-up can start the
cycles that these tests wait for.
"""
from __future__ import annotations

import time
import uuid

import pytest

from compute_agent.drivers.fake_sysfs import vf_address
from compute_agent.exception import ClaimFailed
from compute_agent.health.rules import DeviceFault
from compute_agent.tree.ownership import UNHEALTHY_TRAIT
from tests.functional.helpers import get, put_allocations, wait_for
from tests.functional.libvirt_host import DEVICE_SPECS, GPU, NIC0, PF, Host

BOUND_S = 5.0
POLL_S = 0.5
IFNAME = "ens3f0"


@pytest.fixture
def host(tmp_path, placement):
    h = Host(tmp_path, placement.url)
    h.build_default()
    h.sys.set_aer(PF)  # AER capable, no error so far
    h.sys.set_link(NIC0, IFNAME, up=True)
    h.make_agent(default={"update_interval": 3600},
                 pci={"device_spec": DEVICE_SPECS},
                 devices={"enabled_mdev_types": "nvidia-35",
                          "health_poll_interval": POLL_S},
                 pmem={"namespaces": "64G:ns0|ns1|ns2,16G:ns3"})
    h.agent.start()
    yield h
    h.agent.stop()


def record(host: Host, name: str, rc: str) -> dict:
    return host.provider(name)["inventories"][rc]


def traits(host: Host, name: str) -> set[str]:
    return host.provider(name)["traits"]


def reserved_after(host: Host, name: str, rc: str, reserved: int, change) -> float:
    """Make the change; the seconds until Placement shows ``reserved``."""
    start = time.monotonic()
    change()
    wait_for(lambda: record(host, name, rc)["reserved"] == reserved,
             timeout=BOUND_S * 3, interval=0.05)
    return time.monotonic() - start


def out_then_back(host: Host, name: str, rc: str, fault: DeviceFault, breaks, mends,
                  out: int) -> float:
    """Break, see ``out`` units reserved with the reason, mend, see them
    back; returns the latency of the break."""
    before = record(host, name, rc)["reserved"]
    latency = reserved_after(host, name, rc, out, breaks)
    assert latency < BOUND_S, f"{fault.value}: {latency:.2f} s"
    assert {UNHEALTHY_TRAIT, fault.trait} <= traits(host, name)
    back = reserved_after(host, name, rc, before, mends)
    assert back < BOUND_S
    assert not {t for t in traits(host, name) if t.startswith(UNHEALTHY_TRAIT)}
    return latency


def guest_on_a_vf(host: Host) -> tuple[str, list]:
    """A guest given one of the PF's VFs, its allocation in Placement as a
    scheduler would have made it."""
    tree = host.tree()
    instance = str(uuid.uuid4())
    allocations = {
        tree[host.p("numa_1")]["uuid"]: {"resources": {"VCPU": 1, "MEMORY_MB": 512}},
        tree[host.p(PF.upper())]["uuid"]: {"resources": {"SRIOV_NET_VF": 1}}}
    put_allocations(host.url, instance, allocations)
    host.agent.manager.build_instance(
        instance, {"name": "guest-1", "vcpus": 1, "memory_mb": 512}, allocations)
    _, rows, _ = host.agent.manager.tracker.instance(instance)
    return instance, rows


def assert_guest_untouched(host: Host, instance: str, rows: list) -> None:
    assert host.agent.driver.guest_is_running(instance)
    _, now, _ = host.agent.manager.tracker.instance(instance)
    assert now == rows
    held = get(host.url, f"/allocations/{instance}")["allocations"]
    assert held[host.uuid_of(PF.upper())]["resources"] == {
        "SRIOV_NET_VF": 1}


def test_config_space_reading_ffff_takes_the_whole_device_out(host):
    nic = NIC0.upper()
    out_then_back(host, nic, "CUSTOM_PCI_15B3_101B", DeviceFault.CONFIG_SPACE,
                  lambda: host.sys.set_vendor(NIC0, "ffff"),
                  lambda: host.sys.set_vendor(NIC0, "15b3"), out=1)


def test_a_dead_config_space_on_the_gpu_takes_its_vgpus_out(host):
    gpu = "pci_" + GPU.replace(":", "_").replace(".", "_")
    out_then_back(host, gpu, "VGPU", DeviceFault.CONFIG_SPACE,
                  lambda: host.sys.set_config_space_dead(GPU),
                  lambda: host.sys.set_config_space_dead(GPU, dead=False), out=4)


def test_a_nonfatal_aer_error_on_the_pf_takes_its_vfs_out_but_not_the_guests(host):
    instance, rows = guest_on_a_vf(host)
    pf = PF.upper()
    before = record(host, pf, "SRIOV_NET_VF")
    latency = reserved_after(host, pf, "SRIOV_NET_VF", before["total"],
                             lambda: host.sys.set_aer(PF, nonfatal=1))
    assert latency < BOUND_S
    assert {UNHEALTHY_TRAIT, DeviceFault.AER_NONFATAL.trait} <= traits(host, pf)
    # Reserved for the scheduler, and a claim that comes anyway gets no VF.
    with pytest.raises(ClaimFailed):
        host.agent.manager.tracker.claim_build(
            str(uuid.uuid4()), {"name": "guest-2", "vcpus": 1, "memory_mb": 512},
            {host.uuid_of(pf): {"resources": {"SRIOV_NET_VF": 1}}})
    # The counter stays up: two polls more change nothing.
    polls = host.agent.health.snapshot().polls
    wait_for(lambda: host.agent.health.snapshot().polls >= polls + 2,
             timeout=BOUND_S, interval=0.05)
    assert_guest_untouched(host, instance, rows)

    reserved_after(host, pf, "SRIOV_NET_VF", 0, lambda: host.sys.set_aer(PF))
    assert_guest_untouched(host, instance, rows)


def test_a_vf_gone_from_its_pf_is_a_vf_count_drift(host):
    vf = vf_address(PF, 1)
    out_then_back(host, PF.upper(), "SRIOV_NET_VF", DeviceFault.VF_COUNT,
                  lambda: host.sys.unplug_vf(vf),
                  lambda: host.sys.replug_vf(vf), out=2)


def test_a_nic_losing_its_link_is_taken_out(host):
    out_then_back(host, NIC0.upper(), "CUSTOM_PCI_15B3_101B", DeviceFault.LINK_DOWN,
                  lambda: host.sys.set_link(NIC0, IFNAME, up=False),
                  lambda: host.sys.set_link(NIC0, IFNAME, up=True), out=1)


def test_an_interface_an_operator_took_down_is_not_judged(host):
    polls = host.agent.health.snapshot().polls
    host.sys.set_link(NIC0, IFNAME, up=False, admin_up=False)
    # Two polls more: at least one read the interface after it went down.
    wait_for(lambda: host.agent.health.snapshot().polls >= polls + 2,
             timeout=BOUND_S, interval=0.05)
    assert record(host, NIC0.upper(), "CUSTOM_PCI_15B3_101B")["reserved"] == 0
    assert host.agent.health.snapshot().unhealthy == ()

